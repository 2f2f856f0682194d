"""The flap hold, on an injected clock: a lone change is followed at once, a flap is held
at once and held until the port has been up for the hold time; the device plugin's
ListAndWatch and the DRA driver's slice both follow that one verdict."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.daemon.deviceplugin.pool import exclusive_ids
from rdma_hca.daemon.deviceplugin.registration import socket_name
from rdma_hca.daemon.watch.flaps import FLAP_CHANGES, FLAP_WINDOW_SECONDS, FlapHold
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.node.model import Hca, LinkLayer, NodeInventory, Port
from rdma_hca.settings.decl import BY_KEY
from rdma_hca.settings.model import Mode, PoolConfig, Settings

HOLD = 20.0  # not the default: the daemon must pass its setting on
R = "rdma/hca"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _port(up: bool) -> Port:
    return Port(1, "ACTIVE" if up else "DOWN", "LinkUp" if up else "Disabled",
                LinkLayer.ETHERNET, "", None, (), ())


def _inventory(**ups: bool) -> NodeInventory:
    hcas = tuple(Hca(name, None, None, None, None, None, None, None, None, None,
                     (_port(up),), None) for name, up in ups.items())
    return NodeInventory(hcas, None, None)


def test_a_lone_change_is_followed_and_a_flap_is_held_until_stable() -> None:
    clock = Clock()
    flaps = FlapHold(HOLD, clock=clock)
    assert flaps.observe(_inventory(a=True, b=True)) == frozenset()
    # A port going down and coming back: followed, never held.
    clock.now += 1
    assert flaps.observe(_inventory(a=False, b=True)) == frozenset()
    clock.now += 1
    assert flaps.observe(_inventory(a=True, b=True)) == frozenset()
    assert flaps.next_release() is None
    # Two more changes within the window make four: held from the fourth, though up.
    assert FLAP_CHANGES == 4
    clock.now += 0.1
    assert flaps.observe(_inventory(a=False, b=True)) == frozenset()
    clock.now += 0.1
    assert flaps.observe(_inventory(a=True, b=True)) == {"a"}
    assert flaps.holds_total == 1
    up_at = clock.now
    assert flaps.next_release() == up_at + HOLD
    # Up, but not for long enough yet; b is never touched.
    clock.now = up_at + HOLD - 0.01
    assert flaps.held() == {"a"}
    # Down again during the hold: the hold's clock starts over when it is up again.
    flaps.observe(_inventory(a=False, b=True))
    assert flaps.next_release() is None
    clock.now += 5
    assert flaps.observe(_inventory(a=True, b=True)) == {"a"}
    again = clock.now
    clock.now = again + HOLD - 0.01
    assert flaps.held() == {"a"}
    clock.now = again + HOLD
    assert flaps.held() == frozenset()
    # Once released, its next change is a lone one again.
    clock.now += 1
    assert flaps.observe(_inventory(a=False, b=True)) == frozenset()


def test_changes_spread_wider_than_the_window_never_hold() -> None:
    clock = Clock()
    flaps = FlapHold(HOLD, clock=clock)
    flaps.observe(_inventory(a=True))
    for i in range(10):
        clock.now += FLAP_WINDOW_SECONDS / (FLAP_CHANGES - 1) + 0.01
        assert flaps.observe(_inventory(a=i % 2 == 1)) == frozenset()


def test_the_settings_help_says_what_the_hold_does() -> None:
    text = BY_KEY["flapHoldSeconds"].help
    assert f"{FLAP_CHANGES} times within {FLAP_WINDOW_SECONDS:g} s" in text
    assert BY_KEY["flapHoldSeconds"].default == Settings().flap_hold_seconds <= 30


# --- the device plugin follows the verdict --------------------------------------------------


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[tuple[Daemon, SimNode, KubeletEmulator]]:
    node = gpu_node(tmp_path / "node", hcas=4, gid_table_size=8)
    plugin_dir = tmp_path / "dp"
    plugin_dir.mkdir()
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    d = Daemon(Settings(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                        kubelet_dir=str(plugin_dir), metrics_address="",
                        pools=(PoolConfig(mode=Mode.EXCLUSIVE),),
                        health_poll_seconds=0.05, flap_hold_seconds=HOLD), netlink=False)
    d.health.flaps.clock = Clock()
    await d.start()
    try:
        yield d, node, kubelet
    finally:
        await d.stop()
        await kubelet.stop()


async def _until(fact: Callable[[], bool]) -> None:
    for _ in range(2000):
        if fact():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never happened")


def _seen_up(d: Daemon, hca: str, up: bool) -> Callable[[], bool]:
    def fact() -> bool:
        inv = d.health.inventory
        return inv is not None and any(h.name == hca and h.any_port_up == up for h in inv.hcas)
    return fact


async def test_list_and_watch_shows_a_flapping_hca_unhealthy_through_its_hold(
        daemon: tuple[Daemon, SimNode, KubeletEmulator], tmp_path: Path) -> None:
    d, node, _ = daemon
    clock = d.health.flaps.clock
    assert isinstance(clock, Clock)
    inv = d.health.inventory
    assert inv is not None
    hca = next(h for h in inv.hcas if h.name == "mlx5_3")
    device_id = exclusive_ids(inv.hcas)[hca.name]
    channel = grpc.aio.insecure_channel("unix://" + str(tmp_path / "dp" / socket_name(R)))
    stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty())
    health: dict[str, str] = {}

    async def read_until(wanted: str) -> None:
        while health.get(device_id) != wanted:
            msg = await asyncio.wait_for(stream.read(), 10)
            assert msg is not grpc.aio.EOF
            health.update({dev.ID: dev.health for dev in msg.devices})

    try:
        await read_until("Healthy")
        # A lone change: Unhealthy at once, Healthy at once when it is back.
        node.set_port("mlx5_3", up=False)
        await read_until("Unhealthy")
        node.set_port("mlx5_3", up=True)
        await read_until("Healthy")
        assert not d.health.inventory or not d.health.inventory.held
        # Two more changes within the window: the fourth holds it, though its port is up.
        clock.now += 0.1
        node.set_port("mlx5_3", up=False)
        await _until(_seen_up(d, "mlx5_3", False))
        clock.now += 0.1
        node.set_port("mlx5_3", up=True)
        await _until(_seen_up(d, "mlx5_3", True))
        assert d.health.inventory is not None and d.health.inventory.held == {"mlx5_3"}
        await read_until("Unhealthy")
        pool = d.runtimes[0]
        assert any("mlx5_3: its ports flapped" in p for p in pool.view.problems())
        # Up all along, but short of the hold: still Unhealthy.
        clock.now += HOLD - 1
        assert await d.health.release_holds() is False
        assert not pool.view.hca_healthy(next(h for h in pool.view.hcas if h.name == "mlx5_3"))
        clock.now += 1
        await read_until("Healthy")  # the watcher's next pass hands out the hold's end
        assert d.health.inventory is not None and not d.health.inventory.held
    finally:
        stream.cancel()
        await channel.close()
