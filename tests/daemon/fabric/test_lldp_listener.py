"""The listener on recorded frames: socket pairs stand in for the raw sockets, so every
frame takes the path a frame from the wire takes (the event loop's reader, the rate
limit, the parser, the table), and the clock is the test's."""

from __future__ import annotations

import asyncio
import errno
import logging
import select
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from lldp_support import SWITCH_A, SWITCH_B, Clock, Wires, hca, inventory

from rdma_hca.contract.fabric import PortNeighbour
from rdma_hca.daemon.fabric import listener as lldp_listener
from rdma_hca.daemon.fabric.listener import LldpListener
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.node.lldp import build_frame
from rdma_hca.node.model import LinkLayer

HOLD = 30.0


@pytest.fixture
def wires() -> Wires:
    w = Wires()
    yield w
    w.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def listener(tmp_path: Path, wires: Wires, clock: Clock) -> AsyncIterator[LldpListener]:
    lis = LldpListener(str(tmp_path), hold_seconds=HOLD, files=OffLoop(5.0), opener=wires,
                       clock=clock)
    yield lis
    lis.close()


async def drain(wires: Wires) -> None:
    """Let the event loop read what the far ends sent."""
    for _ in range(200):
        await asyncio.sleep(0)
        if not any(_pending(s) for s in wires.near.values() if s.fileno() >= 0):
            return


def _pending(sock: socket.socket) -> bool:
    r, _, _ = select.select([sock], [], [], 0)
    return bool(r)


def leaf(chassis: bytes = SWITCH_A, port: str = "Ethernet1", ttl: int = 120,
         name: str = "leaf-1") -> bytes:
    return build_frame(chassis, port, ttl=ttl, system_name=name, port_description="nic0")


async def test_a_frame_makes_the_port_neighbour(listener: LldpListener, wires: Wires) -> None:
    await listener.follow(inventory(hca("mlx5_0", "eth0"), hca("mlx5_1", "eth1")))
    assert set(listener.stats().netdevs) == {"eth0", "eth1"}
    wires.send("eth1", leaf())
    await drain(wires)
    assert listener.neighbours.value == (
        PortNeighbour("mlx5_1", 1, "eth1", "0c:42:a1:00:00:01", "Ethernet1", "leaf-1", "nic0"),)
    assert listener.stats().frames == {"eth0": 0, "eth1": 1}


async def test_a_refresh_is_not_a_change(listener: LldpListener, wires: Wires,
                                         clock: Clock) -> None:
    await listener.follow(inventory(hca("mlx5_0", "eth0")))
    wires.send("eth0", leaf())
    await drain(wires)
    seen = listener.neighbours.generation
    for _ in range(5):
        clock.now += 30
        wires.send("eth0", leaf())
        await drain(wires)
        listener.settle()
    assert listener.neighbours.generation == seen
    assert listener.stats().frames["eth0"] == 6


async def test_garbage_changes_nothing_but_a_counter(listener: LldpListener,
                                                     wires: Wires) -> None:
    await listener.follow(inventory(hca("mlx5_0", "eth0")))
    wires.send("eth0", leaf())
    await drain(wires)
    before = listener.neighbours.value
    good = leaf(SWITCH_B)
    for bad in (good[:20], good[:6] * 3, b"\x01\x80\xc2\x00\x00\x0e" + bytes(8),
                good.ljust(3000, b"\0"), good[:14] + b"\x02\x07\x04" + bytes(6)):
        wires.send("eth0", bad)
    await drain(wires)
    stats = listener.stats()
    assert listener.neighbours.value == before
    assert stats.dropped["oversized"] == 1 and stats.dropped["rate"] == 0
    assert sum(stats.dropped.values()) == 5 and stats.frames["eth0"] == 6


async def test_a_flood_is_read_and_counted_but_not_parsed_past_the_bucket(
        listener: LldpListener, wires: Wires) -> None:
    await listener.follow(inventory(hca("mlx5_0", "eth0")))
    sent = 0
    for i in range(6):
        for j in range(50):  # within the socket pair's buffer
            wires.send("eth0", leaf(port=f"p{i * 50 + j}"))
            sent += 1
        await drain(wires)
    stats = listener.stats()
    # The clock stands still: the bucket's burst is all that is parsed.
    assert stats.frames["eth0"] == sent
    assert stats.dropped["rate"] == sent - int(lldp_listener.BURST)
    # What was parsed changed the neighbour 20 times within the window: it is held at
    # what it was when the churn began.
    assert listener.neighbours.value[0].port_id == "p2"
    assert listener.table.holds_total == 1


async def test_one_wakeup_reads_a_bounded_number_of_frames(listener: LldpListener,
                                                           wires: Wires) -> None:
    await listener.follow(inventory(hca("mlx5_0", "eth0")))
    asyncio.get_running_loop().remove_reader(wires.near["eth0"].fileno())
    for _ in range(lldp_listener.READS_PER_WAKEUP + 10):
        wires.send("eth0", leaf())
    listener._readable("eth0")
    assert listener.stats().frames["eth0"] == lldp_listener.READS_PER_WAKEUP
    listener._readable("eth0")
    assert listener.stats().frames["eth0"] == lldp_listener.READS_PER_WAKEUP + 10


async def test_the_neighbour_goes_when_its_ttl_runs_out(listener: LldpListener,
                                                        wires: Wires, clock: Clock) -> None:
    await listener.follow(inventory(hca("mlx5_0", "eth0")))
    wires.send("eth0", leaf(ttl=120))
    await drain(wires)
    clock.now += 119
    listener.settle()
    assert len(listener.neighbours.value) == 1
    assert listener.table.next_deadline() == pytest.approx(clock.now + 1)
    clock.now += 1
    listener.settle()
    assert listener.neighbours.value == ()
    assert listener.stats().last_frame == {("mlx5_0", 1): 1000.0}


async def test_ttl_zero_forgets_at_once(listener: LldpListener, wires: Wires) -> None:
    await listener.follow(inventory(hca("mlx5_0", "eth0")))
    wires.send("eth0", leaf())
    await drain(wires)
    wires.send("eth0", leaf(ttl=0))
    await drain(wires)
    assert listener.neighbours.value == ()


async def test_a_switch_replaced_is_one_change(listener: LldpListener, wires: Wires,
                                               clock: Clock) -> None:
    await listener.follow(inventory(hca("mlx5_0", "eth0")))
    wires.send("eth0", leaf(SWITCH_A, name="leaf-1"))
    await drain(wires)
    seen = listener.neighbours.generation
    clock.now += 30
    wires.send("eth0", leaf(SWITCH_B, name="leaf-2"))
    await drain(wires)
    assert listener.neighbours.generation == seen + 1
    assert listener.neighbours.value[0].switch == "leaf-2"


async def test_a_neighbour_flipping_is_held_then_published_once_stable(
        listener: LldpListener, wires: Wires, clock: Clock) -> None:
    await listener.follow(inventory(hca("mlx5_0", "eth0")))
    names = ["leaf-1", "leaf-2", "leaf-1", "leaf-2", "leaf-1", "leaf-2", "leaf-1", "leaf-2"]
    generations = []
    for name in names:
        clock.now += 1
        wires.send("eth0", leaf(name=name))
        await drain(wires)
        generations.append(listener.neighbours.generation)
    # Three changes went out at once (the first is a neighbour heard at last); the
    # fourth within the window began the hold.
    assert generations[-1] == 3 and listener.table.held() == {("mlx5_0", 1)}
    assert listener.neighbours.value[0].switch == "leaf-1"
    clock.now += HOLD - 1
    listener.settle()
    assert listener.neighbours.value[0].switch == "leaf-1"
    clock.now += 1
    listener.settle()
    assert listener.neighbours.value[0].switch == "leaf-2"
    assert listener.neighbours.generation == 4 and listener.table.held() == frozenset()


async def test_infiniband_ports_are_not_listened_on(listener: LldpListener) -> None:
    await listener.follow(inventory(hca("mlx5_0", "eth0"),
                                    hca("mlx5_1", "ib0", layer=LinkLayer.INFINIBAND)))
    assert listener.stats().netdevs == ("eth0",)


async def test_a_bond_is_heard_on_its_members(tmp_path: Path, wires: Wires,
                                              clock: Clock) -> None:
    node = sim.gpu_node(tmp_path / "gpu", hcas=1, gid_table_size=4)
    lis = LldpListener(str(node.sysfs_root), hold_seconds=HOLD, files=OffLoop(5.0),
                       opener=wires, clock=clock)
    try:
        await lis.follow(inventory(hca("mlx5_bond_0", "bond0")))
        assert lis.stats().netdevs == ("ens241f0np0", "ens241f1np1")
        wires.send("ens241f1np1", leaf(SWITCH_B, name="leaf-2"))
        await drain(wires)
        assert [(n.netdev, n.switch) for n in lis.neighbours.value] == [
            ("ens241f1np1", "leaf-2")]
        wires.send("ens241f0np0", leaf(SWITCH_A, name="leaf-1"))
        await drain(wires)
        # One neighbour per port: the first member's, whatever order frames come in.
        assert [(n.netdev, n.switch) for n in lis.neighbours.value] == [
            ("ens241f0np0", "leaf-1")]
    finally:
        lis.close()


async def test_a_port_gone_from_the_inventory_is_forgotten(listener: LldpListener,
                                                           wires: Wires) -> None:
    await listener.follow(inventory(hca("mlx5_0", "eth0"), hca("mlx5_1", "eth1")))
    wires.send("eth0", leaf())
    wires.send("eth1", leaf())
    await drain(wires)
    await listener.follow(inventory(hca("mlx5_1", "eth1")))
    assert listener.stats().netdevs == ("eth1",)
    assert [n.hca for n in listener.neighbours.value] == ["mlx5_1"]


async def test_without_cap_net_raw_one_line_says_lldp_is_off(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lis = LldpListener(str(tmp_path), hold_seconds=HOLD, files=OffLoop(5.0),
                       opener=Wires(refuse=1))
    with caplog.at_level(logging.INFO):
        await lis.follow(inventory(hca("mlx5_0", "eth0"), hca("mlx5_1", "eth1")))
        await lis.follow(inventory(hca("mlx5_0", "eth0")))
    said = [r.getMessage() for r in caplog.records if "CAP_NET_RAW" in r.getMessage()]
    assert len(said) == 1 and "LLDP is off" in said[0]
    assert lis.stats().off is not None and lis.stats().netdevs == ()


async def test_a_netdev_that_is_not_here_is_skipped(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    wires = Wires(missing=("eth0",))
    lis = LldpListener(str(tmp_path), hold_seconds=HOLD, files=OffLoop(5.0), opener=wires)
    try:
        with caplog.at_level(logging.INFO):
            await lis.follow(inventory(hca("mlx5_0", "eth0"), hca("mlx5_1", "eth1")))
        assert lis.stats().netdevs == ("eth1",) and lis.stats().off is None
        assert any("not in this network namespace" in r.getMessage() for r in caplog.records)
    finally:
        lis.close()
        wires.close()


async def test_run_expires_on_the_clock_and_closes_on_cancel(tmp_path: Path,
                                                             wires: Wires) -> None:
    lis = LldpListener(str(tmp_path), hold_seconds=HOLD, files=OffLoop(5.0), opener=wires)
    task = asyncio.create_task(lis.run())
    await lis.follow(inventory(hca("mlx5_0", "eth0")))
    wires.send("eth0", leaf(ttl=1))
    await drain(wires)
    assert len(lis.neighbours.value) == 1
    seen = lis.neighbours.generation
    await lis.neighbours.wait_newer(seen, timeout=10)
    assert lis.neighbours.value == ()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert lis.stats().netdevs == ()


class _Failing:
    """A socket whose reads fail as a packet socket's do once its netdev went away."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv_into(self, *args: object) -> int:
        raise OSError(errno.ENETDOWN, "Network is down")

    def close(self) -> None:
        self.sock.close()


async def test_a_socket_whose_netdev_went_away_is_opened_again(tmp_path: Path) -> None:
    wires = Wires()
    first = [True]

    def opener(netdev: str) -> socket.socket:
        sock = wires(netdev)
        if first[0]:
            first[0] = False
            return _Failing(sock)  # type: ignore[return-value]
        return sock

    lis = LldpListener(str(tmp_path), hold_seconds=HOLD, files=OffLoop(5.0), opener=opener)
    try:
        inv = inventory(hca("mlx5_0", "eth0"))
        await lis.follow(inv)
        wires.send("eth0", leaf())
        await drain(wires)
        assert lis.stats().netdevs == ()
        await lis.follow(inv)  # the next inventory (the port's state changed)
        wires.send("eth0", leaf())
        await drain(wires)
        assert lis.stats().netdevs == ("eth0",) and len(lis.neighbours.value) == 1
    finally:
        lis.close()
        wires.close()
