"""Sysfs read as the kernel and rdma-core define it, on real-world-shaped and hostile trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.hostile import hostile_nodes
from rdma_hca.devkit.sim.realworld import mlx4_infiniband_node, mlx5_roce_bond_node
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.model import Hca, NodeInventory
from rdma_hca.node.port_polls import listed_hcas, read_port_counters, read_port_states
from rdma_hca.node.sysfs_values import (
    PHYS_STATE_NAMES,
    PORT_STATE_NAMES,
    UNKNOWN,
    parse_state,
    printable,
    rate_gbps,
    unused_gid,
)


def _inventory(node: SimNode) -> NodeInventory:
    return discover_node(node.sysfs_root, node.dev_root)


def _by_name(inv: NodeInventory) -> dict[str, Hca]:
    return {h.name: h for h in inv.hcas}


def _mentions(warning: str, path: Path) -> bool:
    return printable(str(path)) in warning or printable(os.path.realpath(path)) in warning


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SimNode]:
    return hostile_nodes(tmp_path_factory.mktemp("hostile"))


# -- real-world shapes ----------------------------------------------------------------


def test_mlx4_prefix_only_gid_table_has_one_gid_per_port(tmp_path: Path) -> None:
    node = mlx4_infiniband_node(tmp_path / "mlx4")
    table = node.port_dir("mlx4_0") / "gids"
    assert len(os.listdir(table)) == 128
    assert (table / "5").read_text() == "fe80:0000:0000:0000:0000:0000:0000:0000\n"
    inv = _inventory(node)
    assert inv.warnings == ()
    (hca,) = inv.hcas
    assert hca.driver == "mlx4_core"
    assert hca.pcie_root == "pci0000:80"
    assert [[g.index for g in p.gids] for p in hca.ports] == [[0], [0]]
    assert hca.ports[0].gids[0].address == "fe80:0000:0000:0000:f452:1403:0017:1ac0"
    assert (hca.ports[0].state, hca.ports[0].phys_state, hca.ports[0].rate_gbps) == (
        "ACTIVE", "LinkUp", 56.0)
    assert (hca.ports[1].state, hca.ports[1].phys_state) == ("DOWN", "Polling")
    assert [p.lid for p in hca.ports] == [0x1B, 0]
    assert hca.any_port_up


def test_mlx5_lag_bond_beside_a_down_port(tmp_path: Path) -> None:
    node = mlx5_roce_bond_node(tmp_path / "lag")
    inv = _inventory(node)
    assert inv.warnings == ()
    hcas = _by_name(inv)
    assert list(hcas) == ["mlx5_2", "mlx5_bond_0"]
    bond = hcas["mlx5_bond_0"]
    assert bond.netdevs == ("bond0",)
    assert bond.pcie_root == "pci0000:97"
    v2 = [(g.kind.value, g.ip) for g in bond.ports[0].gids if g.is_roce_v2]
    assert v2 == [("link-local", v2[0][1]), ("ipv4-mapped", "10.224.1.7"),
                  ("global-ipv6", "2001:db8:e0::7")]
    down = hcas["mlx5_2"]
    assert (down.ports[0].state, down.ports[0].phys_state) == ("DOWN", "Disabled")
    assert down.netdevs == ("ens2f0np0",)
    assert down.pcie_root == "pci0000:3a"


# -- hostile trees --------------------------------------------------------------------


def test_hostile_trees_name_every_damaged_path_once(hostile: dict[str, SimNode]) -> None:
    assert set(hostile) == {"prefix_only_gids", "non_utf8_names", "impossible_numbers",
                            "state_mismatch", "unreadable_state"}
    for name, node in hostile.items():
        inv = _inventory(node)
        for warning in inv.warnings:
            warning.encode("utf-8")
        for path in node.damaged:
            hits = [w for w in inv.warnings if _mentions(w, path)]
            assert len(hits) == 1, (name, path, inv.warnings)


def test_infiniband_prefix_only_entries_are_unused(hostile: dict[str, SimNode]) -> None:
    hca = _by_name(_inventory(hostile["prefix_only_gids"]))["mlx5_0"]
    assert [g.index for g in hca.ports[0].gids] == [0]


def test_the_number_of_a_state_decides(hostile: dict[str, SimNode]) -> None:
    node = hostile["state_mismatch"]
    hcas = _by_name(_inventory(node))
    assert hcas["mlx5_0"].ports[0].phys_state == "LinkUp"
    assert hcas["mlx5_0"].any_port_up
    assert hcas["mlx5_1"].ports[0].phys_state == "Disabled"
    assert not hcas["mlx5_1"].any_port_up
    assert read_port_states(node.sysfs_root, ["mlx5_0", "mlx5_1"]) == {
        ("mlx5_0", 1): ("ACTIVE", "LinkUp"),
        ("mlx5_1", 1): ("ACTIVE", "Disabled"),
    }


def test_a_port_whose_state_cannot_be_read_is_unknown_not_gone(
    hostile: dict[str, SimNode],
) -> None:
    node = hostile["unreadable_state"]
    hca = _by_name(_inventory(node))["mlx5_0"]
    assert [(p.number, p.state) for p in hca.ports] == [(1, UNKNOWN)]
    assert not hca.any_port_up
    assert read_port_states(node.sysfs_root, ["mlx5_0"]) == {("mlx5_0", 1): (UNKNOWN, "LinkUp")}


def test_impossible_numbers_are_unknown(hostile: dict[str, SimNode]) -> None:
    node = hostile["impossible_numbers"]
    hcas = _by_name(_inventory(node))
    assert (hcas["mlx5_0"].ports[0].rate, hcas["mlx5_0"].ports[0].rate_gbps) == ("", None)
    assert hcas["mlx5_1"].numa_node is None
    counters = read_port_counters(node.sysfs_root, "mlx5_0", 1)
    assert "port_rcv_data" not in counters
    assert counters["port_xmit_data"] == 0


def test_impossible_lid_and_port_number(tmp_path: Path) -> None:
    node = sim.infiniband_node(tmp_path / "ib")
    lid = node.write("class/infiniband/mlx5_0/ports/1/lid", "0x" + "f" * 40 + "\n")
    huge_port = node.hca_dir("mlx5_0") / "ports" / ("9" * 30)
    huge_port.mkdir()
    inv = _inventory(node)
    (hca,) = inv.hcas
    assert hca.ports[0].lid is None
    assert [p.number for p in hca.ports] == [1, 2]
    assert len([w for w in inv.warnings if _mentions(w, lid)]) == 1
    assert len([w for w in inv.warnings if _mentions(w, huge_port)]) == 1


def test_non_utf8_names_are_escaped_and_the_hca_is_not_offered(
    hostile: dict[str, SimNode],
) -> None:
    node = hostile["non_utf8_names"]
    inv = _inventory(node)
    hcas = _by_name(inv)
    assert list(hcas) == ["mlx5_1", "mlx5_\\xff"]
    odd = hcas["mlx5_\\xff"]
    assert not odd.usable
    assert "not UTF-8" in odd.problems[0]
    assert odd.uverbs is not None  # found through its ibdev file, which holds the same bytes
    assert hcas["mlx5_1"].netdevs == ("eth\\xfe1",)
    assert hcas["mlx5_1"].usable
    assert sum("eth\\xfe1" in w for w in inv.warnings) == 1
    assert ("mlx5_\\xff", os.fsdecode(b"mlx5_\xff")) in listed_hcas(node.sysfs_root)


# -- the rules themselves ---------------------------------------------------------------


def test_parse_state_rules() -> None:
    assert parse_state(b"4: ACTIVE\n", PORT_STATE_NAMES) == ("ACTIVE", None)
    assert parse_state(b"5: Polling\n", PHYS_STATE_NAMES) == ("LinkUp", "Polling")
    assert parse_state(b"7: Phy Test\n", PHYS_STATE_NAMES) == ("Phy Test", None)
    assert parse_state(b"9: LinkUp\n", PHYS_STATE_NAMES) == (UNKNOWN, "LinkUp")
    assert parse_state(b"5: \xffUp\n", PHYS_STATE_NAMES) is None
    assert parse_state(b"LinkUp\n", PHYS_STATE_NAMES) is None


def test_gid_and_rate_rules() -> None:
    prefix_only = bytes.fromhex("fe80000000000000") + bytes(8)
    assert unused_gid(prefix_only)
    assert not unused_gid(bytes.fromhex("fe80000000000000f452140300171ac1"))
    assert not unused_gid(bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]))
    assert rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5
    assert rate_gbps("9" * 400 + " Gb/sec (4X NDR)") is None
    assert rate_gbps("fast") is None


def test_printable_escapes_what_is_not_utf8_text() -> None:
    assert printable("mlx5_0") == "mlx5_0"
    assert printable(os.fsdecode(b"a\xffb")) == "a\\xffb"
    assert printable("tab\there") == "tab\\there"


def test_port_states_skip_a_port_directory_without_files(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "n", hcas=1, bond=False, gid_table_size=4)
    (node.hca_dir("mlx5_0") / "ports" / "2").mkdir()
    assert [p.number for p in _by_name(_inventory(node))["mlx5_0"].ports] == [1]
    assert read_port_states(node.sysfs_root, ["mlx5_0"]) == {("mlx5_0", 1): ("ACTIVE", "LinkUp")}
