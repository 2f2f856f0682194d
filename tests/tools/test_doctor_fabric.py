"""``rdma-hca doctor --cluster`` on the fabric: what the daemons published on their Nodes
(the fabric block label, the neighbours annotation), judged fleet-wide, against the fake
API server; and the judging itself on hand-made neighbour lists."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
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
from rdma_hca.devkit.kube.objects import CREATED, daemonset, node, pod
from rdma_hca.tools.doctor import main
from rdma_hca.tools.doctor.fabric import (
    OFF_IN_DAEMONSET,
    OFF_NOTE,
    ON_UNPUBLISHED,
    FabricNode,
    evaluate,
)
from rdma_hca.tools.doctor.workloads import parse_daemonset

NOW = dt.datetime.fromisoformat(CREATED.replace("Z", "+00:00")) + dt.timedelta(hours=17)
SU1 = ("su1-leaf-1", "su1-leaf-2", "su1-leaf-3", "su1-leaf-4")
SU2 = ("su2-leaf-1", "su2-leaf-2", "su2-leaf-3", "su2-leaf-4")


def cabled(switches: Sequence[str], *, silent: Sequence[int] = ()) -> tuple[PortNeighbour, ...]:
    """HCA i (mlx5_i, port 1, eth i) cabled to ``switches[i]``; ``silent`` hear nothing."""
    heard = [PortNeighbour(f"mlx5_{i}", 1, f"eth{i}", f"0c:42:a1:00:{i:02x}:01",
                           f"Ethernet1/{i + 1}", system_name=s)
             for i, s in enumerate(switches) if i not in silent]
    return with_silent(heard, [(f"mlx5_{i}", 1, f"eth{i}") for i in range(len(switches))])


def published(name: str, ports: tuple[PortNeighbour, ...]) -> dict[str, Any]:
    """A Node as the daemon leaves it: the block label and the neighbours annotation."""
    block = fabric_block(p.switch for p in ports if p.heard)
    obj = node(name, labels={FABRIC_BLOCK_LABEL: block} if block else None)
    obj["metadata"]["annotations"] = {NEIGHBOURS_ANNOTATION: encode_neighbours(ports),
                                      "node.alpha.kubernetes.io/ttl": "0"}
    return obj


def fleet(nodes: list[dict[str, Any]]) -> FakeCluster:
    names = [n["metadata"]["name"] for n in nodes]
    return FakeCluster(
        nodes=nodes,
        daemonsets={("kube-system", "ack-rdma-dp-ds"): daemonset(desired=len(nodes),
                                                                 ready=len(nodes))},
        pods=[pod(f"ack-rdma-dp-ds-{i:05d}", n) for i, n in enumerate(names)])


def doctor(cluster: FakeCluster, tmp_path: Path, *extra: str) -> int:
    with serve(cluster) as url:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
        return main(["--cluster", "--kubeconfig", str(kubeconfig), *extra], env={},
                    home=tmp_path / "home", now=NOW)


@pytest.fixture
def swapped() -> Iterator[FakeCluster]:
    """Six nodes of one scalable unit; on gpu-a4, the cables of mlx5_1 and mlx5_2 are
    crossed (each reaches the other's leaf)."""
    nodes = [published(f"gpu-a{i}", cabled(SU1)) for i in range(1, 7)]
    crossed = (SU1[0], SU1[2], SU1[1], SU1[3])
    nodes[3] = published("gpu-a4", cabled(crossed))
    yield fleet(nodes)


def test_a_node_whose_two_cables_are_swapped_is_named_with_both_ports(
        swapped: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = doctor(swapped, tmp_path)
    out = capsys.readouterr().out
    assert status == 1, out
    assert ("✗ node gpu-a4: cable of mlx5_1 port 1: reaches switch su1-leaf-3, but mlx5_1 "
            "port 1 of 5 of 6 nodes reaches su1-leaf-2: a crossed or misplugged cable") in out
    assert ("✗ node gpu-a4: cable of mlx5_2 port 1: reaches switch su1-leaf-2, but mlx5_2 "
            "port 1 of 5 of 6 nodes reaches su1-leaf-3") in out
    assert "how to fix: check the cables of that node" in out
    # The swap keeps the node's switches: one block, which is not ok.
    block = fabric_block(SU1)
    assert [line.split() for line in out.splitlines() if line.startswith(block)] == [
        [block, "6", ",".join(SU1), "✗"]]
    assert "gpu-a1: cable" not in out and "split" not in out


def test_the_json_names_the_miscabled_ports(
        swapped: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor(swapped, tmp_path, "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["fabric"]["miscabled"] == [
        {"node": "gpu-a4", "hca": "mlx5_1", "port": 1, "seen": "su1-leaf-3",
         "expected": "su1-leaf-2", "agreeing": 5, "of": 6},
        {"node": "gpu-a4", "hca": "mlx5_2", "port": 1, "seen": "su1-leaf-2",
         "expected": "su1-leaf-3", "agreeing": 5, "of": 6}]
    assert doc["fabric"]["note"] is None and doc["fabric"]["silentPorts"] == []


def test_a_good_fleet_of_two_units_passes(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [published(f"gpu-a{i}", cabled(SU1)) for i in range(1, 4)] + \
        [published(f"gpu-b{i}", cabled(SU2)) for i in range(1, 4)]
    assert doctor(fleet(nodes), tmp_path) == 0
    out = capsys.readouterr().out
    assert ("✓ fabric (LLDP): 6 nodes in 2 fabric blocks, every listened port hears a "
            "switch, no crossed cable, no split block") in out
    rows = [line.split() for line in out.splitlines() if line.startswith("fb-")]
    assert sorted(rows) == sorted([[fabric_block(SU1), "3", ",".join(SU1), "✓"],
                                   [fabric_block(SU2), "3", ",".join(SU2), "✓"]])


def test_a_silent_port_and_the_split_it_makes_are_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [published(f"gpu-a{i}", cabled(SU1)) for i in range(1, 5)]
    nodes.append(published("gpu-a5", cabled(SU1, silent=[3])))
    assert doctor(fleet(nodes), tmp_path) == 1
    out = capsys.readouterr().out
    assert "✗ node gpu-a5: LLDP neighbours: ports that heard no LLDP: mlx5_3 port 1 (eth3)" \
        in out
    assert "firmware may run its own LLDP agent" in out
    small = fabric_block(SU1[:3])
    assert (f"fabric blocks {min(small, fabric_block(SU1))} and "
            f"{max(small, fabric_block(SU1))}: share the switches "
            f"{', '.join(SU1[:3])}: they look like one block split (block {small}: "
            "gpu-a5; block " + fabric_block(SU1) + ": 4 nodes)") in out


def test_a_cable_plugged_into_another_units_switch_is_found_across_blocks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [published(f"gpu-a{i}", cabled(SU1)) for i in range(1, 5)]
    nodes.append(published("gpu-a5", cabled((SU1[0], SU1[1], SU2[2], SU1[3]))))
    assert doctor(fleet(nodes), tmp_path) == 1
    out = capsys.readouterr().out
    assert ("✗ node gpu-a5: cable of mlx5_2 port 1: reaches switch su2-leaf-3, but mlx5_2 "
            "port 1 of 4 of 5 nodes reaches su1-leaf-3") in out
    assert "look like one block split" in out


def test_nothing_published_says_what_is_off_and_adds_no_check(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = fleet([node("e01-cn-a"), node("e01-cn-b")])
    assert doctor(cluster, tmp_path) == 0
    out = capsys.readouterr().out
    # The fake's DaemonSet adds no NET_RAW: off, as the chart's default renders it.
    assert f"- {OFF_IN_DAEMONSET}" in out
    assert "fabric.lldp is false" in out and "all 5 checks passed" in out


def test_on_in_the_daemonset_yet_nothing_published_says_where_to_look(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = fleet([node("e01-cn-a"), node("e01-cn-b")])
    ds = cluster.daemonsets[("kube-system", "ack-rdma-dp-ds")]
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {
        "capabilities": {"drop": ["ALL"], "add": ["NET_RAW"]}}
    assert doctor(cluster, tmp_path) == 0
    out = capsys.readouterr().out
    assert f"- {ON_UNPUBLISHED}" in out
    assert "doctor --node" in out


def test_the_daemonset_holds_net_raw_when_a_container_adds_it() -> None:
    ds = daemonset(desired=1, ready=1)
    assert parse_daemonset(ds).net_raw is False
    container = ds["spec"]["template"]["spec"]["containers"][0]
    for context, held in [({"capabilities": {"add": ["NET_RAW"]}}, True),
                          ({"capabilities": {"add": ["CAP_NET_RAW"]}}, True),
                          ({"capabilities": {"add": ["NET_ADMIN"]}}, False),
                          ({"privileged": True}, True),
                          ({"capabilities": "bad"}, False)]:
        container["securityContext"] = context
        assert parse_daemonset(ds).net_raw is held, context


def test_a_broken_annotation_is_named(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    bad = node("gpu-a1")
    bad["metadata"]["annotations"] = {NEIGHBOURS_ANNOTATION: "{not json"}
    assert doctor(fleet([bad]), tmp_path) == 1
    out = capsys.readouterr().out
    assert "✗ node gpu-a1: fabric neighbours: rdma-hca.io/fabric-neighbours is not JSON" in out
    assert f"kubectl annotate node gpu-a1 {NEIGHBOURS_ANNOTATION}-" in out


def test_cluster_and_node_together_are_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cluster", "--node"], env={}, home=tmp_path) == 2
    assert "--cluster and --node" in capsys.readouterr().err


# --- the judging on its own ------------------------------------------------------------------


def fnode(name: str, ports: tuple[PortNeighbour, ...]) -> FabricNode:
    return FabricNode(name, fabric_block(p.switch for p in ports if p.heard), ports)


def test_two_nodes_that_disagree_name_no_one() -> None:
    report = evaluate([fnode("a", cabled(("x", "y"))), fnode("b", cabled(("y", "x")))])
    assert report.miscabled == ()


def test_a_tie_names_no_one() -> None:
    report = evaluate([fnode("a", cabled(("x", "y"))), fnode("b", cabled(("x", "y"))),
                       fnode("c", cabled(("y", "x"))), fnode("d", cabled(("y", "x")))])
    assert report.miscabled == ()


def test_a_rack_under_one_tor_is_one_block_and_fine() -> None:
    report = evaluate([fnode(f"n{i}", cabled(("tor-7", "tor-7"))) for i in range(3)])
    assert [(b.block, len(b.nodes), b.switches, b.ok) for b in report.blocks] == [
        (fabric_block(["tor-7"]), 3, ("tor-7",), True)]
    assert [c.ok for c in report.checks] == [True]


def test_nodes_that_heard_nothing_at_all_have_no_block() -> None:
    report = evaluate([fnode("a", cabled(("x", "y"), silent=[0, 1]))])
    assert any("no rdma-hca.io/fabric-block label): a" in c.detail for c in report.checks)
    assert [b.ok for b in report.blocks] == [False]


def test_no_node_is_the_off_note() -> None:
    report = evaluate([])
    assert report.note == OFF_NOTE and report.checks == ()
    assert evaluate([], net_raw=False).note == OFF_IN_DAEMONSET
    assert evaluate([], net_raw=True).note == ON_UNPUBLISHED
