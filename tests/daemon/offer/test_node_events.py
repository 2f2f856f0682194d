"""The node's Events from what discovery reads: a port down and back, a flapping port as
one episode, device nodes gone and back, and the refusal at start that never holds the
exit. Inventories come from a simulated node; the series window runs on a given clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.daemon.offer.nodeevents import CONTROLLER, NodeEvents
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kube.client import ApiClient
from rdma_hca.kube.credentials import load_credentials
from rdma_hca.kube.events import EVENTS_POLICY, EventRecorder
from rdma_hca.node.deadline_reader import NodeReader
from rdma_hca.node.model import NodeInventory

NODE = "gpu-node-1"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def recorder(api: FakeApiServer, tmp_path: Path,
                   clock: Clock) -> AsyncIterator[EventRecorder]:
    creds = load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")),
                             context=None, env={}, home=tmp_path)
    client = ApiClient(creds, EVENTS_POLICY)
    r = EventRecorder(client, controller=CONTROLLER, instance=NODE, clock=clock,
                      close_client=client.close)
    r.start()
    yield r
    await r.close()


def read(node: SimNode) -> NodeInventory:
    return NodeReader(node.sysfs_root, node.dev_root, deadline=5.0).discover_sync()


def on_node(api: FakeApiServer, reason: str) -> list[dict[str, Any]]:
    return api.events(reason=reason, kind="Node", name=NODE)


async def test_a_port_down_and_back_is_one_warning_and_one_normal(
        node: SimNode, api: FakeApiServer, recorder: EventRecorder) -> None:
    events = NodeEvents(recorder, NODE)
    events.observe(read(node))
    node.set_port("mlx5_0", up=False)
    events.observe(read(node))
    node.set_port("mlx5_0", up=True)
    events.observe(read(node))
    assert await recorder.drain(10)
    (down,) = on_node(api, "HcaPortDown")
    (up,) = on_node(api, "HcaPortUp")
    assert down["type"] == "Warning" and up["type"] == "Normal"
    assert "port 1 of the HCA mlx5_0 is down" in down["note"]
    assert "ibstat mlx5_0" in down["note"]
    assert down["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE}
    assert down["metadata"]["namespace"] == "default"
    assert len(api.events()) == 2


async def test_a_flapping_port_is_one_event_per_episode(
        node: SimNode, api: FakeApiServer, recorder: EventRecorder, clock: Clock) -> None:
    events = NodeEvents(recorder, NODE)
    events.observe(read(node))
    for _ in range(4):  # each flap sent on its own, within the recorder's burst
        clock.now += 2
        node.set_port("mlx5_1", up=False)
        events.observe(read(node))
        clock.now += 2
        node.set_port("mlx5_1", up=True)
        events.observe(read(node))
        assert await recorder.drain(10)
    (down,) = on_node(api, "HcaPortDown")
    assert down["series"]["count"] == 4
    (up,) = on_node(api, "HcaPortUp")
    assert up["series"]["count"] == 4
    # Quiet for longer than the window: the next flap is a new episode, a new Event.
    clock.now += recorder.window + 1
    node.set_port("mlx5_1", up=False)
    events.observe(read(node))
    assert await recorder.drain(10)
    assert len(on_node(api, "HcaPortDown")) == 2


async def test_a_port_held_for_flapping_is_down_until_the_hold_ends(
        node: SimNode, api: FakeApiServer, recorder: EventRecorder) -> None:
    events = NodeEvents(recorder, NODE)
    events.observe(read(node))
    node.set_port("mlx5_1", up=False)
    events.observe(read(node))
    for _ in range(3):  # flaps while the HCA is held: no Event at all
        node.set_port("mlx5_1", up=True)
        events.observe(replace(read(node), held=frozenset({"mlx5_1"})))
        node.set_port("mlx5_1", up=False)
        events.observe(replace(read(node), held=frozenset({"mlx5_1"})))
    node.set_port("mlx5_1", up=True)
    events.observe(replace(read(node), held=frozenset({"mlx5_1"})))
    assert await recorder.drain(10)
    assert on_node(api, "HcaPortUp") == []
    events.observe(read(node))  # the hold ends
    assert await recorder.drain(10)
    (down,) = on_node(api, "HcaPortDown")
    (up,) = on_node(api, "HcaPortUp")
    assert "series" not in down and "series" not in up


async def test_device_nodes_gone_and_back(
        node: SimNode, api: FakeApiServer, recorder: EventRecorder) -> None:
    events = NodeEvents(recorder, NODE)
    first = read(node)
    events.observe(first)
    (hca,) = [h for h in first.hcas if h.name == "mlx5_2"]
    assert hca.uverbs is not None
    device = node.dev_root / "infiniband" / Path(hca.uverbs.path).name
    saved = device.read_bytes() if device.is_file() else b""
    device.unlink()
    events.observe(read(node))
    device.write_bytes(saved)
    events.observe(read(node))
    assert await recorder.drain(10)
    (gone,) = on_node(api, "HcaDeviceGone")
    assert gone["type"] == "Warning" and "mlx5_2" in gone["note"]
    assert hca.uverbs.path in gone["note"]
    (back,) = on_node(api, "HcaDeviceBack")
    assert back["type"] == "Normal"
    assert on_node(api, "HcaPortDown") == []  # its ports are not told one by one


async def test_an_hca_that_leaves_the_node_and_comes_back_is_told_both_ways(
        node: SimNode, api: FakeApiServer, recorder: EventRecorder) -> None:
    events = NodeEvents(recorder, NODE)
    events.observe(read(node))
    node.remove_hca("mlx5_3")  # a driver reload: its sysfs entry and device nodes go
    events.observe(read(node))
    events.observe(read(node))  # still gone: nothing more to tell
    node.add_hca(node.specs["mlx5_3"])
    events.observe(read(node))
    events.observe(read(node))
    assert await recorder.drain(10)
    (gone,) = on_node(api, "HcaDeviceGone")
    assert gone["type"] == "Warning" and "the HCA mlx5_3 is gone from the node" in gone["note"]
    (back,) = on_node(api, "HcaDeviceBack")
    assert back["type"] == "Normal"
    assert back["note"] == "the HCA mlx5_3 is back on the node: it is offered again"
    assert on_node(api, "HcaPortDown") == [] and on_node(api, "HcaPortUp") == []


async def test_a_return_is_told_after_several_leave_and_only_the_kept_ones(
        node: SimNode, api: FakeApiServer, recorder: EventRecorder) -> None:
    events = NodeEvents(recorder, NODE, vanished_kept=2)
    events.observe(read(node))
    for name in ("mlx5_1", "mlx5_2", "mlx5_3"):  # mlx5_1, the longest gone, is forgotten
        node.remove_hca(name)
        events.observe(read(node))
    for name in ("mlx5_1", "mlx5_2", "mlx5_3"):
        node.add_hca(node.specs[name])
    events.observe(read(node))
    assert await recorder.drain(10)
    assert len(on_node(api, "HcaDeviceGone")) == 3
    backs = sorted(e["note"] for e in on_node(api, "HcaDeviceBack"))
    assert backs == [f"the HCA {name} is back on the node: it is offered again"
                     for name in ("mlx5_2", "mlx5_3")]


async def test_an_hca_back_with_its_port_down_is_told_so(
        node: SimNode, api: FakeApiServer, recorder: EventRecorder) -> None:
    events = NodeEvents(recorder, NODE)
    events.observe(read(node))
    node.remove_hca("mlx5_4")
    events.observe(read(node))
    node.add_hca(node.specs["mlx5_4"])
    node.set_port("mlx5_4", up=False)
    events.observe(read(node))
    assert await recorder.drain(10)
    assert len(on_node(api, "HcaDeviceBack")) == 1
    (down,) = on_node(api, "HcaPortDown")
    assert "port 1 of the HCA mlx5_4 is down" in down["note"]


async def test_only_offered_hcas_are_told_and_a_port_down_at_start_is(
        node: SimNode, api: FakeApiServer, recorder: EventRecorder) -> None:
    node.set_port("mlx5_0", up=False)
    node.set_port("mlx5_3", up=False)
    events = NodeEvents(recorder, NODE, wanted=lambda h: h.name == "mlx5_0")
    events.observe(read(node))
    node.set_port("mlx5_3", up=True)
    events.observe(read(node))
    assert await recorder.drain(10)
    (down,) = on_node(api, "HcaPortDown")
    assert "mlx5_0" in down["note"]
    assert on_node(api, "HcaPortUp") == []


async def test_a_refusal_waits_for_its_event_but_never_long(
        api: FakeApiServer, recorder: EventRecorder) -> None:
    events = NodeEvents(recorder, NODE)
    await events.refused_sent("pools: the HCA mlx5_0 is in the exclusive pool a and b")
    (refused,) = on_node(api, "ConfigRefused")
    assert refused["type"] == "Warning" and refused["action"] == "Start"
    assert "exclusive pool" in refused["note"]
    api.hang(60, path="/events", times=100)
    await events.refused_sent("another refusal", within=0.05)  # returns: the exit goes on
    assert len(on_node(api, "ConfigRefused")) == 1
