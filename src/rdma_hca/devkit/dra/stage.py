"""One node's DRA setup in a box: simulated node, fake API server, kubelet, driver.

The demo, the benchmarks and the tests all run the real driver this way: discovery
and the health watcher read the simulated sysfs, the driver serves real unix sockets
that the kubelet emulator dials, and the slices go through real HTTP to the fake
API server, credentials taken from a kubeconfig file like outside a cluster.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from rdma_hca.contract.checkpoint import CHECKPOINT_FILE
from rdma_hca.contract.dra import BANDWIDTH, qualified
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.driver import DraDriver
from rdma_hca.daemon.offer.env import EnvSettings
from rdma_hca.daemon.watch.health import HealthWatcher
from rdma_hca.devkit.dra.kubelet import DraKubelet
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.kit.aio import describe
from rdma_hca.node.deadline_reader import NodeReader
from rdma_hca.settings.model import CdiConfig, DraConfig, Mode, Settings

# The driver's stop is bounded step by step (a second or so each); one that takes this
# long is stuck.
STOP_LIMIT = 20.0


class DraStage:
    # The slice publisher's spacing of writes while changes keep coming, for stages built
    # without one (None: the driver's own). A test suite sets a short one: the spacing
    # delays the second write after a start by seconds, and that proves nothing of what
    # the write says (the spacing itself is tested with a clock of its own).
    default_slice_spacing: ClassVar[float | None] = None

    def __init__(self, node: SimNode, workdir: Path, *, node_name: str = "node-a",
                 mode: Mode = Mode.SHARED, api: FakeApiServer | None = None,
                 env: EnvSettings | None = None, health_retry: float = 0.2,
                 kubelet_wipes: bool = True, poll_seconds: float = 0.05, pod_uid: str = "",
                 root: str | None = None, flap_hold_seconds: float | None = None,
                 config: Callable[[DriverConfig], DriverConfig] | None = None,
                 driver: Callable[[DriverConfig], DraDriver] = DraDriver,
                 slice_spacing: float | None = None, stop_limit: float = STOP_LIMIT) -> None:
        self.node = node
        self.workdir = workdir
        self.node_name = node_name
        self._own_api = api is None
        self.api = api or FakeApiServer()
        # Unix socket paths are limited to 107 bytes: keep the kubelet root short.
        self.pod_uid = pod_uid
        self._own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix="dra-", dir="/tmp")
        self.cdi_dir = workdir / "cdi"
        self._mode = mode
        self._env = env or EnvSettings()
        self._tune = config
        self._make_driver = driver
        self.stop_limit = stop_limit
        self._slice_spacing = (self.default_slice_spacing if slice_spacing is None
                               else slice_spacing)
        self._health_retry = health_retry
        self._kubelet_wipes = kubelet_wipes
        self._poll_seconds = poll_seconds
        self._flap_hold = (Settings().flap_hold_seconds if flap_hold_seconds is None
                           else flap_hold_seconds)
        self.kubelet: DraKubelet | None = None
        self.driver: DraDriver | None = None
        self.watcher: HealthWatcher | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._follow_task: asyncio.Task[None] | None = None

    def config(self) -> DriverConfig:
        """The driver's view of the settings a daemon on this node would have."""
        kubeconfig = self.api.write_kubeconfig(self.workdir / "kubeconfig")
        settings = Settings(
            node_name=self.node_name, pod_uid=self.pod_uid, kubelet_root=self.root,
            cdi=CdiConfig(spec_dir=str(self.cdi_dir)),
            dra=DraConfig(enabled=True, mode=self._mode, start_jitter_seconds=0.0),
            nccl_env=self._env.nccl,
            non_host_network=self._env.non_host_network,
            read_deadline_seconds=5.0, device_plugin_enabled=False)
        config = DriverConfig.from_settings(
            settings, kubeconfig=str(kubeconfig),
            checkpoint_path=str(self.workdir / CHECKPOINT_FILE))
        return self._tune(config) if self._tune else config

    async def __aenter__(self) -> DraStage:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._own_api:
            self.api.start()
        if not any(n["metadata"]["name"] == self.node_name for n in self.api.cluster.nodes):
            self.api.add_node(self.node_name)  # the Node object the slices are owned by
        self.kubelet = DraKubelet(self.root, self.node_name,
                                  api_url=self.api.url if self._kubelet_wipes else None,
                                  api_token=self.api.token, health_retry=self._health_retry)
        await self.kubelet.start()
        await self.start_driver()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stop_driver()
        finally:
            if self.kubelet is not None:
                await self.kubelet.stop()
            if self._own_api:
                self.api.stop()
            if self._own_root:
                shutil.rmtree(self.root, ignore_errors=True)

    async def start_driver(self) -> DraDriver:
        driver = self._make_driver(self.config())
        reader = NodeReader(self.node.sysfs_root, self.node.dev_root, deadline=5.0)
        watcher = HealthWatcher([], reader, poll_seconds=self._poll_seconds,
                                flap_hold_seconds=self._flap_hold, events=None)
        inventory = await watcher.refresh()
        await driver.start(inventory)
        if self._slice_spacing is not None:
            driver.helper.publisher.damper.spacing = self._slice_spacing
        self.driver, self.watcher = driver, watcher
        self._follow_task = asyncio.create_task(watcher.follow(driver.update),
                                                name="dra-stage-follow")
        self._watch_task = asyncio.create_task(watcher.run(), name="dra-stage-health")
        return driver

    async def stop_driver(self) -> None:
        for task in (self._watch_task, self._follow_task):
            if task is not None:
                # Bounded: a cancel the watcher's wait_for swallows must not hang the stage.
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
        self._watch_task = self._follow_task = None
        driver, self.driver = self.driver, None
        if driver is None:
            return
        stopping = asyncio.ensure_future(driver.stop())
        done, _ = await asyncio.wait({stopping}, timeout=self.stop_limit)
        if not done:
            # Say where it is stuck instead of hanging until the run's own timeout.
            me = asyncio.current_task()
            where = "; ".join(describe(t) for t in asyncio.all_tasks() if t is not me)
            raise RuntimeError(f"the DRA driver did not stop within {self.stop_limit:g} s; "
                               f"tasks: {where}")
        stopping.result()

    async def restart_driver(self) -> DraDriver:
        await self.stop_driver()
        return await self.start_driver()

    # --- what callers look at --------------------------------------------------------------

    def slices(self) -> list[dict[str, Any]]:
        return self.api.slices(self.node_name)

    def devices(self) -> dict[str, dict[str, Any]]:
        """The node's published devices by name (of its one slice; empty when none)."""
        return self.devices_of(None)

    def devices_of(self, driver: str | None) -> dict[str, dict[str, Any]]:
        found = [s for s in self.slices() if driver is None or s["spec"]["driver"] == driver]
        if len(found) != 1:
            return {}
        return {d["name"]: d for d in found[0]["spec"].get("devices") or []}

    async def until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        return await wait_until(predicate, timeout, step=0.01)

    async def statuses_written(self, timeout: float = 10.0) -> None:
        """Wait until the driver's hooks ran and its claim status queue is empty: status
        is written off the pod's path, after Prepare answered."""
        assert self.driver is not None
        await self.driver.preparer.hooks.done()
        if self.driver.status_writer is not None:
            await asyncio.wait_for(self.driver.status_writer.drained(), timeout)

    async def registered(self, count: int = 1, timeout: float = 10.0) -> bool:
        assert self.kubelet is not None and self.driver is not None
        return await self.kubelet.wait_registered(self.driver.config.driver_name, count,
                                                  timeout)


def share_result(request: str, device: str, pool: str, *, bandwidth: str | None = None,
                 driver: str = "rdma-hca.io", share_id: str | None = None) -> dict[str, Any]:
    """An allocation result as the scheduler writes it for a share of a device that
    allows several allocations: its own shareID (a UID) and, when the claim asked for
    bandwidth (or the policy's default is not 0), the ``consumedCapacity``."""
    result: dict[str, Any] = {"request": request, "driver": driver, "pool": pool,
                              "device": device, "shareID": share_id or str(uuid.uuid4())}
    if bandwidth is not None:
        result["consumedCapacity"] = {qualified(driver, BANDWIDTH): bandwidth}
    return result


def admin_result(request: str, device: str, pool: str, *,
                 driver: str = "rdma-hca.io") -> dict[str, Any]:
    """An allocation result as the scheduler writes it for a request with
    ``adminAccess: true`` (allowed in a namespace labelled
    ``resource.kubernetes.io/admin-access: "true"``): the device even when other claims
    hold it, whole or in shares, and consuming nothing of it."""
    return {"request": request, "driver": driver, "pool": pool, "device": device,
            "adminAccess": True}


def with_changes(**changes: Any) -> Callable[[DriverConfig], DriverConfig]:
    """A ``config`` hook for DraStage that changes some fields of the driver's config."""
    return lambda c: replace(c, **changes)
