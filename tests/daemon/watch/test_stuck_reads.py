"""A read of the machine that never returns stops nothing but that HCA.

A FIFO in place of a port's ``state`` file stands in for a read stuck in a driver or
in HCA firmware: opening it blocks until a writer comes. Each test releases its FIFO
at teardown (a writer opens it), so no thread of the test process stays blocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_daemon import R, make_settings
from test_serve_process import (
    free_port,
    http_get,
    metric_samples,
    serve,
    serve_argv,
    wait_http,
    wait_registered,
)

from rdma_hca.daemon.deviceplugin.pool import shared_ids
from rdma_hca.daemon.deviceplugin.registration import socket_name
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.kit.offloop import OffLoop, Stalled
from rdma_hca.kit.workers import IDLE_NAME

STUCK = "mlx5_3"


class Fifo:
    """A port's state file turned into a FIFO that answers only when released."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.text = path.read_text()
        path.unlink()
        os.mkfifo(path)

    def release(self) -> None:
        """Answer every reader blocked on it, and put the regular file back."""
        if not self.path.exists() or not self.path.is_fifo():
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: nobody reads it, nothing to release
                raise
            fd = -1
        try:
            tmp = self.path.with_name(".state.tmp")
            tmp.write_text(self.text)
            os.replace(tmp, self.path)
            if fd >= 0:
                os.write(fd, self.text.encode())
        finally:
            if fd >= 0:
                os.close(fd)


@pytest.fixture
def make_fifo(node: SimNode) -> Iterator[Callable[[], Fifo]]:
    """Turns the STUCK HCA's port state into a FIFO when called; released at teardown."""
    made: list[Fifo] = []

    def make() -> Fifo:
        made.append(Fifo(node.port_dir(STUCK, 1) / "state"))
        return made[-1]

    yield make
    for f in made:
        f.release()


async def test_stuck_port_read_makes_that_hca_unknown_and_is_counted_once(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator, make_fifo: Callable[[], Fifo],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    d = Daemon(make_settings(node, plugin_dir), netlink=False, read_deadline=1.0)
    await d.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        stuck = make_fifo()
        # unhealthyWhen "any" (the default): one HCA unknown makes the devices Unhealthy.
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
        assert kubelet.capacity(R) == 1000
        inv = d.inventory
        assert inv is not None
        ports = {h.name: h.ports for h in inv.hcas}
        assert {p.state for p in ports[STUCK]} == {"UNKNOWN"}
        assert all(p.is_up for name, ps in ports.items() if name != STUCK for p in ps)
        # The health loop goes on: passes complete while the read stays stuck.
        passes = d.health.passes
        assert await wait_until(lambda: d.health.passes > passes + 3, 5)
        assert d.status().liveness(d.status().started + 1).ok
        stalls = d.status().sysfs_stalls
        assert stalls >= 1
        said = [r for r in caplog.records
                if STUCK in r.getMessage() and "did not answer" in r.getMessage()]
        assert len(said) == 1, "the stall of one HCA is logged once"

        stuck.release()
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        assert any(STUCK in r.getMessage() and "answered again" in r.getMessage()
                   for r in caplog.records)
    finally:
        await d.stop()


def _pool_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate()
            if t.name in (IDLE_NAME, "rdma-hca-offloop")}


async def test_offloop_keeps_one_thread_per_stuck_key(tmp_path: Path) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    off = OffLoop(0.1)
    try:
        with pytest.raises(Stalled):
            await off.run("fifo", path.read_bytes)
        threads = _pool_threads()
        for _ in range(5):
            with pytest.raises(Stalled):
                await off.run("fifo", path.read_bytes)
        assert off.stalls_total == 1
        assert off.stuck == frozenset({"fifo"})
        now = _pool_threads()
        assert now == threads, "no second read of a stuck key was started"
        # Other keys are not held up by the stuck one.
        answers = await off.each(["a", "fifo", "b"], lambda k: k * 2, partial=True)
        assert answers == {"a": "aa", "b": "bb"}
        # Calls that answer reuse their thread: a hundred of them add at most one.
        for n in range(100):
            assert await off.run("quick", lambda n=n: n) == n
        assert len(_pool_threads()) <= len(now) + 1
    finally:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    assert await wait_until(lambda: not off.stuck, 5)
    assert await off.run("fifo", lambda: 42) == 42


async def test_sigterm_ends_serve_while_a_read_never_returns(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        make_fifo: Callable[[], Fifo]) -> None:
    port = free_port()
    argv = serve_argv(node, plugin_dir, "--read-deadline-seconds", "1", metrics_port=port)
    async with serve(argv) as proc:
        await wait_registered(kubelet)
        await wait_http(port)
        make_fifo()
        # The read passes its deadline; the HCA then counts as down.
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0, timeout=10)
        status, body = await http_get(port, "/metrics")
        assert status == 200
        samples = metric_samples(body)
        stalls = [v for _, v in samples["rdma_hca_sysfs_stalls_total"]]
        assert stalls and stalls[0] >= 1
        assert ({"hca": STUCK, "port": "1", "state": "UNKNOWN"}, 1.0) in \
            samples["rdma_hca_port_state"]
        assert await http_get(port, "/healthz") == (200, "ok\n")
        # gRPC keeps answering: an Allocate of an advertised ID still gets its answer.
        resp = await kubelet.allocate(R, [[shared_ids(1000)[0]]])
        assert resp.container_responses[0].envs["RDMA_HCA_DEVICES"]
        proc.send(signal.SIGTERM)
        assert await proc.wait_exit(timeout=5) == 0
    assert not (plugin_dir / socket_name(R)).exists()


async def test_a_scrape_never_reads_sysfs(node: SimNode, plugin_dir: Path,
                                          kubelet: KubeletEmulator) -> None:
    # Counters come from the health loop's cache: a counter file that never answers
    # costs the scrape nothing (it used to be read, on the event loop, at scrape time).
    counter = Fifo(node.port_dir("mlx5_2", 1) / "counters" / "port_rcv_data")
    d = Daemon(make_settings(node, plugin_dir, metrics_address="127.0.0.1:0"),
               netlink=False, read_deadline=1.0)
    try:
        await d.start()
        assert d.http is not None
        for _ in range(3):
            status, body = await http_get(d.http.bound_port, "/metrics")
            assert status == 200
            samples = metric_samples(body)
            assert ({"usable": "true"}, 9.0) in samples["rdma_hca_hcas"]
    finally:
        await d.stop()
        counter.release()


async def test_hostile_hw_counters_leave_the_scrape_whole(node: SimNode, plugin_dir: Path,
                                                         kubelet: KubeletEmulator) -> None:
    # A hw_counters file that never answers (firmware stuck), one that is not a number and
    # one past 64 bits: the scrape still answers with every other counter.
    hw = node.port_dir("mlx5_2", 1) / "hw_counters"
    stuck = Fifo(hw / "np_cnp_sent")
    (hw / "rp_cnp_handled").write_text("N/A\n")
    (hw / "out_of_sequence").write_text("9" * 400 + "\n")
    node.set_counter("mlx5_2", 1, "packet_seq_err", 12, hw=True)
    d = Daemon(make_settings(node, plugin_dir, metrics_address="127.0.0.1:0"),
               netlink=False, read_deadline=0.5)
    try:
        await d.start()
        assert d.http is not None
        d.health.want_counters()
        await d.health.refresh_counters()  # gives the FIFO up after the deadline
        status, body = await http_get(d.http.bound_port, "/metrics")
        assert status == 200
        samples = metric_samples(body)
        hw_samples = {(lab["hca"], lab["counter"]): v
                      for lab, v in samples["rdma_hca_port_hw_events_total"]}
        assert hw_samples[("mlx5_2", "packet_seq_err")] == 12
        for gone in ("np_cnp_sent", "rp_cnp_handled", "out_of_sequence"):
            assert ("mlx5_2", gone) not in hw_samples
            assert ("mlx5_3", gone) in hw_samples  # another HCA's are all there
        assert ({}, 1.0) in samples["rdma_hca_sysfs_stalls_total"]
    finally:
        await d.stop()
        stuck.release()


def blocked_on_a_fifo(pid: int) -> bool:
    """Whether a thread of ``pid`` waits in open() for a FIFO's writer."""
    tasks = Path(f"/proc/{pid}/task")
    for t in tasks.iterdir():
        with contextlib.suppress(OSError):
            if (t / "wchan").read_text().strip() == "wait_for_partner":
                return True
    return False


async def test_sigterm_during_the_first_discovery_on_a_stuck_node(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        make_fifo: Callable[[], Fifo]) -> None:
    # The node is stuck before the daemon starts, and the deadline is long: SIGTERM must
    # not wait for the start-up discovery to give the read up.
    make_fifo()
    argv = serve_argv(node, plugin_dir, "--read-deadline-seconds", "60")
    async with serve(argv) as proc:
        async with asyncio.timeout(10):
            while not blocked_on_a_fifo(proc.pid):
                await asyncio.sleep(0.02)
        proc.send(signal.SIGTERM)
        assert await proc.wait_exit(timeout=5) == 0
    assert "Traceback" not in proc.stderr
    assert not (plugin_dir / socket_name(R)).exists()
