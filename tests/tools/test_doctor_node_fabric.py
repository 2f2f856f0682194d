"""``rdma-hca doctor --node`` shows each RoCE port's LLDP neighbour, read from this node's
Node (the daemon's annotation) on the fake API server, over a simulated sysfs."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.contract.fabric import (
    FABRIC_BLOCK_LABEL,
    NEIGHBOURS_ANNOTATION,
    PortNeighbour,
    encode_neighbours,
    fabric_block,
    with_silent,
)
from rdma_hca.devkit.kube.apiserver import serve, write_kubeconfig
from rdma_hca.devkit.kube.cluster import FakeCluster
from rdma_hca.devkit.kube.objects import node
from rdma_hca.devkit.sim.nodes import gpu_node, infiniband_node
from rdma_hca.node.inventory import discover_node
from rdma_hca.tools.doctor import main
from rdma_hca.tools.doctor.nodefabric import (
    Listening,
    NodeFabric,
    fabric_checks,
    listening_checks,
    net_raw_held,
)

NAME = "gpu-a1"
HEARD = PortNeighbour("mlx5_0", 1, "eth0", "0c:42:a1:00:00:01", "Ethernet1/1",
                      system_name="su1-leaf-1", port_description="to gpu-a1 rail 0")


def published(*ports: PortNeighbour, listened: int = 2) -> dict[str, Any]:
    entries = with_silent(ports, [(f"mlx5_{i}", 1, f"eth{i}") for i in range(listened)])
    obj = node(NAME, labels={FABRIC_BLOCK_LABEL: fabric_block(p.switch for p in ports)})
    obj["metadata"]["annotations"] = {NEIGHBOURS_ANNOTATION: encode_neighbours(entries)}
    return obj


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    return gpu_node(tmp_path / "n", hcas=3, bond=False, gid_table_size=8).sysfs_root


def node_doctor(tmp_path: Path, sysfs: Path, cluster: FakeCluster | None,
                env: dict[str, str], *flags: str) -> str:
    argv = ["--node", *flags, "--sysfs-root", str(sysfs), "--dev-root", str(tmp_path / "dev"),
            "--kubelet-dir", str(tmp_path / "dp"), "--readyz-url", "http://127.0.0.1:9/readyz",
            "--timeout", "5"]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        if cluster is None:
            main(argv, env=env)
        else:
            with serve(cluster) as url:
                kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
                main([*argv, "--kubeconfig", str(kubeconfig)], env=env)
    return buffer.getvalue()


@pytest.fixture
def fleet() -> Iterator[FakeCluster]:
    yield FakeCluster(nodes=[published(HEARD), node("gpu-a2")])


def test_each_roce_port_shows_its_neighbour(tmp_path: Path, sysfs: Path,
                                           fleet: FakeCluster) -> None:
    out = node_doctor(tmp_path, sysfs, fleet, {"NODE_NAME": NAME})
    assert (f"✓ fabric block: {FABRIC_BLOCK_LABEL}={fabric_block(['su1-leaf-1'])}") in out
    assert ("✓ HCA mlx5_0 port 1 neighbour: switch su1-leaf-1 port Ethernet1/1 (chassis "
            "0c:42:a1:00:00:01, \"to gpu-a1 rail 0\", heard on eth0)") in out
    assert "✗ HCA mlx5_1 port 1 neighbour: listened on eth1, heard no LLDP" in out
    assert "firmware may run its own LLDP agent" in out
    assert "✓ HCA mlx5_2 port 1 neighbour: not listened on" in out
    # Only its own Node is read.
    assert [r.path for r in fleet.requests] == [f"/api/v1/nodes/{NAME}"]


def test_a_node_without_the_annotation_says_what_is_off(tmp_path: Path, sysfs: Path) -> None:
    out = node_doctor(tmp_path, sysfs, FakeCluster(nodes=[node(NAME)]), {"NODE_NAME": NAME})
    assert (f"✓ fabric (LLDP): off: Node {NAME} carries no {NEIGHBOURS_ANNOTATION} "
            "(fabric.lldp is false, the default") in out
    assert "neighbour:" not in out


def test_outside_the_pod_nothing_is_read(tmp_path: Path, sysfs: Path) -> None:
    out = node_doctor(tmp_path, sysfs, None, {"NODE_NAME": NAME})
    assert ("✓ fabric (LLDP): not checked: cannot read Node gpu-a1 (not in the daemon's pod "
            "and no --kubeconfig given)") in out
    assert "fabric (LLDP):" not in node_doctor(tmp_path, sysfs, None, {})  # no Node read


def test_a_node_that_cannot_be_read_is_not_a_failure(tmp_path: Path, sysfs: Path) -> None:
    cluster = FakeCluster(nodes=[node(NAME)], forbidden={"nodes"})
    out = node_doctor(tmp_path, sysfs, cluster, {"NODE_NAME": NAME})
    assert "✓ fabric (LLDP): not checked: cannot read Node gpu-a1 (" in out
    assert "403" in out


def test_infiniband_ports_are_out_of_scope(tmp_path: Path) -> None:
    ib = infiniband_node(tmp_path / "ib")
    hcas = discover_node(ib.sysfs_root, ib.dev_root).hcas
    view = NodeFabric(NAME, published(listened=0))
    checks = fabric_checks(hcas, view)
    assert [c.name for c in checks] == ["fabric block"]
    assert checks[0].detail == f"no {FABRIC_BLOCK_LABEL} label: no port hears a switch"


def test_a_broken_annotation_fails_with_the_fix(tmp_path: Path, sysfs: Path) -> None:
    bad = node(NAME)
    bad["metadata"]["annotations"] = {NEIGHBOURS_ANNOTATION: "[]"}
    checks = fabric_checks(discover_node(sysfs, tmp_path / "dev").hcas, NodeFabric(NAME, bad))
    assert [(c.ok, c.detail) for c in checks] == [
        (False, f"{NEIGHBOURS_ANNOTATION} is not a JSON object")]
    assert checks[0].fix is not None and f"{NEIGHBOURS_ANNOTATION}-" in checks[0].fix


# --- what the daemon here can do: fabric.lldp, CAP_NET_RAW, NODE_NAME -------------------


def test_fabric_lldp_off_is_said(tmp_path: Path, sysfs: Path) -> None:
    out = node_doctor(tmp_path, sysfs, None, {})
    assert "✓ LLDP listening: off: fabric.lldp is false (the default)" in out
    assert "fabric.lldp: true" in out


def test_fabric_lldp_on_outside_a_pod_leaves_the_capability_unjudged(
        tmp_path: Path, sysfs: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("fabric:\n  lldp: true\n")
    out = node_doctor(tmp_path, sysfs, None, {}, "--config", str(config))
    assert ("✓ LLDP listening: on (fabric.lldp is true); CAP_NET_RAW not checked: run "
            "doctor --node in the daemon's pod") in out
    assert "fabric block label" not in out  # NODE_NAME is judged in a pod only


def _status(tmp_path: Path, cap_eff: str) -> Path:
    path = tmp_path / "status"
    path.write_text(f"Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff}\n")
    return path


def test_the_capability_is_read_from_the_effective_set(tmp_path: Path) -> None:
    assert net_raw_held(_status(tmp_path, "00000000a80425fb")) is True  # docker's default
    assert net_raw_held(_status(tmp_path, "0000000000000000")) is False  # drop: ALL
    assert net_raw_held(_status(tmp_path, "0000000000002000")) is True  # NET_RAW alone
    assert net_raw_held(_status(tmp_path, "zz")) is None
    assert net_raw_held(tmp_path / "missing") is None


def test_fabric_lldp_on_without_the_capability_fails_with_the_fix() -> None:
    checks = listening_checks(Listening(True, False, NAME))
    assert [(c.name, c.ok) for c in checks] == [("LLDP listening", False)]
    assert "lacks CAP_NET_RAW" in checks[0].detail
    assert checks[0].fix is not None and "capabilities.add" in checks[0].fix


def test_fabric_lldp_on_without_node_name_says_the_label_is_off() -> None:
    checks = listening_checks(Listening(True, True, ""))
    assert [(c.name, c.ok) for c in checks] == [("LLDP listening", True),
                                                ("fabric block label", False)]
    assert checks[0].detail == "on: fabric.lldp is true and the container holds CAP_NET_RAW"
    assert "NODE_NAME is not set" in checks[1].detail
    assert checks[1].fix is not None and "spec.nodeName" in checks[1].fix
