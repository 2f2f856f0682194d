"""The daemon labels its own Node from what its ports hear: the device plugin front end
alone, frames fed through socket pairs (the recorded-frame path), the strict fake API
server holding the Node. Without NODE_NAME or credentials one line says the label is off
and the rest runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lldp_support import SWITCH_A, SWITCH_B, Wires, hca, inventory

from rdma_hca.contract.fabric import (
    FABRIC_BLOCK_LABEL,
    NEIGHBOURS_ANNOTATION,
    PortNeighbour,
    decode_neighbours,
    fabric_block,
)
from rdma_hca.daemon.fabric.listener import LldpListener
from rdma_hca.daemon.observe.metrics import render
from rdma_hca.daemon.wiring import Daemon, follow_neighbours
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.node.lldp import build_frame
from rdma_hca.settings.model import FabricConfig, Settings

NODE = "gpu-node-1"
SWITCH_C = bytes.fromhex("0c42a1000003")
FAST = {"spacing": 0.01, "start_grace": 0.1}  # the writer's waits, short for tests


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node(NODE)
        server.add_node("gpu-node-2")
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kc")))
        yield server


def _settings(node: SimNode, plugin_dir: Path, node_name: str = NODE) -> Settings:
    return Settings(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                    kubelet_dir=str(plugin_dir), metrics_address="", health_poll_seconds=0.05,
                    node_name=node_name, fabric=FabricConfig(lldp=True))


def _fabric(api: FakeApiServer, name: str = NODE) -> tuple[str | None, dict[str, PortNeighbour]]:
    meta: dict[str, Any] = api.node(name)["metadata"]
    block = (meta.get("labels") or {}).get(FABRIC_BLOCK_LABEL)
    text = (meta.get("annotations") or {}).get(NEIGHBOURS_ANNOTATION)
    ports = {} if text is None else {f"{n.hca}/{n.port}": n for n in decode_neighbours(text)}
    return block, ports


def _node_writes(daemon: Daemon) -> int:
    status = daemon.status().lldp
    return 0 if status is None or status.node_writes is None else status.node_writes


async def test_the_node_carries_its_block_and_neighbours_and_follows_a_switch_change(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        api: FakeApiServer) -> None:
    daemon = Daemon(_settings(node, plugin_dir), netlink=False, node_writer=FAST)
    assert daemon.lldp is not None and daemon.dra is None
    wires = Wires()
    daemon.lldp.opener = wires
    try:
        await daemon.start()
        assert daemon.node_writer is not None
        wires.send("eth0", build_frame(SWITCH_A, "Ethernet1/1", system_name="leaf-1"))
        wires.send("eth1", build_frame(SWITCH_B, "Ethernet1/2", system_name="leaf-2"))
        block = fabric_block(["leaf-1", "leaf-2"])
        assert await wait_until(lambda: _fabric(api)[0] == block, 10)
        _, ports = _fabric(api)
        assert (ports["mlx5_0/1"].switch, ports["mlx5_0/1"].switch_port) == \
            ("leaf-1", "Ethernet1/1")
        assert ports["mlx5_1/1"].switch == "leaf-2"
        # A port listened on that heard nothing: in the annotation, with no switch.
        silent = ports["mlx5_2/1"]
        assert not silent.heard and silent.netdev == "eth2"
        inv = daemon.inventory
        assert inv is not None  # every RoCE port listened on is in it, a bond's too
        assert set(ports) == {f"{h.name}/{p.number}" for h in inv.hcas for p in h.ports}

        # mlx5_1's cable moved to another leaf: the label and the annotation follow.
        wires.send("eth1", build_frame(SWITCH_C, "Ethernet1/2", system_name="leaf-3"))
        moved = fabric_block(["leaf-1", "leaf-3"])
        assert await wait_until(lambda: _fabric(api)[0] == moved, 10)
        assert _fabric(api)[1]["mlx5_1/1"].switch == "leaf-3"

        # The server holds the write before the writer has its answer and counts it.
        assert await wait_until(lambda: _node_writes(daemon) >= 2, 10)
        status = daemon.status().lldp
        assert status is not None and status.node_writes is not None
        assert status.node_writes >= 2 and status.node_write_errors == 0
        text = render(daemon.status()).decode()
        assert f"rdma_hca_fabric_node_writes_total {float(status.node_writes)}" in text
        assert "rdma_hca_fabric_node_write_errors_total 0.0" in text
    finally:
        await daemon.stop()
        wires.close()
    # Its own Node only, and through merge patches of the two keys.
    assert _fabric(api, "gpu-node-2") == (None, {})
    assert {(r.method, r.path) for r in api.requests} <= {
        ("GET", f"/api/v1/nodes/{NODE}"), ("PATCH", f"/api/v1/nodes/{NODE}")}


@pytest.mark.parametrize("missing", ["credentials", "NODE_NAME"])
async def test_without_credentials_or_node_name_the_label_is_off_and_the_rest_runs(
        missing: str, node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config either
    name = "" if missing == "NODE_NAME" else NODE
    daemon = Daemon(_settings(node, plugin_dir, node_name=name), netlink=False,
                    node_writer=FAST)
    assert daemon.lldp is not None
    wires = Wires()
    daemon.lldp.opener = wires
    try:
        with caplog.at_level(logging.WARNING, "rdma_hca.daemon.fabric.nodelabel"):
            await daemon.start()
        assert daemon.node_writer is None
        said = [r.getMessage() for r in caplog.records
                if r.name == "rdma_hca.daemon.fabric.nodelabel"]
        assert len(said) == 1
        assert said[0].startswith(f"the Node label {FABRIC_BLOCK_LABEL} is off: ")
        assert ("NODE_NAME" if missing == "NODE_NAME" else "no usable API server credentials") \
            in said[0]
        # LLDP, /metrics and the device plugin run as without the label.
        wires.send("eth0", build_frame(SWITCH_A, "Ethernet1/1", system_name="leaf-1"))
        assert await wait_until(lambda: bool(daemon.lldp and daemon.lldp.neighbours.value), 5)
        # Registration with the kubelet goes on after start() returns: wait for it.
        assert await wait_until(daemon.ready, 10) and not daemon.failed
        status = daemon.status().lldp
        assert status is not None and status.node_writes is None
        text = render(daemon.status()).decode()
        assert 'switch="leaf-1"' in text and "rdma_hca_fabric_node_writes" not in text
    finally:
        await daemon.stop()
        wires.close()


class _Slices:
    """What the DRA driver's switch attributes are handed."""

    def __init__(self) -> None:
        self.given: list[tuple[PortNeighbour, ...]] = []

    async def update_neighbours(self, neighbours: tuple[PortNeighbour, ...]) -> None:
        self.given.append(neighbours)


async def test_the_dra_attributes_are_never_handed_a_silent_port() -> None:
    """mlx5_0 port 1 hears nothing, port 2 hears leaf-1: the annotation lists both, the
    DRA driver gets the heard one only (its HCA's switch is then port 2's)."""
    lldp = LldpListener("/nonexistent", hold_seconds=0.0, files=OffLoop(1.0))
    wires = Wires()
    lldp.opener = wires
    slices = _Slices()
    try:
        await lldp.follow(inventory(hca("mlx5_0", "eth0", "eth1")))
        assert [n.heard for n in lldp.every_port.value] == [False, False]
        task = asyncio.ensure_future(follow_neighbours(lldp, slices))  # type: ignore[arg-type]
        lldp.receive("eth1", build_frame(SWITCH_A, "Ethernet1/1", system_name="leaf-1"))
        assert await wait_until(lambda: bool(slices.given and slices.given[-1]), 5)
        assert [(n.port, n.switch) for n in slices.given[-1]] == [(2, "leaf-1")]
        assert all(n.heard for given in slices.given for n in given)
        assert [(n.port, n.heard) for n in lldp.every_port.value] == [(1, False), (2, True)]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        lldp.close()
        wires.close()
