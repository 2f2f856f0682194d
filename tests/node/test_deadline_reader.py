"""Reads with deadlines: a FIFO stands in for a sysfs file whose read never returns.

A read of a FIFO with no writer blocks in open() forever, as a read stuck in a driver
does. Every test releases its FIFOs at teardown (``release_fifos`` opens them for
writing), so no test leaves a thread hung behind it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.node.deadline_reader import NodeReader, discover_bounded
from rdma_hca.node.file_reads import DiscoveryFailed
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.model import NodeInventory
from rdma_hca.node.sysfs_values import UNKNOWN

DEADLINE = 1.0


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    n = sim.gpu_node(tmp_path / "n", hcas=2, bond=False, gid_table_size=8)
    yield n
    n.release_fifos()


def _abs(node: SimNode, rel: str) -> str:
    return os.path.abspath(node.sysfs_root / rel)


def _by_name(inv: NodeInventory) -> dict[str, object]:
    return {h.name: h for h in inv.hcas}


def _wait_until(check: object, what: str) -> None:
    """Poll ``check()`` for up to 10 s (a released read returns at once on an idle machine)."""
    assert callable(check)
    for _ in range(1000):
        if check():
            return
        time.sleep(0.01)
    raise AssertionError(f"gave up waiting: {what}")


def _hung(prefix: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name == prefix and t.is_alive())


def test_stuck_state_file_keeps_the_hca_with_unknown_ports(
    node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    rel = "class/infiniband/mlx5_1/ports/1/state"
    node.replace_with_fifo(rel)
    inv = discover_bounded(node.sysfs_root, node.dev_root, deadline=DEADLINE)
    # The tools name such files in their own output; no log line repeats it.
    assert [r for r in caplog.records if r.name.startswith("rdma_hca.node.")] == []
    hcas = {h.name: h for h in inv.hcas}
    assert list(hcas) == ["mlx5_0", "mlx5_1"]
    stuck = hcas["mlx5_1"]
    assert [(p.state, p.phys_state) for p in stuck.ports] == [(UNKNOWN, UNKNOWN)]
    assert not stuck.any_port_up
    assert stuck.usable  # still offered; its devices are unhealthy, not gone
    assert hcas["mlx5_0"].any_port_up
    assert inv.stalled == (_abs(node, rel),)
    said = [w for w in inv.warnings if "did not answer in time" in w]
    assert len(said) == 1 and said[0].count(_abs(node, rel)) == 1  # named once


def test_stuck_gid_entry_is_named(node: SimNode) -> None:
    rel = "class/infiniband/mlx5_0/ports/1/gids/5"
    node.replace_with_fifo(rel)
    inv = discover_bounded(node.sysfs_root, node.dev_root, deadline=DEADLINE)
    assert inv.stalled == (_abs(node, rel),)
    hca = {h.name: h for h in inv.hcas}["mlx5_0"]
    assert hca.ports[0].state == UNKNOWN
    assert [g.index for g in hca.ports[0].gids] == [0, 1, 2, 3]


def test_every_stuck_file_is_named_and_the_call_still_returns(node: SimNode) -> None:
    rels = ["class/infiniband/mlx5_0/fw_ver", "class/infiniband/mlx5_1/ports/1/rate",
            "module/ib_core/parameters/netns_mode"]
    for rel in rels:
        node.replace_with_fifo(rel)
    inv = discover_bounded(node.sysfs_root, node.dev_root, deadline=DEADLINE)
    assert inv.stalled == tuple(sorted(_abs(node, r) for r in rels))
    assert [h.name for h in inv.hcas] == ["mlx5_0", "mlx5_1"]
    assert inv.netns_mode is None


async def test_reader_remembers_a_stuck_file_and_reads_it_again_once_it_returns(
    node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rdma_hca.node")
    rel = "class/infiniband/mlx5_1/ports/1/phys_state"
    path = _abs(node, rel)
    node.replace_with_fifo(rel)
    reader = NodeReader(node.sysfs_root, node.dev_root, deadline=DEADLINE)
    first = await reader.discover()
    assert first.stalled == (path,)
    assert reader.stalls_total == 1
    assert reader.stuck == frozenset({path})
    # Later calls answer "unknown" for it at once: no new stall, no second hung thread.
    for _ in range(3):
        again = await reader.discover()
        assert again.stalled == (path,)
    assert reader.stalls_total == 1
    assert _hung("rdma-hca-discover") == 1
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and path in said[0] and f"deadline {DEADLINE:g} s" in said[0]
    states = await reader.port_states()
    assert states[("mlx5_1", 1)] == (UNKNOWN, UNKNOWN)
    assert states[("mlx5_0", 1)] == ("ACTIVE", "LinkUp")

    node.release_fifo(rel)
    _wait_until(lambda: not reader.stuck, "the released read to come back")
    assert any("answered again" in r.getMessage() for r in caplog.records)
    healed = await reader.discover()
    assert healed.stalled == ()
    assert {h.name: h.any_port_up for h in healed.hcas} == {"mlx5_0": True, "mlx5_1": True}
    assert (await reader.port_states())[("mlx5_1", 1)] == ("ACTIVE", "LinkUp")


async def test_the_event_loop_keeps_running_while_a_read_hangs(node: SimNode) -> None:
    node.replace_with_fifo("class/infiniband/mlx5_0/ports/1/state")
    reader = NodeReader(node.sysfs_root, node.dev_root, deadline=DEADLINE)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        states = await reader.port_states()
    finally:
        ticker.cancel()
    assert states[("mlx5_0", 1)] == (UNKNOWN, UNKNOWN)
    assert ticks > 0


async def test_port_counters_leave_out_a_stuck_counter(node: SimNode) -> None:
    reader = NodeReader(node.sysfs_root, node.dev_root, deadline=DEADLINE)
    assert await reader.port_counters() == {}  # no inventory yet
    await reader.discover()
    node.set_counter("mlx5_0", 1, "port_rcv_data", 42)
    node.replace_with_fifo("class/infiniband/mlx5_1/ports/1/counters/port_xmit_data")
    counters = await reader.port_counters()
    assert counters[("mlx5_0", 1)]["port_rcv_data"] == 42
    assert "port_xmit_data" not in counters[("mlx5_1", 1)]
    assert "port_rcv_data" in counters[("mlx5_1", 1)]
    assert reader.stalls_total == 1
    # A stuck file of an HCA makes its state unknown until it answers again, in the port
    # states and in discovery alike.
    assert (await reader.port_states())[("mlx5_1", 1)] == (UNKNOWN, UNKNOWN)
    inv = await reader.discover()
    assert inv.stalled == (_abs(node, "class/infiniband/mlx5_1/ports/1/counters/port_xmit_data"),)
    assert [h.any_port_up for h in inv.hcas] == [True, False]


async def test_a_stuck_hw_counter_leaves_the_other_counters_read(node: SimNode) -> None:
    reader = NodeReader(node.sysfs_root, node.dev_root, deadline=DEADLINE)
    await reader.discover()
    node.set_counter("mlx5_1", 1, "rp_cnp_handled", 9, hw=True)
    node.replace_with_fifo("class/infiniband/mlx5_1/ports/1/hw_counters/np_cnp_sent")
    counters = await reader.port_counters()
    assert "hw_counters/np_cnp_sent" not in counters[("mlx5_1", 1)]
    assert counters[("mlx5_1", 1)]["hw_counters/rp_cnp_handled"] == 9
    assert "hw_counters/np_cnp_sent" in counters[("mlx5_0", 1)]
    assert reader.stalls_total == 1
    # The next pass answers at once for the stuck file: no second stall is counted.
    again = await reader.port_counters()
    assert again[("mlx5_1", 1)]["hw_counters/rp_cnp_handled"] == 9
    assert reader.stalls_total == 1


async def test_netns_mode_off_the_loop(node: SimNode) -> None:
    reader = NodeReader(node.sysfs_root, node.dev_root, deadline=DEADLINE)
    assert await reader.netns_mode() == "shared"
    node.replace_with_fifo("module/ib_core/parameters/netns_mode")
    assert await reader.netns_mode() is None
    assert reader.stalls_total == 1


def test_deadline_must_be_positive(node: SimNode) -> None:
    with pytest.raises(ValueError, match="deadline"):
        NodeReader(node.sysfs_root, node.dev_root, deadline=0)


def test_hung_reads_do_not_hold_up_interpreter_exit(node: SimNode) -> None:
    node.replace_with_fifo("class/infiniband/mlx5_0/ports/1/state")
    code = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from rdma_hca.node.deadline_reader import NodeReader\n"
        "r = NodeReader(Path(sys.argv[1]), Path(sys.argv[2]), deadline=1.0)\n"
        "inv = asyncio.run(r.discover())\n"
        "print(len(inv.stalled), len(r.stuck))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(node.sysfs_root),
                           str(node.dev_root)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"]


def test_running_out_of_file_descriptors_is_not_no_hcas(node: SimNode) -> None:
    code = (
        "import os, resource, sys\n"
        "from rdma_hca.node.inventory import discover_node\n"
        "from rdma_hca.node.deadline_reader import discover_bounded\n"
        "from rdma_hca.node.file_reads import DiscoveryFailed\n"
        "fds = len(os.listdir('/proc/self/fd'))\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (fds, fds))  # one fd free\n"
        "for run in (discover_node, discover_bounded):\n"
        "    try:\n"
        "        inv = run(sys.argv[1], sys.argv[2])\n"
        "    except DiscoveryFailed as exc:\n"
        "        print('failed:', exc)\n"
        "    else:\n"
        "        print('found', len(inv.hcas))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(node.sysfs_root),
                           str(node.dev_root)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert all(line.startswith("failed: discovery ran out of file descriptors") for line in lines)


def test_plain_discovery_matches_the_bounded_one(node: SimNode) -> None:
    assert discover_bounded(node.sysfs_root, node.dev_root) == discover_node(
        os.path.abspath(node.sysfs_root), os.path.abspath(node.dev_root))


def test_discovery_failed_is_exported() -> None:
    assert issubclass(DiscoveryFailed, Exception)


async def test_a_thread_given_up_on_stops_instead_of_hanging_on_the_next_file(
    node: SimNode,
) -> None:
    first, second = (f"class/infiniband/mlx5_0/ports/1/gids/{i}" for i in (5, 6))
    node.replace_with_fifo(first)
    node.replace_with_fifo(second)
    reader = NodeReader(node.sysfs_root, node.dev_root, deadline=DEADLINE)
    inv = await reader.discover()
    assert inv.stalled == (_abs(node, first), _abs(node, second))
    assert _hung("rdma-hca-discover") == 2
    node.release_fifo(first)
    # The thread that hung on gids/5 returns and stops; it does not go on to gids/6,
    # where a thread already hangs.
    _wait_until(lambda: _hung("rdma-hca-discover") == 1, "the released thread to stop")
    assert reader.stuck == frozenset({_abs(node, second)})


async def test_glance_reads_the_listings_and_every_port_state_in_one_call(
        node: SimNode) -> None:
    reader = NodeReader(node.sysfs_root, node.dev_root, deadline=DEADLINE)
    glance = await reader.glance()
    names, verbs, mad, dev = glance.listings
    assert names == ("mlx5_0", "mlx5_1")
    assert verbs == tuple(sorted(os.listdir(node.sysfs_root / "class" / "infiniband_verbs")))
    assert mad == tuple(sorted(os.listdir(node.sysfs_root / "class" / "infiniband_mad")))
    assert dev == tuple(sorted(os.listdir(node.dev_root / "infiniband")))
    assert glance.states == await reader.port_states()
    node.set_port("mlx5_1", 1, up=False)
    assert (await reader.glance()).states[("mlx5_1", 1)][0] == "DOWN"
    # A stuck state file: the call still returns, with that HCA unknown.
    node.replace_with_fifo("class/infiniband/mlx5_0/ports/1/state")
    stuck = await reader.glance()
    assert stuck.states[("mlx5_0", 1)] == (UNKNOWN, UNKNOWN)
    assert stuck.listings == glance.listings
    assert reader.stalls_total == 1


async def test_an_async_call_needs_no_second_thread_to_watch_the_first(
        node: SimNode) -> None:
    reader = NodeReader(node.sysfs_root, node.dev_root, deadline=DEADLINE)
    await reader.port_states()  # a worker exists from now on
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    threading.Thread.start = counting_start  # type: ignore[method-assign]
    try:
        for _ in range(20):
            await reader.port_states()
            await reader.glance()
    finally:
        threading.Thread.start = real_start  # type: ignore[method-assign]
    # Each call hands its reads to a worker that answered before; the loop watches it.
    assert started == []
