"""The devices this node offers, following its inventory: what the slice publishes.

The driver's side of publishing (``slices.PublishHost``): the helper's publisher reads
the offer and is poked when it changes; the claims read the same offer for the HCAs a
device gives.
"""

from __future__ import annotations

from collections.abc import Mapping

from rdma_hca.contract.checkpoint import PreparedClaim
from rdma_hca.contract.dra import NODE_DEVICE
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.devices import Offer
from rdma_hca.daemon.dra.slices import PublishSignals
from rdma_hca.node.model import CharDevice, Hca, NodeInventory


class NodeOffer:
    """``update(inventory)``; ``offer`` is the current one, ``signals`` wake the publisher."""

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self._taints = config.device_taints
        self._offer = Offer.build((), config.driver_name, config.mode, self._taints, None)
        self._signals = PublishSignals()
        self._hcas: tuple[Hca, ...] = ()
        self._held: frozenset[str] = frozenset()
        self._rdma_cm: CharDevice | None = None

    @property
    def signals(self) -> PublishSignals:
        return self._signals

    @property
    def offer(self) -> Offer:
        return self._offer

    @property
    def taints(self) -> bool:
        """Devices carry taints (until the API server refuses them)."""
        return self._taints

    def update(self, inventory: NodeInventory) -> None:
        """Take a new inventory: the HCAs the driver selects, and rdma_cm."""
        self._hcas = tuple(h for h in inventory.hcas if self.config.selectors.matches(h))
        self._held = inventory.held
        self._rdma_cm = inventory.rdma_cm
        self._rebuild()

    def drop_taints(self) -> None:
        self._taints = False
        self._rebuild()

    def _rebuild(self) -> None:
        offer = Offer.build(self._hcas, self.config.driver_name, self.config.mode,
                            self._taints, self._rdma_cm, self._held)
        # Replaced even when the slice stays as it is: the health verdict also follows
        # rdma_cm, which the slice does not show.
        changed, self._offer = offer.digest != self._offer.digest, offer
        if changed:
            self._signals.poke()

    def bandwidth_held(self, prepared: Mapping[str, PreparedClaim]) -> dict[str, int]:
        """Bits per second of each HCA the prepared claims hold: every offered HCA (at 0
        when none), and an HCA gone from the offer while a claim still holds it."""
        held = dict.fromkeys(self._offer.bandwidth(), 0)
        for claim in prepared.values():
            for d in claim.devices:
                if d.device != NODE_DEVICE:  # it gives every HCA and holds none of them
                    held[d.hca] = held.get(d.hca, 0) + d.bandwidth
        return held
