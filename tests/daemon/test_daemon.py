"""The daemon end to end: simulated node → discovery → pool → gRPC → kubelet emulator.

Everything runs over real unix sockets with the real daemon code; the node is a
simulated sysfs/dev tree that the tests change as hardware and drivers would.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.daemon.deviceplugin.pool import shared_ids
from rdma_hca.daemon.deviceplugin.registration import socket_name
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.kubelet_rules import AdmissionError
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.settings.model import Mode, PoolConfig, Settings, UnhealthyWhen

R = "rdma/hca"


def make_settings(node: SimNode, plugin_dir: Path, **kw: object) -> Settings:
    base = Settings(
        sysfs_root=str(node.sysfs_root),
        dev_root=str(node.dev_root),
        kubelet_dir=str(plugin_dir),
        metrics_address="",
        health_poll_seconds=0.05,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.fixture
async def daemon(node: SimNode, plugin_dir: Path,
                 kubelet: KubeletEmulator) -> AsyncIterator[Daemon]:
    d = Daemon(make_settings(node, plugin_dir), netlink=False)
    await d.start()
    yield d
    await d.stop()


async def test_registers_and_node_shows_1k(daemon: Daemon, kubelet: KubeletEmulator) -> None:
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    assert kubelet.capacity(R) == 1000
    assert kubelet.node_status() == {"capacity": {R: "1k"}, "allocatable": {R: "1k"}}
    assert [d.ID for d in kubelet.devices(R)] == shared_ids(1000)
    opts = kubelet.options(R)
    assert opts is not None and not opts.pre_start_required
    assert not opts.get_preferred_allocation_available
    assert daemon.ready()


async def test_pod_gets_rdma_cm_and_every_uverbs(daemon: Daemon, kubelet: KubeletEmulator,
                                                 node: SimNode) -> None:
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    resp = await kubelet.admit_pod(R, 1)
    paths = [d.container_path for d in resp.devices]
    names = node.hca_names
    assert paths[0] == "/dev/infiniband/rdma_cm"
    assert sorted(paths[1:]) == sorted(f"/dev/infiniband/{node.uverbs_name(n)}" for n in names)
    assert all(d.host_path == d.container_path and d.permissions == "rw" for d in resp.devices)
    assert resp.envs["RDMA_HCA_DEVICES"].split(",") == names


async def test_unknown_ids_fail_with_invalid_argument(daemon: Daemon,
                                                      kubelet: KubeletEmulator) -> None:
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    # The kubelet turns a failed Allocate into the pod's UnexpectedAdmissionError.
    with pytest.raises(AdmissionError) as err:
        await kubelet.allocate(R, [["hca-0001"], ["hca-5000", "nope"]])
    assert "code = InvalidArgument" in str(err.value)
    assert "unknown device IDs for rdma/hca: hca-5000, nope" in str(err.value)


async def test_port_down_and_back(daemon: Daemon, kubelet: KubeletEmulator,
                                  node: SimNode) -> None:
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    node.set_port("mlx5_3", 1, up=False)
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
    assert kubelet.capacity(R) == 1000
    node.set_port("mlx5_3", 1, up=True)
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)


async def test_unhealthy_when_all(node: SimNode, plugin_dir: Path,
                                  kubelet: KubeletEmulator) -> None:
    settings = make_settings(node, plugin_dir,
                             pools=(PoolConfig(unhealthy_when=UnhealthyWhen.ALL),))
    d = Daemon(settings, netlink=False)
    await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        names = node.hca_names
        for n in names[:-1]:
            node.set_port(n, 1, up=False)
        await d.health.refresh()
        assert kubelet.allocatable(R) == 1000
        node.set_port(names[-1], 1, up=False)
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
    finally:
        await d.stop()


async def test_every_stream_sees_every_update(daemon: Daemon, kubelet: KubeletEmulator,
                                              node: SimNode, plugin_dir: Path) -> None:
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    path = "unix://" + str(plugin_dir / socket_name(R))
    channels = [grpc.aio.insecure_channel(path) for _ in range(3)]
    streams = [api_pb2_grpc.DevicePluginStub(c).ListAndWatch(api_pb2.Empty())
               for c in channels]
    try:
        firsts = [await s.read() for s in streams]
        assert all(len(f.devices) == 1000 for f in firsts)
        node.set_port("mlx5_0", 1, up=False)
        updates = [await asyncio.wait_for(s.read(), 10) for s in streams]
        for u in updates:
            assert {d.health for d in u.devices} == {"Unhealthy"}
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
    finally:
        for s in streams:
            s.cancel()
        for c in channels:
            await c.close()


async def test_kubelet_restart_registers_again(daemon: Daemon,
                                               kubelet: KubeletEmulator) -> None:
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    before = kubelet.registrations(R)
    await kubelet.restart(delay=0.2)
    await kubelet.wait_for(lambda b=before: kubelet.registrations(R) > b
                           and kubelet.allocatable(R) == 1000, timeout=10)
    assert daemon.lifecycle.kubelet_restarts >= 1


async def test_kubelet_absent_at_start_is_waited_for(node: SimNode, plugin_dir: Path) -> None:
    d = Daemon(make_settings(node, plugin_dir), netlink=False)
    await d.start()
    try:
        # It has tried, found no kubelet, and waits for one.
        assert await wait_until(lambda: d.lifecycle.pools[R].last_error is not None, 5)
        assert "waiting for the kubelet" in (d.lifecycle.pools[R].last_error or "")
        assert not d.ready()
        kubelet = KubeletEmulator(plugin_dir)
        await kubelet.start()
        try:
            await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000, timeout=10)
            assert await wait_until(d.ready, 5)
        finally:
            await kubelet.stop()
    finally:
        await d.stop()


async def test_stream_end_means_register_again(daemon: Daemon, kubelet: KubeletEmulator,
                                               plugin_dir: Path) -> None:
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    # The kubelet dies without cleaning up; our stream ends; it comes back later.
    await kubelet.stop()
    assert await wait_until(lambda: not daemon.ready(), 5)
    before = daemon.lifecycle.registrations[R]
    (plugin_dir / "kubelet.sock").unlink(missing_ok=True)
    await kubelet.start()
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000, timeout=10)
    assert daemon.lifecycle.registrations[R] > before


async def test_stale_socket_is_replaced(node: SimNode, plugin_dir: Path,
                                        kubelet: KubeletEmulator) -> None:
    stale = plugin_dir / socket_name(R)
    stale.write_text("left by a process killed with -9")
    d = Daemon(make_settings(node, plugin_dir), netlink=False)
    await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        assert stale.is_socket()
    finally:
        await d.stop()
    assert not stale.exists()


async def test_hca_removed_and_added_back(daemon: Daemon, kubelet: KubeletEmulator,
                                          node: SimNode) -> None:
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    spec = node.specs["mlx5_5"]
    node.remove_hca("mlx5_5")
    assert await wait_until(lambda: daemon.inventory is not None
                            and "mlx5_5" not in [h.name for h in daemon.inventory.hcas], 5)
    # A vanished HCA counts as down until it returns: no pod is admitted meanwhile.
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
    alloc = await kubelet.allocate(R, [["hca-0001"]])
    resp = alloc.container_responses[0]
    assert "mlx5_5" not in resp.envs["RDMA_HCA_DEVICES"].split(",")
    node.add_hca(spec)
    assert await wait_until(lambda: daemon.inventory is not None
                            and "mlx5_5" in [h.name for h in daemon.inventory.hcas], 5)
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    resp = await kubelet.admit_pod(R, 1)
    assert "mlx5_5" in resp.envs["RDMA_HCA_DEVICES"].split(",")


async def test_device_node_removed_and_restored(daemon: Daemon, kubelet: KubeletEmulator,
                                                node: SimNode) -> None:
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    uverbs = node.uverbs_name("mlx5_2")
    node.remove_dev_node(uverbs)
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
    node.restore_dev_node(uverbs)
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)


async def test_concurrent_allocates(daemon: Daemon, kubelet: KubeletEmulator,
                                    node: SimNode) -> None:
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    results = await asyncio.gather(*(kubelet.allocate(R, [[f"hca-{i:04d}"]])
                                     for i in range(32)))
    expected = ",".join(node.hca_names)
    assert len(results) == 32
    assert all(r.container_responses[0].envs["RDMA_HCA_DEVICES"] == expected for r in results)


async def test_exclusive_mode_on_gpu_node(node: SimNode, plugin_dir: Path,
                                          kubelet: KubeletEmulator) -> None:
    settings = make_settings(node, plugin_dir, pools=(PoolConfig(mode=Mode.EXCLUSIVE),))
    d = Daemon(settings, netlink=False)
    await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == len(node.hca_names))
        devices = {x.ID: x for x in kubelet.devices(R)}
        assert devices[node.specs["mlx5_0"].pci_address or ""].topology.nodes[0].ID == 0
        opts = kubelet.options(R)
        assert opts is not None and opts.get_preferred_allocation_available
        resp = await kubelet.admit_pod(R, 2)
        assert len(resp.envs["RDMA_HCA_DEVICES"].split(",")) == 2
        assert len(resp.devices) == 3
    finally:
        await d.stop()


async def test_several_pools_register_and_restart_independently(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    from rdma_hca.settings.model import Selectors

    pools = (
        PoolConfig(selectors=Selectors(names=("mlx5_[0-7]",))),
        PoolConfig(resource_name="rdma/storage", mode=Mode.EXCLUSIVE,
                   selectors=Selectors(names=("mlx5_bond_0",))),
    )
    d = Daemon(make_settings(node, plugin_dir, pools=pools), netlink=False)
    await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000
                               and kubelet.allocatable("rdma/storage") == 1)
        hca_regs = kubelet.registrations(R)
        (plugin_dir / socket_name("rdma/storage")).unlink()
        await kubelet.wait_for(lambda: kubelet.registrations("rdma/storage") == 2
                               and kubelet.allocatable("rdma/storage") == 1)
        assert kubelet.registrations(R) == hca_regs
        resp = await kubelet.admit_pod("rdma/storage", 1)
        assert resp.envs["RDMA_HCA_DEVICES"] == "mlx5_bond_0"
        resp = await kubelet.admit_pod(R, 1)
        assert "mlx5_bond_0" not in resp.envs["RDMA_HCA_DEVICES"]
    finally:
        await d.stop()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
async def test_fifty_kubelet_restarts_leak_nothing(daemon: Daemon,
                                                   kubelet: KubeletEmulator) -> None:
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    # Warm-up: the first restarts create gRPC's lazily-started threads and pollers.
    for _ in range(3):
        before = kubelet.registrations(R)
        await kubelet.restart()
        await kubelet.wait_for(lambda b=before: kubelet.registrations(R) > b
                               and kubelet.allocatable(R) == 1000, timeout=10)
    fds, threads = _fds(), threading.active_count()
    for _ in range(50):
        before = kubelet.registrations(R)
        await kubelet.restart()
        await kubelet.wait_for(lambda b=before: kubelet.registrations(R) > b
                               and kubelet.allocatable(R) == 1000, timeout=10)
        assert all(d.health == "Healthy" for d in kubelet.devices(R))
    await asyncio.sleep(0.2)
    assert _fds() <= fds + 2, "file descriptors grew over 50 kubelet restarts"
    assert threading.active_count() <= threads + 1, "threads grew over 50 kubelet restarts"


async def test_old_stream_cannot_disconnect_the_new_registration(
        node: SimNode, plugin_dir: Path) -> None:
    # Newer kubelets keep the old stream after a re-registration, and its end then
    # disconnects the new one; the daemon must close its old server first.
    kubelet = KubeletEmulator(plugin_dir, old_stream_disconnects_new=True)
    await kubelet.start()
    d = Daemon(make_settings(node, plugin_dir), netlink=False)
    await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        (plugin_dir / socket_name(R)).unlink()
        await kubelet.wait_for(lambda: kubelet.registrations(R) == 2
                               and kubelet.allocatable(R) == 1000, timeout=10)
        # The old stream had ended when the new registration came: none is left to end
        # later and disconnect it.
        assert kubelet.superseded_streams == 0
        assert kubelet.allocatable(R) == 1000
        assert kubelet.registrations(R) == 2
    finally:
        await d.stop()
        await kubelet.stop()


async def events_handled(daemon: Daemon, plugin_dir: Path) -> None:
    """Return once every directory event so far has been handled (a marker file's is)."""
    marker = plugin_dir / f".handled-{time.monotonic_ns()}"
    marker.touch()
    assert await wait_until(lambda: daemon.lifecycle.last_dir_event == marker.name, 5)
    marker.unlink()


@pytest.mark.parametrize("delay", [0.0, 0.1])
async def test_one_registration_per_kubelet_restart(daemon: Daemon, kubelet: KubeletEmulator,
                                                    delay: float) -> None:
    # A restart fires three triggers (stream ended, our socket removed, kubelet.sock
    # created) in any order; the kubelet must see one registration, not three.
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    for _ in range(5):
        before = kubelet.registrations(R)
        await kubelet.restart(delay=delay)
        await kubelet.wait_for(lambda b=before: kubelet.registrations(R) > b
                               and kubelet.allocatable(R) == 1000, timeout=10)
        assert await wait_until(daemon.ready, 5)
        # A late trigger of this restart (our socket removed, kubelet.sock created) would
        # have owed a registration by now, in the step that handled its event.
        await events_handled(daemon, kubelet.plugin_dir)
        assert daemon.ready()
        assert kubelet.registrations(R) == before + 1


class _CleansDuringRegister(KubeletEmulator):
    """A kubelet whose start-up clean removes the plugin's socket while Register is read.

    It then dials a socket that is gone and would wait its whole dial timeout.
    """

    removed = 0

    async def _admit_registration(self, request: api_pb2.RegisterRequest) -> Any:
        if not self.removed:
            self.removed += 1
            (self.plugin_dir / request.endpoint).unlink()
        return await super()._admit_registration(request)


async def test_socket_removed_during_register_is_not_waited_for(
        node: SimNode, plugin_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The daemon's own Register would wait 15 s and this kubelet's dial 60 s; the daemon
    # must see its socket go, give the call up and register a new socket instead.
    caplog.set_level(logging.INFO, logger="rdma_hca.daemon.deviceplugin")
    kubelet = _CleansDuringRegister(plugin_dir, dial_timeout=60)
    await kubelet.start()
    d = Daemon(make_settings(node, plugin_dir), netlink=False)
    await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000, timeout=10)
        assert kubelet.removed == 1
        assert kubelet.registrations(R) == 1
        assert "giving up the Register call in flight: our socket" in caplog.text
        assert await wait_until(d.ready, 5)
    finally:
        await d.stop()
        await kubelet.stop()


async def test_trigger_while_the_server_is_replaced_costs_one_restart(
        daemon: Daemon, kubelet: KubeletEmulator) -> None:
    # A trigger that arrives while the old server is being stopped is answered by the
    # server that replaces it; it must not restart that one after it has registered.
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    lifecycle = daemon.lifecycle
    old = lifecycle.servers[R]
    before = kubelet.registrations(R)
    lifecycle.request(R, "test: first trigger")
    assert await wait_until(lambda: old.service.stopping, 5, step=0)
    assert lifecycle.servers.get(R) is None  # the old server is on its way out
    lifecycle.request(R, "test: second trigger")
    await kubelet.wait_for(lambda: kubelet.registrations(R) > before
                           and kubelet.allocatable(R) == 1000)
    new = lifecycle.servers[R]
    # The old server's socket going and the new one's coming are handled by now: a
    # restart they wrongly owed would show in the state.
    await events_handled(daemon, kubelet.plugin_dir)
    assert not lifecycle.pools[R].restart_owed
    assert kubelet.registrations(R) == before + 1
    assert lifecycle.servers[R] is new
    assert daemon.ready()


async def test_inventory_follows_rapid_port_flaps(daemon: Daemon, kubelet: KubeletEmulator,
                                                  node: SimNode) -> None:
    # A flap that lands while a full discovery is reading the tree must not leave the
    # daemon believing the older state once the files settle.
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    up = True
    for _ in range(100):
        up = not up
        node.set_port("mlx5_0", 1, up=up)
        assert await wait_until(
            lambda u=up: daemon.inventory is not None
            and any(h.name == "mlx5_0" and h.ports[0].is_up == u for h in daemon.inventory.hcas),
            5), f"the daemon never saw mlx5_0 {'up' if up else 'down'}"
    assert up and daemon.inventory is not None and daemon.inventory.held == {"mlx5_0"}
    # Up, but held for flapping: Unhealthy until the hold ends (its clock moved by hand).
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
    clock = daemon.health.flaps.clock
    daemon.health.flaps.clock = lambda: clock() + daemon.settings.flap_hold_seconds
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)


async def test_an_hca_in_an_exclusive_pool_and_another_is_refused_by_name(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    from rdma_hca.settings.model import ConfigError, Selectors

    # Globs the config alone cannot tell apart: only discovery shows mlx5_0..3 in both.
    pools = (
        PoolConfig(selectors=Selectors(names=("mlx5_[0-3]",))),
        PoolConfig(resource_name="rdma/storage", mode=Mode.EXCLUSIVE,
                   selectors=Selectors(names=("mlx5_?",), drivers=("mlx5_core",))),
    )
    d = Daemon(make_settings(node, plugin_dir, pools=pools), netlink=False)
    try:
        with pytest.raises(ConfigError) as err:
            await d.start()
    finally:
        await d.stop()
    text = str(err.value)
    assert "the HCAs mlx5_0, mlx5_1, mlx5_2, mlx5_3 are in the exclusive pool rdma/storage " \
        "and in the pool rdma/hca" in text and "\n" not in text
    assert kubelet.registrations(R) == 0


async def test_every_hca_both_pools_hold_is_named_in_the_refusal(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    from rdma_hca.settings.model import ConfigError, Selectors

    pools = (
        PoolConfig(selectors=Selectors(names=("mlx5_[0-1]",))),
        PoolConfig(resource_name="rdma/storage", mode=Mode.EXCLUSIVE,
                   selectors=Selectors(names=("mlx5_?",), drivers=("mlx5_core",))),
    )
    d = Daemon(make_settings(node, plugin_dir, pools=pools), netlink=False)
    try:
        with pytest.raises(ConfigError) as err:
            await d.start()
    finally:
        await d.stop()
    assert str(err.value).startswith(
        "pools: 'mlx5_0, mlx5_1' is not valid: the HCAs mlx5_0, mlx5_1 are in the exclusive "
        "pool rdma/storage and in the pool rdma/hca"), str(err.value)


async def test_shared_pools_may_hold_the_same_hca_said_once(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        caplog: pytest.LogCaptureFixture) -> None:
    from rdma_hca.settings.model import Selectors

    pools = (
        PoolConfig(selectors=Selectors(names=("mlx5_[0-1]",))),
        PoolConfig(resource_name="rdma/storage", selectors=Selectors(names=("mlx5_?",))),
    )
    d = Daemon(make_settings(node, plugin_dir, pools=pools), netlink=False)
    with caplog.at_level(logging.INFO, logger="rdma_hca"):
        await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000
                               and kubelet.allocatable("rdma/storage") == 1000)
    finally:
        await d.stop()
    said = [r.getMessage() for r in caplog.records if "shared pools hold" in r.getMessage()]
    assert said == ["shared pools hold the same HCA(s), whose pods share them: "
                    "mlx5_0 in rdma/hca, rdma/storage; mlx5_1 in rdma/hca, rdma/storage"]


async def test_an_hca_that_comes_later_into_an_exclusive_pool_and_another_is_said_once(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        caplog: pytest.LogCaptureFixture) -> None:
    from rdma_hca.settings.model import Selectors

    pools = (
        PoolConfig(selectors=Selectors(names=("mlx5_[0-3]",))),
        PoolConfig(resource_name="rdma/storage", mode=Mode.EXCLUSIVE,
                   selectors=Selectors(names=("mlx5_?",), drivers=("mlx5_core",))),
    )
    spec = node.specs["mlx5_0"]
    for name in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"):
        node.remove_hca(name)
    d = Daemon(make_settings(node, plugin_dir, pools=pools), netlink=False)
    with caplog.at_level(logging.INFO, logger="rdma_hca"):
        await d.start()  # no HCA in both yet: the config is fine on this node
        def said() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "is in the exclusive pool" in r.getMessage()]

        try:
            assert said() == []
            node.add_hca(spec)
            d.health.poke(full=True)
            assert await wait_until(lambda: len(said()) == 1, 5)
            # Later passes see it again and say nothing more.
            passes = d.health.passes
            d.health.poke(full=True)
            assert await wait_until(lambda: d.health.passes >= passes + 2, 5)
        finally:
            await d.stop()
    (record,) = [r for r in caplog.records if "is in the exclusive pool" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert record.getMessage().startswith(
        "the HCA mlx5_0 is in the exclusive pool rdma/storage and in the pool rdma/hca")
