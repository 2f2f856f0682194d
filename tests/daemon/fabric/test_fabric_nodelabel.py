"""The Node writer against the strict fake API server: its own Node only, the two keys only,
a write only when a value changes, spaced, retried, and a failure said once."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rdma_hca.contract.fabric import (
    FABRIC_BLOCK_LABEL,
    MAX_NEIGHBOURS_ANNOTATION,
    NEIGHBOURS_ANNOTATION,
    PortNeighbour,
    decode_neighbours,
    fabric_block,
    with_silent,
)
from rdma_hca.daemon.fabric.nodelabel import NodeFabricWriter, desired_values
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.kit.broadcast import Broadcast
from rdma_hca.kube.client import ApiClient
from rdma_hca.kube.credentials import load_credentials
from rdma_hca.kube.policy import ClientPolicy

NODE = "gpu-a1"


def rails(*switches: str) -> tuple[PortNeighbour, ...]:
    """HCA i cabled to ``switches[i]``, port Ethernet1/<i+1>."""
    return tuple(PortNeighbour(f"mlx5_{i}", 1, f"eth{i}", f"b8:ce:f6:00:00:{i:02x}",
                               f"Ethernet1/{i + 1}", system_name=s)
                 for i, s in enumerate(switches))


class Sleeps:
    """An injected sleep: records what was asked; ``gate`` (when set up) holds it."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node(NODE)
        server.add_node("gpu-a2")
        with server.store.lock:
            for n in server.cluster.nodes:
                n["metadata"]["labels"] = {"kubernetes.io/hostname": n["metadata"]["name"]}
                n["metadata"]["annotations"] = {"node.alpha.kubernetes.io/ttl": "0"}
                n["status"] = {"capacity": {"rdma/hca": "1k"}}
        yield server


@pytest.fixture
async def client(api: FakeApiServer, tmp_path: Path) -> AsyncIterator[ApiClient]:
    creds = load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")),
                             context=None, env={}, home=tmp_path)
    c = ApiClient(creds, ClientPolicy(timeout=5.0, backoff_first=0.01, backoff_max=0.02))
    yield c
    await c.close()


@pytest.fixture
async def running(client: ApiClient) -> AsyncIterator[tuple[NodeFabricWriter, Sleeps]]:
    sleeps = Sleeps()
    writer = NodeFabricWriter(client, NODE, sleep=sleeps)
    writer.start()
    yield writer, sleeps
    await writer.stop()


async def written(writer: NodeFabricWriter) -> None:
    writer.written.clear()
    await asyncio.wait_for(writer.written.wait(), 10)


def patches(api: FakeApiServer) -> list[str]:
    return [r.path for r in api.requests if r.method == "PATCH"]


async def test_the_label_and_annotation_land_on_its_own_node_only(
        api: FakeApiServer, running: tuple[NodeFabricWriter, Sleeps]) -> None:
    writer, _ = running
    ports = rails("leaf-1", "leaf-2")
    writer.update(ports)
    await written(writer)
    node = api.node(NODE)
    assert node["metadata"]["labels"] == {"kubernetes.io/hostname": NODE,
                                          FABRIC_BLOCK_LABEL: fabric_block(["leaf-1", "leaf-2"])}
    assert decode_neighbours(node["metadata"]["annotations"][NEIGHBOURS_ANNOTATION]) == ports
    assert node["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] == "0"
    assert node["status"] == {"capacity": {"rdma/hca": "1k"}}
    other = api.node("gpu-a2")["metadata"]
    assert FABRIC_BLOCK_LABEL not in other["labels"]
    assert NEIGHBOURS_ANNOTATION not in other["annotations"]
    assert patches(api) == [f"/api/v1/nodes/{NODE}"]
    assert writer.stats.writes == 1 and writer.stats.reads == 1


async def test_the_same_neighbours_again_cost_no_request(
        api: FakeApiServer, running: tuple[NodeFabricWriter, Sleeps]) -> None:
    writer, _ = running
    writer.update(rails("leaf-1", "leaf-2"))
    await written(writer)
    before = len(api.requests)
    for _ in range(5):  # a frame every 30 s that says the same
        writer.update(rails("leaf-1", "leaf-2"))
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)
    assert len(api.requests) == before
    assert writer.stats.writes == 1


async def test_a_port_description_change_writes_the_annotation_not_the_label(
        api: FakeApiServer, running: tuple[NodeFabricWriter, Sleeps]) -> None:
    writer, _ = running
    writer.update(rails("leaf-1", "leaf-2"))
    await written(writer)
    block = api.node(NODE)["metadata"]["labels"][FABRIC_BLOCK_LABEL]
    moved = (rails("leaf-1", "leaf-2")[0],
             PortNeighbour("mlx5_1", 1, "eth1", "b8:ce:f6:00:00:01", "Ethernet1/9",
                           system_name="leaf-2"))
    writer.update(moved)
    await written(writer)
    meta = api.node(NODE)["metadata"]
    assert meta["labels"][FABRIC_BLOCK_LABEL] == block
    assert decode_neighbours(meta["annotations"][NEIGHBOURS_ANNOTATION]) == moved
    assert writer.stats.writes == 2


async def test_no_neighbour_left_removes_both(
        api: FakeApiServer, running: tuple[NodeFabricWriter, Sleeps]) -> None:
    writer, _ = running
    writer.update(rails("leaf-1"))
    await written(writer)
    writer.update(())
    await written(writer)
    meta = api.node(NODE)["metadata"]
    assert FABRIC_BLOCK_LABEL not in meta["labels"]
    assert NEIGHBOURS_ANNOTATION not in meta["annotations"]
    assert meta["labels"]["kubernetes.io/hostname"] == NODE


async def test_silent_ports_are_in_the_annotation_but_name_no_block(
        api: FakeApiServer, running: tuple[NodeFabricWriter, Sleeps]) -> None:
    writer, _ = running
    heard = rails("leaf-1")
    writer.update(with_silent(heard, [("mlx5_0", 1, "eth0"), ("mlx5_1", 1, "eth1")]))
    await written(writer)
    meta = api.node(NODE)["metadata"]
    assert meta["labels"][FABRIC_BLOCK_LABEL] == fabric_block(["leaf-1"])
    found = decode_neighbours(meta["annotations"][NEIGHBOURS_ANNOTATION])
    assert [(n.hca, n.heard) for n in found] == [("mlx5_0", True), ("mlx5_1", False)]


async def test_only_silent_ports_remove_the_label_but_keep_the_annotation(
        api: FakeApiServer, client: ApiClient) -> None:
    writer = NodeFabricWriter(client, NODE, start_grace=0)
    writer.start()
    try:
        writer.update(with_silent((), [("mlx5_0", 1, "eth0")]))
        await written(writer)
    finally:
        await writer.stop()
    meta = api.node(NODE)["metadata"]
    assert FABRIC_BLOCK_LABEL not in meta["labels"]
    assert json.loads(meta["annotations"][NEIGHBOURS_ANNOTATION]) == {"mlx5_0/1": {
        "chassisID": "", "netdev": "eth0", "portDescription": "", "portID": "",
        "systemName": ""}}


async def test_a_start_that_has_heard_nothing_yet_removes_nothing(
        api: FakeApiServer, running: tuple[NodeFabricWriter, Sleeps]) -> None:
    writer, _ = running
    with api.store.lock:
        meta = api.cluster.nodes[0]["metadata"]
        meta["labels"][FABRIC_BLOCK_LABEL] = fabric_block(["leaf-1"])
        meta["annotations"][NEIGHBOURS_ANNOTATION] = desired_values(rails("leaf-1")).neighbours
    writer.update(())  # the listener's first value: nothing heard in the first seconds
    await asyncio.sleep(0.05)
    assert patches(api) == []
    writer.update(rails("leaf-1"))  # the switch's first frame: what the Node holds already
    await written(writer)
    assert patches(api) == []
    assert api.node(NODE)["metadata"]["labels"][FABRIC_BLOCK_LABEL] == fabric_block(["leaf-1"])


async def test_silent_ports_alone_at_start_remove_nothing_either(
        api: FakeApiServer, running: tuple[NodeFabricWriter, Sleeps]) -> None:
    """The daemon's first value lists every listened port as silent: a restart keeps the
    label until a switch speaks (or the grace ends)."""
    writer, _ = running
    with api.store.lock:
        api.cluster.nodes[0]["metadata"]["labels"][FABRIC_BLOCK_LABEL] = fabric_block(["leaf-1"])
    writer.update(with_silent((), [("mlx5_0", 1, "eth0"), ("mlx5_1", 1, "eth1")]))
    await asyncio.sleep(0.05)
    assert patches(api) == []
    writer.update(with_silent(rails("leaf-1"), [("mlx5_0", 1, "eth0"), ("mlx5_1", 1, "eth1")]))
    await written(writer)
    meta = api.node(NODE)["metadata"]
    assert meta["labels"][FABRIC_BLOCK_LABEL] == fabric_block(["leaf-1"])
    assert [n.heard for n in decode_neighbours(meta["annotations"][NEIGHBOURS_ANNOTATION])] \
        == [True, False]


async def test_an_empty_set_is_written_once_the_grace_is_over(
        api: FakeApiServer, client: ApiClient) -> None:
    with api.store.lock:
        api.cluster.nodes[0]["metadata"]["labels"] = {FABRIC_BLOCK_LABEL: "fb-0123456789"}
    writer = NodeFabricWriter(client, NODE, start_grace=0)
    writer.start()
    try:
        writer.update(())
        await written(writer)
    finally:
        await writer.stop()
    assert "labels" not in api.node(NODE)["metadata"]


async def test_changes_under_churn_are_spaced_and_only_the_last_goes_out(
        api: FakeApiServer, running: tuple[NodeFabricWriter, Sleeps]) -> None:
    writer, sleeps = running
    writer.update(rails("leaf-1", "leaf-2"))
    await written(writer)
    sleeps.gate = asyncio.Event()
    writer.update(rails("leaf-1", "leaf-3"))
    await asyncio.wait_for(sleeps.entered.wait(), 5)
    assert sleeps.asked and 4.0 < sleeps.asked[-1] <= writer.spacing
    writer.update(rails("leaf-1", "leaf-4"))
    writer.update(rails("leaf-1", "leaf-5"))
    sleeps.gate.set()
    await written(writer)
    assert len(patches(api)) == 2
    assert api.node(NODE)["metadata"]["labels"][FABRIC_BLOCK_LABEL] == \
        fabric_block(["leaf-1", "leaf-5"])


async def test_a_server_error_is_said_once_counted_and_retried(
        api: FakeApiServer, running: tuple[NodeFabricWriter, Sleeps],
        caplog: pytest.LogCaptureFixture) -> None:
    writer, sleeps = running
    api.fail(500, times=3, method="PATCH", path=f"/api/v1/nodes/{NODE}")
    with caplog.at_level(logging.WARNING, "rdma_hca.daemon.fabric.nodelabel"):
        writer.update(rails("leaf-1"))
        await written(writer)
    assert writer.stats.errors == 3 and writer.stats.error is None
    assert writer.stats.writes == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "HTTP 500" in warnings[0].getMessage()
    assert len(sleeps.asked) == 3  # the writer's own backoff, one wait per failure
    assert api.node(NODE)["metadata"]["labels"][FABRIC_BLOCK_LABEL] == fabric_block(["leaf-1"])


async def test_429_with_retry_after_is_waited_out(
        api: FakeApiServer, tmp_path: Path) -> None:
    creds = load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")),
                             context=None, env={}, home=tmp_path)
    # A client that gives up at once: what the server asked reaches the writer.
    client = ApiClient(creds, ClientPolicy(timeout=5.0, max_retries=0))
    sleeps = Sleeps()
    writer = NodeFabricWriter(client, NODE, sleep=sleeps)
    api.fail(429, retry_after="7", method="PATCH")
    writer.start()
    try:
        writer.update(rails("leaf-1"))
        await written(writer)
    finally:
        await writer.stop()
        await client.close()
    assert writer.stats.errors == 1 and writer.stats.writes == 1
    assert sleeps.asked == [7.0]


async def test_forbidden_says_which_permission(
        api: FakeApiServer, running: tuple[NodeFabricWriter, Sleeps],
        caplog: pytest.LogCaptureFixture) -> None:
    writer, _ = running
    api.cluster.forbidden.add("nodes")
    with caplog.at_level(logging.WARNING, "rdma_hca.daemon.fabric.nodelabel"):
        writer.update(rails("leaf-1"))
        while writer.stats.errors < 2:
            await asyncio.sleep(0.01)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "get and patch on nodes" in said[0]
    api.cluster.forbidden.clear()
    await written(writer)
    assert writer.stats.error is None


async def test_a_label_removed_by_someone_else_comes_back_at_the_resync(
        api: FakeApiServer, client: ApiClient) -> None:
    writer = NodeFabricWriter(client, NODE, resync=0.05, spacing=0)
    writer.start()
    try:
        writer.update(rails("leaf-1"))
        await written(writer)
        with api.store.lock:
            del api.cluster.nodes[0]["metadata"]["labels"][FABRIC_BLOCK_LABEL]
        while writer.stats.writes < 2:
            await asyncio.sleep(0.02)
    finally:
        await writer.stop()
    assert writer.stats.reads >= 2
    assert api.node(NODE)["metadata"]["labels"][FABRIC_BLOCK_LABEL] == fabric_block(["leaf-1"])


async def test_follow_takes_the_broadcasts_values(
        api: FakeApiServer, client: ApiClient) -> None:
    table: Broadcast[tuple[PortNeighbour, ...]] = Broadcast(rails("leaf-1"))
    writer = NodeFabricWriter(client, NODE, spacing=0)
    writer.start(table)
    try:
        await written(writer)
        table.publish(rails("leaf-1", "leaf-2"))
        while writer.stats.writes < 2:
            await asyncio.sleep(0.01)
    finally:
        await writer.stop()
    assert api.node(NODE)["metadata"]["labels"][FABRIC_BLOCK_LABEL] == \
        fabric_block(["leaf-1", "leaf-2"])


async def test_more_ports_than_the_annotation_holds_are_cut_and_said_once(
        api: FakeApiServer, running: tuple[NodeFabricWriter, Sleeps],
        caplog: pytest.LogCaptureFixture) -> None:
    writer, _ = running
    many = tuple(PortNeighbour(f"mlx5_{i:03d}", 1, f"eth{i}", "c" * 60, "p" * 60,
                               system_name=f"leaf-{i}") for i in range(200))
    with caplog.at_level(logging.WARNING, "rdma_hca.daemon.fabric.nodelabel"):
        writer.update(many)
        await written(writer)
    text = api.node(NODE)["metadata"]["annotations"][NEIGHBOURS_ANNOTATION]
    kept = decode_neighbours(text)
    assert len(text) <= MAX_NEIGHBOURS_ANNOTATION and 0 < len(kept) < len(many)
    assert kept == many[:len(kept)]
    assert api.node(NODE)["metadata"]["labels"][FABRIC_BLOCK_LABEL] == \
        fabric_block(n.switch for n in many)
    assert [r.getMessage() for r in caplog.records if "left out" in r.getMessage()] == [
        f"Node {NODE}: 200 ports' neighbours exceed the annotation's "
        f"{MAX_NEIGHBOURS_ANNOTATION} bytes: the last ones are left out of "
        f"{NEIGHBOURS_ANNOTATION}"]


def test_the_writer_needs_the_node_name(client: ApiClient) -> None:
    with pytest.raises(ValueError, match="NODE_NAME"):
        NodeFabricWriter(client, "")


class _GarbledOnce(ApiClient):
    """The real client, but its first read of the Node answers what no Node looks like."""

    garbled = 0

    async def get(self, path: str, params: object = None, **kw: object) -> dict[str, object]:
        if self.garbled == 0:
            self.garbled += 1
            return {"metadata": ["not", "a", "map"]}
        return await super().get(path, **kw)  # type: ignore[arg-type]


async def test_an_answer_that_cannot_be_read_is_said_and_retried_not_the_daemons_end(
        api: FakeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    creds = load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")),
                             context=None, env={}, home=tmp_path)
    client = _GarbledOnce(creds, ClientPolicy(timeout=5.0))
    sleeps = Sleeps()
    writer = NodeFabricWriter(client, NODE, sleep=sleeps)
    writer.start()
    try:
        with caplog.at_level(logging.WARNING, "rdma_hca.daemon.fabric.nodelabel"):
            writer.update(rails("leaf-1"))
            await written(writer)
    finally:
        await writer.stop()
        await client.close()
    assert client.garbled == 1
    assert writer.stats.errors == 1 and writer.stats.writes == 1 and writer.stats.error is None
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "could not be used (AttributeError" in said[0]
    assert len(sleeps.asked) == 1
    assert api.node(NODE)["metadata"]["labels"][FABRIC_BLOCK_LABEL] == fabric_block(["leaf-1"])
