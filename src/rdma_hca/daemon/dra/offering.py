"""The devices this node offers, following its inventory: what the slice publishes.

The claims read the same offer for the HCAs a device gives; the helper's slice publisher
is handed each new one (the desired devices).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from rdma_hca.contract.checkpoint import PreparedClaim
from rdma_hca.contract.dra import NODE_DEVICE
from rdma_hca.contract.fabric import PortNeighbour
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.devices import MAX_ATTRIBUTES_AND_CAPACITIES, DeviceOffer
from rdma_hca.kit.sayonce import Once
from rdma_hca.node.model import CharDevice, Hca, NodeInventory

log = logging.getLogger(__name__)


class NodeOffer:
    """``update(inventory)`` builds the new offer, ``update_neighbours`` too with the
    inventory it has; ``offer()`` is the current one."""

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        # Attributes and capacities left out of a device to keep within the API's limit,
        # each counted when it starts being left out (``devices.fit``).
        self.attributes_dropped = 0
        self._left_out: set[tuple[str, str]] = set()
        self._said = Once(limit=1024)
        self._hcas: tuple[Hca, ...] = ()
        self._rdma_cm: CharDevice | None = None
        self._held: frozenset[str] = frozenset()
        self._neighbours: dict[str, PortNeighbour] = {}
        self._offer = self._build()

    def offer(self) -> DeviceOffer:
        return self._offer

    def hca(self, device: str) -> Hca | None:
        """The HCA an offered device names now (None: not offered)."""
        return self._offer.hcas.get(device)

    def update(self, inventory: NodeInventory) -> DeviceOffer:
        """Take a new inventory: the HCAs the driver selects, and rdma_cm. Replaced even
        when the slice stays as it is: the health verdict also follows rdma_cm, which the
        slice does not show."""
        self._hcas = tuple(h for h in inventory.hcas if self.config.selectors.matches(h))
        self._rdma_cm, self._held = inventory.rdma_cm, inventory.held
        self._offer = self._build()
        return self._offer

    def update_neighbours(self, neighbours: Iterable[PortNeighbour]) -> DeviceOffer:
        """Take the ports' LLDP neighbours: an HCA's switch is its first port's."""
        by_hca: dict[str, PortNeighbour] = {}
        for n in sorted(neighbours, key=lambda n: n.port):
            by_hca.setdefault(n.hca, n)
        self._neighbours = by_hca
        self._offer = self._build()
        return self._offer

    def _build(self) -> DeviceOffer:
        offer = DeviceOffer.build(self._hcas, self.config.driver_name, self.config.mode,
                                  self.config.device_taints, self._rdma_cm, self._held,
                                  node_device_on=self.config.node_device,
                                  default_bandwidth=self.config.default_bandwidth,
                                  neighbours=self._neighbours)
        self._note_left_out(offer.left_out)
        return offer

    def _note_left_out(self, left_out: Mapping[str, tuple[str, ...]]) -> None:
        now = {(device, name) for device, names in left_out.items() for name in names}
        self.attributes_dropped += len(now - self._left_out)
        self._left_out = now
        for device, names in sorted(left_out.items()):
            message = (f"device {device} has more than {MAX_ATTRIBUTES_AND_CAPACITIES} "
                       f"attributes and capacities, the most a ResourceSlice device may "
                       f"have: {', '.join(names)} left out of its slice (the least useful "
                       "first, as docs/dra.md lists them); a selector that names them does "
                       "not match this device")
            if self._said.first(message):
                log.warning("%s", message)

    def bandwidth_held(self, prepared: Mapping[str, PreparedClaim]) -> dict[str, int]:
        """Bits per second of each HCA the prepared claims hold: every offered HCA (at 0
        when none), and an HCA gone from the offer while a claim still holds it."""
        held = dict.fromkeys(self._offer.bandwidth(), 0)
        for claim in prepared.values():
            for d in claim.devices:
                # The node-wide device gives every HCA and holds none of them; a device
                # given with admin access holds nothing of its HCA.
                if d.device != NODE_DEVICE and not d.admin_access:
                    held[d.hca] = held.get(d.hca, 0) + d.bandwidth
        return held
