"""Root tasks are supervised, /healthz tells the truth, and stop always finishes.

The daemon runs in-process against a simulated node and the kubelet emulator; the
HTTP endpoints are reached over loopback TCP.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from pathlib import Path

import pytest
from test_daemon import R, make_settings
from test_serve_process import http_get

from rdma_hca.daemon.deviceplugin.registration import socket_name
from rdma_hca.daemon.observe.status import Status
from rdma_hca.daemon.supervise import Supervisor
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.node.deadline_reader import Glance, NodeReader


class HeldReader(NodeReader):
    """The real reader, whose health-poll reads can be made to wait (without a deadline)."""

    def __init__(self, node: SimNode) -> None:
        super().__init__(node.sysfs_root, node.dev_root, deadline=5.0)
        self.go = asyncio.Event()
        self.go.set()

    async def glance(self) -> Glance:
        await self.go.wait()
        return await super().glance()


async def boom() -> None:
    await asyncio.sleep(0)
    raise RuntimeError("something broke in a root task")


async def test_a_dead_root_task_is_loud_fails_healthz_and_stops_the_daemon(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        caplog: pytest.LogCaptureFixture) -> None:
    d = Daemon(make_settings(node, plugin_dir, metrics_address="127.0.0.1:0"), netlink=False)
    stop = asyncio.Event()
    running = asyncio.create_task(d.run(stop))
    try:
        assert await wait_until(lambda: d.http is not None and d.ready(), 10)
        assert d.http is not None
        port = d.http.bound_port
        assert await http_get(port, "/healthz") == (200, "ok\n")
        d.supervisor.spawn("boom", boom())
        # The daemon ends by itself, without anyone setting stop.
        await asyncio.wait_for(running, 10)
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
    assert d.failed
    logged = [r for r in caplog.records if "task boom failed" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None  # with its traceback
    assert "something broke" in caplog.text
    assert not d.status().liveness(time.time()).ok
    assert "boom" in d.status().liveness(time.time()).reason
    # Every server is closed and our socket is gone.
    assert d.http is None
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    assert not (plugin_dir / socket_name(R)).exists()


async def test_healthz_is_503_with_the_reason_while_a_task_is_dead(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    d = Daemon(make_settings(node, plugin_dir, metrics_address="127.0.0.1:0"), netlink=False)
    await d.start()
    try:
        assert d.http is not None
        d.supervisor.spawn("boom", boom())
        assert await wait_until(lambda: bool(d.supervisor.dead), 5)
        status, body = await http_get(d.http.bound_port, "/healthz")
        assert status == 503
        assert "boom" in body
    finally:
        await d.stop()


async def test_a_lifecycle_task_that_ends_is_noticed_and_stop_still_closes_everything(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    d = Daemon(make_settings(node, plugin_dir, metrics_address="127.0.0.1:0"), netlink=False)
    await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        tasks = d.lifecycle.tasks
        assert tasks, "the lifecycle's tasks are supervised"
        tasks[0].cancel()  # ends without the daemon asking for it
        assert await wait_until(lambda: d.failed, 5)
        assert tasks[0].get_name() in d.supervisor.dead
    finally:
        await asyncio.wait_for(d.stop(), 5)
    assert d.http is None
    assert not (plugin_dir / socket_name(R)).exists()


async def test_healthz_fails_when_the_health_loop_stops_completing_passes(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    reader = HeldReader(node)
    d = Daemon(make_settings(node, plugin_dir), netlink=False, reader=reader)
    await d.start()
    try:
        assert await wait_until(lambda: d.health.passes >= 2, 5)
        s = d.status()
        assert s.health_last_pass is not None
        assert s.liveness(time.time()).ok
        reader.go.clear()  # the next pass never completes
        passes = d.health.passes
        await asyncio.sleep(0.3)
        assert d.health.passes <= passes + 1
        s = d.status()
        assert s.health_last_pass is not None
        later = s.health_last_pass + s.health_stale_after + 1
        alive = s.liveness(later)
        assert not alive.ok and "health loop" in alive.reason
        reader.go.set()
        assert await wait_until(lambda: d.health.passes > passes + 1, 5)
        s = d.status()
        assert s.health_last_pass is not None and s.liveness(s.health_last_pass + 1).ok
    finally:
        await d.stop()


def test_liveness_of_a_fresh_daemon_counts_from_its_start() -> None:
    s = Status(version="t", started=1000.0, health_stale_after=10.0)
    assert s.liveness(1005.0).ok
    assert not s.liveness(1011.0).ok
    assert replace(s, health_last_pass=1009.0).liveness(1011.0).ok
    dead = replace(s, health_last_pass=1009.0, dead_tasks=("reconcile",))
    assert not dead.liveness(1009.5).ok and "reconcile" in dead.liveness(1009.5).reason


def test_health_poll_has_no_default_of_its_own() -> None:
    import inspect

    from rdma_hca.daemon.watch.health import HealthWatcher

    param = inspect.signature(HealthWatcher).parameters["poll_seconds"]
    assert param.default is inspect.Parameter.empty



async def test_run_calls_on_started_once_the_daemon_serves_and_is_registered(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    # Not before the kubelet's registration: what start-up's end does would hold it up.
    d = Daemon(make_settings(node, plugin_dir, metrics_address="127.0.0.1:0"), netlink=False)
    seen: list[bool] = []
    stop = asyncio.Event()
    running = asyncio.create_task(d.run(stop, on_started=lambda: seen.append(
        d.http is not None and d.inventory is not None and d.lifecycle is not None
        and d.lifecycle.ready() and kubelet.registrations(R) == 1)))
    try:
        assert await wait_until(lambda: bool(seen), 10)
        await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
    assert seen == [True]


async def test_run_calls_on_started_without_a_kubelet_once_it_had_its_time(
        node: SimNode, plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rdma_hca.daemon import wiring

    monkeypatch.setattr(wiring, "REGISTERED_WAIT", 0.2)
    d = Daemon(make_settings(node, plugin_dir), netlink=False)
    seen: list[bool] = []
    stop = asyncio.Event()
    running = asyncio.create_task(d.run(stop, on_started=lambda: seen.append(
        d.lifecycle is not None and not d.lifecycle.ready())))
    try:
        assert await wait_until(lambda: bool(seen), 10)
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
    assert seen == [True]


async def test_a_stop_before_the_registration_ends_the_run_without_on_started(
        node: SimNode, plugin_dir: Path) -> None:
    d = Daemon(make_settings(node, plugin_dir), netlink=False)
    seen: list[bool] = []
    stop = asyncio.Event()
    running = asyncio.create_task(d.run(stop, on_started=lambda: seen.append(True)))
    assert await wait_until(lambda: d.lifecycle is not None and bool(d.lifecycle.tasks), 10)
    stop.set()
    await asyncio.wait_for(running, 10)  # no kubelet: it would wait REGISTERED_WAIT else
    assert seen == []


def test_settle_heap_puts_what_lives_now_out_of_the_collectors_reach() -> None:
    import gc

    from rdma_hca.daemon.main import settle_heap

    before = gc.get_freeze_count()
    kept = [{"an": "object alive at start-up"}]
    try:
        settle_heap()
        assert gc.get_freeze_count() > before
        assert not any(o is kept for o in gc.get_objects())  # no longer walked
        later = [{"made": "after"}]
        assert any(o is later for o in gc.get_objects())
    finally:
        gc.unfreeze()  # the other tests' objects go back where they were


def test_serve_collects_again_once_started() -> None:
    import gc

    from rdma_hca.daemon.main import started

    gc.disable()  # as rdma_hca.cli leaves it for serve's start
    try:
        started()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()


async def test_a_task_that_gave_way_to_another_instance_is_said_in_its_own_line(
        caplog: pytest.LogCaptureFixture) -> None:
    from rdma_hca.daemon.dra.kubeletplugin.sockets import SocketTaken

    async def gives_way() -> None:
        await asyncio.sleep(0)
        raise SocketTaken("dra.sock was replaced by a socket another instance serves (pid 7)")

    supervisor = Supervisor()
    task = supervisor.spawn("dra-sockets", gives_way())
    await asyncio.wait_for(supervisor.failed.wait(), 5)
    assert task.done() and supervisor.dead == ["dra-sockets"]
    assert supervisor.gave_way is not None and "pid 7" in supervisor.gave_way
    # No traceback, nothing critical: the task said why itself; nothing broke here.
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    # Any other ending is still a death with its traceback, and gave_way says nothing of it.
    other = Supervisor()
    other.spawn("boom", boom())
    await asyncio.wait_for(other.failed.wait(), 5)
    assert other.gave_way is None
    (died,) = [r for r in caplog.records if "task boom failed" in r.getMessage()]
    assert died.exc_info is not None
