"""The devices this node offers, following its inventory: what the slice publishes.

The claims read the same offer for the HCAs a device gives; the helper's slice publisher
is handed each new one (the desired devices).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rdma_hca.contract.checkpoint import PreparedClaim
from rdma_hca.contract.dra import NODE_DEVICE
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.node.model import CharDevice, Hca, NodeInventory


class NodeOffer:
    """``update(inventory)`` builds the new offer; ``offer`` is the current one."""

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self._offer = self._build((), None, frozenset())

    @property
    def offer(self) -> DeviceOffer:
        return self._offer

    def update(self, inventory: NodeInventory) -> DeviceOffer:
        """Take a new inventory: the HCAs the driver selects, and rdma_cm. Replaced even
        when the slice stays as it is: the health verdict also follows rdma_cm, which the
        slice does not show."""
        hcas = tuple(h for h in inventory.hcas if self.config.selectors.matches(h))
        self._offer = self._build(hcas, inventory.rdma_cm, inventory.held)
        return self._offer

    def _build(self, hcas: Sequence[Hca], rdma_cm: CharDevice | None,
               held: frozenset[str]) -> DeviceOffer:
        return DeviceOffer.build(hcas, self.config.driver_name, self.config.mode,
                                 self.config.device_taints, rdma_cm, held,
                                 node_device_on=self.config.node_device,
                                 default_bandwidth=self.config.default_bandwidth)

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
