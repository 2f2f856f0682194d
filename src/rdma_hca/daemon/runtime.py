"""A pool at run time: its current view of the HCAs and the device state streams follow.

Discovery and the health watcher feed new inventories in; the gRPC servicer reads
the view (Allocate) and follows the state (ListAndWatch). Each change of verdict is
logged once, when it happens, never once per poll.
"""

from __future__ import annotations

import logging

from rdma_hca.daemon.config import PoolConfig
from rdma_hca.daemon.pool import PoolView, select
from rdma_hca.daemon.state import DeviceState
from rdma_hca.node.model import NodeInventory

log = logging.getLogger("rdma_hca.pool")


class PoolRuntime:
    def __init__(self, config: PoolConfig, *, nccl_env: bool = False, cdi: bool = False) -> None:
        self.config = config
        self.nccl_env = nccl_env
        self.cdi = cdi
        self.view = PoolView(config, (), None, nccl_env=nccl_env, cdi=cdi)
        self.state = DeviceState(self.view.devices())
        self._problems: tuple[str, ...] | None = None
        self._hca_names: tuple[str, ...] | None = None

    @property
    def resource_name(self) -> str:
        return self.config.resource_name

    async def update(self, inventory: NodeInventory) -> bool:
        """Take a new inventory; return True when the advertised list changed."""
        self.view = select(self.config, inventory, nccl_env=self.nccl_env, cdi=self.cdi)
        self._log_changes()
        return await self.state.publish(self.view.devices())

    def _log_changes(self) -> None:
        name = self.config.resource_name
        names = tuple(h.name for h in self.view.hcas)
        if names != self._hca_names:
            log.info("%s holds %d HCA(s): %s", name, len(names), ", ".join(names) or "none")
            self._hca_names = names
        problems = tuple(self.view.problems())
        if problems == self._problems:
            return
        before = set(self._problems or ())
        for p in problems:
            if p not in before:
                log.warning("%s: %s", name, p)
        for p in before - set(problems):
            log.info("%s: resolved: %s", name, p)
        self._problems = problems
        devices = self.view.devices()
        healthy = sum(1 for d in devices if d.healthy)
        log.info("%s: %d of %d devices Healthy", name, healthy, len(devices))
