"""Wiring of the node daemon: discovery → pools → kubelet lifecycle → HTTP endpoints.

``Daemon.run`` is what ``rdma-hca serve`` runs; the demo, the tests and the
benchmarks run the same object on simulated trees.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from rdma_hca.daemon.allocations import AllocationStats
from rdma_hca.daemon.cdi import build_spec, write_spec
from rdma_hca.daemon.config import Settings
from rdma_hca.daemon.findings import NodeFindings, evaluate_node
from rdma_hca.daemon.health import HealthWatcher
from rdma_hca.daemon.kubelet import KubeletLifecycle
from rdma_hca.daemon.runtime import PoolRuntime
from rdma_hca.kit.aio import cancel_all
from rdma_hca.node.model import NodeInventory

if TYPE_CHECKING:
    from rdma_hca.daemon.metrics import MetricsServer

log = logging.getLogger("rdma_hca.daemon")

STOP_DEADLINE = 1.5  # SIGTERM must end the process within 2 s


def _describe(task: asyncio.Task[object]) -> str:
    frames = task.get_stack(limit=3)
    where = " < ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(frames))
    return f"{task.get_name()} at {where or '?'}"


class Daemon:
    def __init__(self, settings: Settings, *, netlink: bool = True) -> None:
        self.settings = settings
        self.runtimes = [
            PoolRuntime(p, nccl_env=settings.nccl_env, cdi=settings.cdi.enabled)
            for p in settings.pools
        ]
        self.allocations = AllocationStats()
        self.lifecycle = KubeletLifecycle(
            self.runtimes,
            settings.kubelet_dir,
            resend_seconds=settings.resend_seconds,
            on_allocate=self.allocations.observe,
        )
        self.health = HealthWatcher(
            self.runtimes,
            settings.sysfs_root,
            settings.dev_root,
            poll_seconds=settings.health_poll_seconds,
            netlink=netlink,
            on_inventory=self._on_inventory,
        )
        self.findings = NodeFindings()
        self._tasks: list[asyncio.Task[None]] = []
        self._http: MetricsServer | None = None
        self._cdi_error: str | None = None

    @property
    def inventory(self) -> NodeInventory | None:
        return self.health.inventory

    def ready(self) -> bool:
        return self.lifecycle.ready()

    async def _on_inventory(self, inventory: NodeInventory) -> None:
        if self.settings.cdi.enabled:
            self._write_cdi(inventory)
        findings = evaluate_node(inventory, self.settings, self.runtimes)
        if findings != self.findings:
            findings.log_changes(self.findings)
            self.findings = findings

    def _write_cdi(self, inventory: NodeInventory) -> None:
        hcas = {h.name: h for r in self.runtimes for h in r.view.hcas}
        try:
            write_spec(self.settings.cdi.spec_dir,
                       build_spec(hcas.values(), inventory.rdma_cm))
            self._cdi_error = None
        except OSError as exc:
            message = f"cannot write the CDI spec in {self.settings.cdi.spec_dir}: {exc}"
            if message != self._cdi_error:
                log.error("%s; pods allocated now will not get their devices", message)
                self._cdi_error = message

    async def start(self) -> None:
        """Discover, then serve and register, then watch; returns once started."""
        inventory = await self.health.refresh()
        log.info("found %d RDMA HCA(s): %s", len(inventory.hcas),
                 ", ".join(h.name for h in inventory.hcas) or "none")
        if self.settings.metrics_address:
            from rdma_hca.daemon.metrics import MetricsServer

            server = MetricsServer(self, self.settings.metrics_address)
            await server.start()
            self._http = server
        await self.lifecycle.start()
        self._tasks.append(asyncio.create_task(self.health.run(), name="health"))

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        self._tasks = []
        await self.lifecycle.stop()
        if self._http is not None:
            await self._http.stop()
            self._http = None

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            log.info("stopping: closing the servers and removing our sockets")
            try:
                await asyncio.wait_for(self.stop(), STOP_DEADLINE)
            except TimeoutError:
                # Shutdown must end: say what was stuck, then leave no socket behind.
                stuck = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                log.error("shutdown took over %g s; still running: %s", STOP_DEADLINE,
                          "; ".join(_describe(t) for t in stuck))
                self.lifecycle.remove_sockets()

