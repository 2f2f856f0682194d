"""The discovery report: tables people read and the JSON scripts parse."""

from __future__ import annotations

import argparse
import io
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.hostile import broken_nodes, hostile_nodes
from rdma_hca.devkit.sim.tree import SimNode, build_node
from rdma_hca.kit.exitcodes import EXIT_FAIL as EXIT_STALLED
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.model import NodeInventory
from rdma_hca.tools import report
from rdma_hca.tools.report import JSON_VERSION, inventory_to_json, render_inventory


def _inventory(node: SimNode) -> NodeInventory:
    return discover_node(node.sysfs_root, node.dev_root)


def _section(text: str, title: str) -> list[str]:
    """Lines of one titled section (up to the next blank line)."""
    lines = text.splitlines()
    start = lines.index(title) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


def _row(lines: list[str], first: str) -> list[str]:
    rows = [line.split() for line in lines if line.split()[:1] == [first]]
    assert len(rows) == 1, (first, lines)
    return rows[0]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return sim.gpu_node(tmp_path_factory.mktemp("gpu"))


@pytest.fixture(scope="module")
def gpu_text(gpu: SimNode) -> str:
    return render_inventory(_inventory(gpu))


def test_summary_lines(gpu_text: str) -> None:
    lines = gpu_text.splitlines()
    assert lines[0] == "RDMA HCAs: 9 found, 9 usable"
    assert lines[1] == "RDMA netns mode: shared"
    assert "Warnings" not in gpu_text
    assert "Not offered to pods" not in gpu_text


def test_lines_fit_in_100_columns(gpu_text: str) -> None:
    assert max(len(line) for line in gpu_text.splitlines()) <= 100


def test_hca_table(gpu: SimNode, gpu_text: str) -> None:
    table = _section(gpu_text, "HCAs")
    assert table[0].split() == [
        "HCA", "DRIVER", "PCI", "PCIE-ROOT", "NUMA", "ID", "FIRMWARE", "BOARD", "USABLE"
    ]  # fmt: skip
    assert len(table) == 10
    assert _row(table, "mlx5_5") == [
        "mlx5_5",
        "mlx5_core",
        gpu.specs["mlx5_5"].pci_address,
        gpu.expected_pcie_root("mlx5_5"),
        "1",
        "15b3:1021",
        "28.39.1002",
        "MT_0000000838",
        "yes",
    ]
    assert [r.split()[0] for r in table[1:]][-2:] == ["mlx5_7", "mlx5_bond_0"]


def test_port_table(gpu_text: str) -> None:
    table = _section(gpu_text, "Ports")
    assert _row(table, "mlx5_2") == [
        "mlx5_2", "1", "ACTIVE", "LinkUp", "Ethernet", "400", "Gb/sec", "(4X", "NDR)", "eth2", "-"
    ]  # fmt: skip
    assert _row(table, "mlx5_bond_0")[-2] == "bond0"


def test_gid_table_shows_only_roce_v2(gpu_text: str) -> None:
    table = _section(gpu_text, "RoCE v2 GIDs")
    rows = [line.split() for line in table[1:] if line.startswith("mlx5_0 ")]
    assert [r[2:] for r in rows] == [
        ["1", "link-local", "fe80::ba59:9fff:fed4:3c22", "eth0"],
        ["3", "ipv4-mapped", "10.0.0.11", "eth0"],
    ]
    assert table[-1].startswith("0 of 9 HCAs have a global IPv6 RoCE v2 GID")


def test_device_nodes_follow_discovery(gpu: SimNode, gpu_text: str) -> None:
    table = _section(gpu_text, "Device nodes (/dev/infiniband)")
    for name in gpu.specs:
        assert _row(table, name) == [name, gpu.uverbs_name(name), gpu.umad_name(name), "-"]
    assert table[-1] == "rdma_cm: /dev/infiniband/rdma_cm (present)"


def test_ipv6_node_counts_global_gids(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path, ipv6=True, hcas=2, bond=False, gid_table_size=8)
    text = render_inventory(_inventory(node))
    assert "2 of 2 HCAs have a global IPv6 RoCE v2 GID" in text
    assert "2001:db8:0:1::11" in text


def test_unusable_hca_and_down_port(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path, hcas=4, bond=False, gid_table_size=8)
    uverbs = node.uverbs_name("mlx5_3")
    node.remove_dev_node(uverbs)
    node.set_port("mlx5_1", up=False)
    text = render_inventory(_inventory(node))
    assert text.splitlines()[0] == "RDMA HCAs: 4 found, 3 usable"
    assert _row(_section(text, "HCAs"), "mlx5_3")[-1] == "NO"
    assert _row(_section(text, "Ports"), "mlx5_1")[2:4] == ["DOWN", "Disabled"]
    assert _row(_section(text, "Device nodes (/dev/infiniband)"), "mlx5_3")[1:3] == [
        uverbs,
        "MISSING",
    ]
    reasons = " ".join(_section(text, "Not offered to pods"))
    assert f"mlx5_3: device node /dev/infiniband/{uverbs} is missing" in reasons
    # The reason is shown once, not repeated among the warnings.
    assert "Warnings" not in text


def test_infiniband_node(ib_node: SimNode) -> None:
    text = render_inventory(_inventory(ib_node))
    ports = _section(text, "Ports")
    assert [r.split()[1] for r in ports[1:]] == ["1", "2"]
    assert ports[1].split()[4] == "InfiniBand"
    assert ports[1].split()[-1] == "5/1"
    assert ports[2].split()[-2:] == ["ib1", "6/1"]
    assert _section(text, "RoCE v2 GIDs")[0].startswith("no RoCE v2 GIDs")
    devices = _section(text, "Device nodes (/dev/infiniband)")
    assert _row(devices, "mlx5_0")[2:] == ["umad0,umad1", "issm0,issm1"]


def test_node_without_rdma(tmp_path: Path) -> None:
    text = render_inventory(_inventory(sim.no_rdma_node(tmp_path)))
    assert text.splitlines()[:2] == [
        "RDMA HCAs: 0 found, 0 usable",
        "RDMA netns mode: unknown (ib_core does not say)",
    ]
    assert "No RDMA HCAs found." in text
    assert "rdma_cm: not found" in text


def test_exclusive_netns_mode_is_explained(tmp_path: Path) -> None:
    node = build_node(tmp_path, [], netns_mode="exclusive")
    line = render_inventory(_inventory(node)).splitlines()[1]
    assert line.startswith("RDMA netns mode: exclusive")
    assert "hostNetwork" in line


def test_warnings_are_listed_and_wrapped(tmp_path: Path) -> None:
    node = broken_nodes(tmp_path)["binary_junk"]
    inv = _inventory(node)
    text = render_inventory(inv)
    warnings = _section(text, f"Warnings ({len(inv.warnings)})")
    assert len(inv.warnings) == 5
    assert sum(1 for line in warnings if line.startswith("- ")) == 5
    joined = "".join(line.removeprefix("- ").strip() for line in warnings)
    assert "fw_ver" in joined and "gids/3" in joined
    assert max(len(line) for line in text.splitlines()) <= 100


def test_json_shape(gpu: SimNode) -> None:
    data: Any = inventory_to_json(_inventory(gpu))
    assert json.loads(json.dumps(data)) == data
    assert list(data) == [
        "version", "summary", "netns_mode", "rdma_cm", "hcas", "stalled", "warnings"
    ]  # fmt: skip
    assert data["stalled"] == []
    assert data["version"] == JSON_VERSION
    assert data["summary"] == {"hcas": 9, "usable": 9}
    assert data["rdma_cm"] == {
        "name": "rdma_cm",
        "path": "/dev/infiniband/rdma_cm",
        "present": True,
    }
    hcas = data["hcas"]
    assert isinstance(hcas, list)
    first = hcas[0]
    assert first["name"] == "mlx5_0"
    assert first["numa_node"] == 0
    assert first["pci_bus_id"] == gpu.specs["mlx5_0"].pci_address
    assert first["pcie_root"] == gpu.expected_pcie_root("mlx5_0")
    assert first["uverbs"]["name"] == gpu.uverbs_name("mlx5_0")
    assert first["device_nodes"] == [f"/dev/infiniband/{gpu.uverbs_name('mlx5_0')}"]
    port = first["ports"][0]
    assert port["up"] is True
    assert port["rate_gbps"] == 400.0
    assert port["gids"][3] == {
        "index": 3,
        "address": "0000:0000:0000:0000:0000:ffff:0a00:000b",
        "type": "RoCE v2",
        "kind": "ipv4-mapped",
        "ip": "10.0.0.11",
        "netdev": "eth0",
    }


def test_json_infiniband_device_nodes(ib_node: SimNode) -> None:
    data: Any = inventory_to_json(_inventory(ib_node))
    (hca,) = data["hcas"]
    assert hca["device_nodes"] == [
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/umad0",
        "/dev/infiniband/umad1",
    ]
    assert [p["lid"] for p in hca["ports"]] == [5, 6]
    assert hca["ports"][0]["issm"]["path"] == "/dev/infiniband/issm0"


def test_json_unusable_and_empty(tmp_path: Path) -> None:
    node = broken_nodes(tmp_path)["missing_uverbs"]
    data: Any = inventory_to_json(_inventory(node))
    hcas = {h["name"]: h for h in data["hcas"]}
    assert hcas["mlx5_1"]["usable"] is False
    assert hcas["mlx5_1"]["uverbs"] is None
    assert "ib_uverbs" in hcas["mlx5_1"]["problems"][0]
    assert data["summary"] == {"hcas": 2, "usable": 1}
    empty = inventory_to_json(_inventory(sim.no_rdma_node(tmp_path / "plain")))
    assert empty["hcas"] == []
    assert empty["rdma_cm"] is None
    assert empty["netns_mode"] is None


# -- hostile trees: every output stays valid UTF-8 and JSON, and ends --------------------


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SimNode]:
    return hostile_nodes(tmp_path_factory.mktemp("hostile"))


def _discover(node: SimNode, *, as_json: bool, deadline: float = 5.0) -> tuple[int, str]:
    args = argparse.Namespace(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                              json=as_json, read_deadline_seconds=deadline)
    out = io.StringIO()
    status = report.run(args, out=out)
    return status, out.getvalue()


def test_non_utf8_names_are_shown_escaped(hostile: dict[str, SimNode]) -> None:
    node = hostile["non_utf8_names"]
    status, text = _discover(node, as_json=False)
    assert status == 0
    text.encode("utf-8")  # raises on a lone surrogate
    assert "mlx5_\\xff" in text and "eth\\xfe1" in text
    status, raw = _discover(node, as_json=True)
    data = json.loads(raw.encode("utf-8"))
    names = [h["name"] for h in data["hcas"]]
    assert names == ["mlx5_1", "mlx5_\\xff"]
    assert data["hcas"][1]["usable"] is False
    assert data["hcas"][0]["netdevs"] == ["eth\\xfe1"]


def test_impossible_numbers_never_reach_json_as_infinity(
    hostile: dict[str, SimNode],
) -> None:
    node = hostile["impossible_numbers"]
    _, raw = _discover(node, as_json=True)
    data = json.loads(raw, parse_constant=lambda c: pytest.fail(f"JSON holds {c}"))
    hcas = {h["name"]: h for h in data["hcas"]}
    assert hcas["mlx5_0"]["ports"][0]["rate_gbps"] is None
    assert hcas["mlx5_1"]["numa_node"] is None
    for path in node.damaged:
        assert any(str(path) in w or os.path.realpath(path) in w for w in data["warnings"])


def test_clean_json_drops_nan_and_infinity() -> None:
    inv = _inventory_with_rate(float("inf"))
    data: Any = inventory_to_json(inv)
    assert data["hcas"][0]["ports"][0]["rate_gbps"] is None
    json.dumps(data, allow_nan=False)
    assert report.clean_json([float("nan"), "a\udcffb", {"k": (1.5,)}]) == [
        None, "a\\xffb", {"k": [1.5]}
    ]  # fmt: skip


def _inventory_with_rate(rate: float) -> NodeInventory:
    node_inv = _SMALL_INVENTORY[0]
    hca = node_inv.hcas[0]
    port = replace(hca.ports[0], rate_gbps=rate)
    return replace(node_inv, hcas=(replace(hca, ports=(port,)),))


_SMALL_INVENTORY: list[NodeInventory] = []


@pytest.fixture(autouse=True, scope="module")
def _small_inventory(tmp_path_factory: pytest.TempPathFactory) -> None:
    node = sim.gpu_node(tmp_path_factory.mktemp("small"), hcas=1, bond=False, gid_table_size=4)
    _SMALL_INVENTORY[:] = [_inventory(node)]


@pytest.fixture
def small(tmp_path: Path) -> Iterator[SimNode]:
    node = sim.gpu_node(tmp_path / "n", hcas=2, bond=False, gid_table_size=8)
    yield node
    node.release_fifos()


def test_discover_names_a_file_that_never_answers(small: SimNode) -> None:
    rel = "class/infiniband/mlx5_1/ports/1/state"
    small.replace_with_fifo(rel)
    path = os.path.abspath(small.sysfs_root / rel)
    status, text = _discover(small, as_json=False, deadline=1.0)
    assert status == EXIT_STALLED
    stalled = _section(text, "Did not answer within the read deadline (1)")
    assert stalled[0].startswith("- /")
    assert path in "".join(line.removeprefix("- ").strip() for line in stalled)
    assert _row(_section(text, "Ports"), "mlx5_1")[2:4] == ["UNKNOWN", "UNKNOWN"]
    status, raw = _discover(small, as_json=True, deadline=1.0)
    assert status == EXIT_STALLED
    data = json.loads(raw)
    assert data["stalled"] == [path]
    assert [h["name"] for h in data["hcas"]] == ["mlx5_0", "mlx5_1"]


def test_the_discover_command_prints_json_and_exits_0(
    small: SimNode, capsys: pytest.CaptureFixture[str]
) -> None:
    from rdma_hca import cli

    argv = ["discover", "--json", "--sysfs-root", str(small.sysfs_root),
            "--dev-root", str(small.dev_root)]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert [h["pcie_root"] for h in data["hcas"]] == [
        small.expected_pcie_root("mlx5_0"), small.expected_pcie_root("mlx5_1")]
