"""The device plugin's CDI spec on disk, following the node's inventory.

A runtime reads the spec at each container start, so it must always describe the HCAs
the pools advertise: it is written for every new inventory, and again when something
removed or changed the file (looked at every ``check_seconds``). Writes run off the loop
within the read deadline (``kit.offloop``): a hung filesystem must not stop the loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

from rdma_hca.daemon.offer.cdi import SPEC_FILE, build_spec, write_spec
from rdma_hca.kit.broadcast import Broadcast
from rdma_hca.kit.offloop import OffLoop, Stalled
from rdma_hca.kit.sayonce import Latch
from rdma_hca.node.model import Hca, NodeInventory

log = logging.getLogger(__name__)

CDI_CHECK_SECONDS = 2.0  # how soon a removed or changed CDI spec is written again


class CdiFollower:
    """``hcas`` gives the HCAs the pools offer now (an HCA in two pools may come twice)."""

    def __init__(self, spec_dir: str, inventories: Broadcast[NodeInventory | None],
                 hcas: Callable[[], Iterable[Hca]], files: OffLoop, *,
                 check_seconds: float = CDI_CHECK_SECONDS) -> None:
        self.spec_dir = spec_dir
        self.inventories = inventories
        self.hcas = hcas
        self.files = files
        self.check_seconds = check_seconds
        self._error = Latch()

    async def keep(self) -> None:
        """Write the spec for every new inventory, and again when something removed or
        changed it (looked at every ``check_seconds``)."""
        path = os.path.join(self.spec_dir, SPEC_FILE)
        seen = self.inventories.generation
        while True:
            generation = await self.inventories.wait_newer(seen, self.check_seconds)
            news, seen = generation != seen, generation
            if await self.write(self.inventories.value) and not news:
                log.warning("the CDI spec %s was removed or changed; written again", path)

    async def write(self, inventory: NodeInventory | None) -> bool:
        """Write the spec if it differs from the file; True when it was (re)written."""
        if inventory is None:
            return False
        hcas = {h.name: h for h in self.hcas()}
        spec = build_spec(hcas.values(), inventory.rdma_cm)
        spec_dir = self.spec_dir
        try:
            written = await self.files.run(
                f"the CDI spec in {spec_dir}", lambda: write_spec(spec_dir, spec))
            self._error.clear()
            return written
        except (OSError, Stalled) as exc:
            message = f"cannot write the CDI spec in {spec_dir}: {exc}"
            if self._error.set(message):
                log.error("%s; pods allocated now will not get their devices", message)
            return False
