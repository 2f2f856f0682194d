"""Discovery on simulated sysfs trees: real layouts, odd-but-normal cases, broken trees."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sysfs_helpers import discover, read_netns_mode

from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim import specs as sim_specs
from rdma_hca.devkit.sim.hostile import broken_nodes
from rdma_hca.devkit.sim.specs import HcaSpec, PortSpec
from rdma_hca.devkit.sim.tree import SimNode, build_node
from rdma_hca.kit.text import natural_key
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.model import GidKind, Hca, LinkLayer, NodeInventory
from rdma_hca.node.port_polls import HW_PREFIX, read_port_counters, read_port_states
from rdma_hca.node.sysfs_values import UNKNOWN


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    """A GPU node shared by the tests that only read it (building one per test is waste)."""
    return sim.gpu_node(tmp_path_factory.mktemp("gpu"))


def _small(root: Path, hcas: int = 2) -> SimNode:
    """A cheap node for tests that change the tree: short GID tables, no bond."""
    return sim.gpu_node(root, hcas=hcas, bond=False, gid_table_size=16)


def _inventory(node: SimNode) -> NodeInventory:
    return discover_node(node.sysfs_root, node.dev_root)


def _by_name(inv: NodeInventory) -> dict[str, Hca]:
    return {h.name: h for h in inv.hcas}


# -- the GPU node ---------------------------------------------------------------------


def test_gpu_node_finds_every_hca_sorted_naturally(gpu: SimNode) -> None:
    inv = _inventory(gpu)
    assert [h.name for h in inv.hcas] == [f"mlx5_{i}" for i in range(8)] + ["mlx5_bond_0"]
    assert inv.warnings == ()
    assert all(h.usable for h in inv.hcas)
    assert inv.netns_mode == "shared"
    assert inv.rdma_cm is not None
    assert inv.rdma_cm.path == "/dev/infiniband/rdma_cm"
    assert inv.rdma_cm.present


def test_class_entries_are_symlinks_into_devices(gpu: SimNode) -> None:
    entry = gpu.hca_dir("mlx5_3")
    assert entry.is_symlink()
    assert os.readlink(entry).startswith("../../devices/pci")
    hca = _by_name(_inventory(gpu))["mlx5_3"]
    pci = gpu.pci_dir("mlx5_3")
    assert pci is not None
    assert hca.pci_address == pci.name == gpu.specs["mlx5_3"].pci_address


def test_pci_identity_driver_and_attributes(gpu: SimNode) -> None:
    hca = _by_name(_inventory(gpu))["mlx5_0"]
    assert hca.driver == "mlx5_core"
    assert (hca.pci_vendor, hca.pci_device) == ("0x15b3", "0x1021")
    assert hca.fw_ver == "28.39.1002"
    assert hca.board_id == "MT_0000000838"
    assert hca.hca_type == "MT4129"
    assert hca.node_guid == "b859:9f03:00d4:3c22"


def test_numa_nodes_split_over_the_hcas(gpu: SimNode) -> None:
    hcas = _by_name(_inventory(gpu))
    assert [hcas[f"mlx5_{i}"].numa_node for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_uverbs_follow_ibdev_not_name_order(gpu: SimNode) -> None:
    inv = _inventory(gpu)
    found = {h.name: h.uverbs.name for h in inv.hcas if h.uverbs is not None}
    expected = {name: gpu.uverbs_name(name) for name in gpu.specs}
    assert found == expected
    # The sim shuffles on purpose; make sure it did, or this test proves nothing.
    assert any(found[f"mlx5_{i}"] != f"uverbs{i}" for i in range(8))
    hca = _by_name(inv)["mlx5_2"]
    assert hca.uverbs is not None
    assert hca.uverbs.path == f"/dev/infiniband/{expected['mlx5_2']}"


def test_abi_version_files_are_not_devices(gpu: SimNode) -> None:
    for kind in ("infiniband_verbs", "infiniband_mad"):
        assert (gpu.sysfs_root / "class" / kind / "abi_version").is_file()
    inv = _inventory(gpu)
    assert inv.warnings == ()
    names = {h.uverbs.name for h in inv.hcas if h.uverbs}
    assert "abi_version" not in names
    assert len(names) == 9


def test_roce_ports_gids_and_netdevs(gpu: SimNode) -> None:
    hca = _by_name(_inventory(gpu))["mlx5_4"]
    (port,) = hca.ports
    assert port.number == 1
    assert (port.state, port.phys_state) == ("ACTIVE", "LinkUp")
    assert port.is_up
    assert port.link_layer is LinkLayer.ETHERNET
    assert port.rate == "400 Gb/sec (4X NDR)"
    assert port.rate_gbps == 400.0
    assert port.netdevs == ("eth4",)
    assert [(g.index, g.type, g.kind) for g in port.gids] == [
        (0, "IB/RoCE v1", GidKind.LINK_LOCAL),
        (1, "RoCE v2", GidKind.LINK_LOCAL),
        (2, "IB/RoCE v1", GidKind.IPV4_MAPPED),
        (3, "RoCE v2", GidKind.IPV4_MAPPED),
    ]
    v2 = [g for g in port.gids if g.is_roce_v2 and g.kind is GidKind.IPV4_MAPPED]
    assert v2[0].ip == "10.0.4.11"
    assert v2[0].address == "0000:0000:0000:0000:0000:ffff:0a00:040b"
    assert v2[0].netdev == "eth4"
    assert port.gids[0].ip is not None and port.gids[0].ip.startswith("fe80::")


def test_global_ipv6_gids(gpu_node_ipv6: SimNode) -> None:
    hca = _by_name(_inventory(gpu_node_ipv6))["mlx5_3"]
    six = [g for g in hca.ports[0].gids if g.kind is GidKind.GLOBAL_IPV6]
    assert [(g.index, g.type, g.ip) for g in six] == [
        (4, "IB/RoCE v1", "2001:db8:0:3::11"),
        (5, "RoCE v2", "2001:db8:0:3::11"),
    ]


def test_roce_umad_exists_but_is_not_a_container_device(gpu: SimNode) -> None:
    hca = _by_name(_inventory(gpu))["mlx5_0"]
    assert hca.ports[0].umad is not None
    assert hca.ports[0].umad.name == gpu.umad_name("mlx5_0")
    assert hca.ports[0].issm is None
    assert hca.device_nodes() == (hca.uverbs,)


def test_bonded_hca_is_one_hca_on_the_bond(gpu: SimNode) -> None:
    hcas = _by_name(_inventory(gpu))
    bond = hcas["mlx5_bond_0"]
    assert bond.netdevs == ("bond0",)
    assert all(g.netdev == "bond0" for g in bond.ports[0].gids)
    assert not any(n.startswith("ens") for h in hcas.values() for n in h.netdevs)


def test_mlx5_1_is_never_mlx5_10(tmp_path: Path) -> None:
    node = _small(tmp_path / "n", hcas=12)
    names = [h.name for h in _inventory(node).hcas]
    assert names.index("mlx5_2") < names.index("mlx5_10")
    node.remove_dev_node(node.uverbs_name("mlx5_10"))
    hcas = _by_name(_inventory(node))
    assert not hcas["mlx5_10"].usable
    assert hcas["mlx5_1"].usable
    assert hcas["mlx5_1"].uverbs is not None
    assert hcas["mlx5_1"].uverbs.name == node.uverbs_name("mlx5_1")
    assert hcas["mlx5_1"].netdevs == ("eth1",)
    node.set_port("mlx5_10", up=False)
    states = read_port_states(node.sysfs_root, ["mlx5_1"])
    assert states == {("mlx5_1", 1): ("ACTIVE", "LinkUp")}


def test_natural_key_orders_numbers_as_numbers() -> None:
    names = ["mlx5_10", "mlx5_2", "erdma_0", "mlx5_bond_0", "mlx5_1"]
    assert sorted(names, key=natural_key) == [
        "erdma_0",
        "mlx5_1",
        "mlx5_2",
        "mlx5_10",
        "mlx5_bond_0",
    ]


def test_discover_returns_the_inventory_hcas(gpu: SimNode) -> None:
    assert discover(gpu.sysfs_root, gpu.dev_root) == list(_inventory(gpu).hcas)


# -- other kinds of node --------------------------------------------------------------


def test_infiniband_node(ib_node: SimNode) -> None:
    inv = _inventory(ib_node)
    assert inv.warnings == ()
    (hca,) = inv.hcas
    assert [p.number for p in hca.ports] == [1, 2]
    for port, netdev in zip(hca.ports, ("ib0", "ib1"), strict=True):
        assert port.link_layer is LinkLayer.INFINIBAND
        assert port.rate_gbps == 200.0
        assert port.netdevs == (netdev,)
        assert port.sm_lid == 1
        assert port.umad is not None and port.umad.present
        assert port.issm is not None and port.issm.present
        assert port.umad.name == ib_node.umad_name("mlx5_0", port.number)
        assert port.issm.name == ib_node.issm_name("mlx5_0", port.number)
        (gid,) = port.gids
        assert gid.ip is None
        assert gid.netdev is None
        assert not gid.is_roce_v2
    assert [p.lid for p in hca.ports] == [5, 6]
    umads = tuple(p.umad for p in hca.ports)
    assert hca.device_nodes() == (hca.uverbs, *umads)


def test_erdma_node(erdma_node: SimNode) -> None:
    inv = _inventory(erdma_node)
    assert inv.warnings == ()
    assert [h.name for h in inv.hcas] == ["erdma_0", "erdma_1"]
    for hca in inv.hcas:
        assert hca.driver == "erdma"
        assert hca.pci_vendor == "0x1ded"
        assert hca.numa_node is None
        assert hca.usable
        assert hca.board_id is None


def test_soft_roce_and_siw_have_no_pci_parent(soft_roce_node: SimNode) -> None:
    inv = _inventory(soft_roce_node)
    assert inv.warnings == ()
    hcas = _by_name(inv)
    assert set(hcas) == {"rxe0", "siw0"}
    for name, netdev in (("rxe0", "eth0"), ("siw0", "eth1")):
        hca = hcas[name]
        assert hca.pci_address is None
        assert hca.numa_node is None
        assert hca.pci_vendor is None
        assert hca.netdevs == (netdev,)
        assert hca.usable
    # siw0 does have a device link, just not to a PCI function.
    assert (soft_roce_node.hca_dir("siw0") / "device").is_symlink()
    assert not (soft_roce_node.hca_dir("rxe0") / "device").exists()


def test_node_without_rdma(tmp_path: Path) -> None:
    node = sim.no_rdma_node(tmp_path / "plain")
    inv = _inventory(node)
    assert inv == NodeInventory(hcas=(), rdma_cm=None, netns_mode=None, warnings=())


def test_missing_sysfs_root_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    missing = tmp_path / "nope"
    with caplog.at_level(logging.WARNING, logger="rdma_hca.sysfs"):
        inv = discover_node(missing, tmp_path / "dev")
    assert inv.hcas == ()
    assert len(inv.warnings) == 1
    assert str(missing) in inv.warnings[0]
    # Discovery reports through the inventory; logging it is the caller's choice.
    assert caplog.records == []


# -- live changes ---------------------------------------------------------------------


def test_hot_unplug_and_return(gpu_node: SimNode) -> None:
    before = _inventory(gpu_node)
    gpu_node.remove_hca("mlx5_6")
    during = _inventory(gpu_node)
    assert "mlx5_6" not in _by_name(during)
    assert len(during.hcas) == 8
    assert during.warnings == ()
    gpu_node.add_hca(gpu_node.specs["mlx5_6"])
    assert _inventory(gpu_node) == before


def test_read_port_states(tmp_path: Path, ib_node: SimNode) -> None:
    node = _small(tmp_path / "gpu", hcas=6)
    node.set_port("mlx5_3", up=False)
    node.remove_hca("mlx5_5")
    states = read_port_states(node.sysfs_root, ["mlx5_3", "mlx5_4", "mlx5_5", "mlx5_99", "../x"])
    assert states == {
        ("mlx5_3", 1): ("DOWN", "Disabled"),
        ("mlx5_4", 1): ("ACTIVE", "LinkUp"),
    }
    ib_node.write("class/infiniband/mlx5_0/ports/2/state", b"\xff\n")
    assert read_port_states(ib_node.sysfs_root, ["mlx5_0"]) == {
        ("mlx5_0", 1): ("ACTIVE", "LinkUp"),
        ("mlx5_0", 2): (UNKNOWN, "LinkUp"),
    }


def test_read_port_counters(tmp_path: Path) -> None:
    node = _small(tmp_path)
    node.set_counter("mlx5_1", 1, "port_rcv_data", 123456789012)
    node.write("class/infiniband/mlx5_1/ports/1/counters/vl15_dropped", "N/A\n")
    counters = read_port_counters(node.sysfs_root, "mlx5_1", 1)
    assert counters["port_rcv_data"] == 123456789012
    assert counters["port_xmit_data"] == 0
    assert "vl15_dropped" not in counters
    assert read_port_counters(node.sysfs_root, "mlx5_10", 1) == {}
    assert read_port_counters(node.sysfs_root, "mlx5_1", 2) == {}


def test_port_counters_hold_every_abi_counter_and_the_hw_counters(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "n", hcas=2, bond=False, gid_table_size=4)
    node.set_counter("mlx5_0", 1, "VL15_dropped", 5)
    node.set_counter("mlx5_0", 1, "np_cnp_sent", 2**64 - 1, hw=True)
    counters = read_port_counters(node.sysfs_root, "mlx5_0", 1)
    assert {n for n in counters if not n.startswith(HW_PREFIX)} == set(sim_specs.COUNTERS)
    hw = {n.removeprefix(HW_PREFIX) for n in counters if n.startswith(HW_PREFIX)}
    assert hw == set(sim_specs.MLX5_HW_COUNTERS + sim_specs.MLX5_ROCE_HW_COUNTERS)
    assert counters["VL15_dropped"] == 5
    assert counters[HW_PREFIX + "np_cnp_sent"] == 2**64 - 1
    assert HW_PREFIX + "lifespan" not in counters  # a setting of the driver, not a counter


def test_hostile_hw_counter_files_are_left_out(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "n", hcas=1, bond=False, gid_table_size=4)
    hw = "class/infiniband/mlx5_0/ports/1/hw_counters"
    node.set_counter("mlx5_0", 1, "out_of_sequence", 17, hw=True)
    for name, content in (("np_cnp_sent", "N/A\n"), ("rp_cnp_handled", "9" * 400 + "\n"),
                          ("packet_seq_err", str(2**64) + "\n"), ("duplicate_request", "-1\n"),
                          ("implied_nak_seq_err", "\xff\xfe\n"), ("a" * 65, "1\n"),
                          ('odd"name', "3\n")):
        node.write(f"{hw}/{name}", content)
    os.mkdir(node.sysfs_root / hw / "a_directory")
    (node.sysfs_root / hw / os.fsdecode(b"bad\xffname")).write_text("1\n")
    counters = read_port_counters(node.sysfs_root, "mlx5_0", 1)
    hw_names = {n.removeprefix(HW_PREFIX) for n in counters if n.startswith(HW_PREFIX)}
    assert counters[HW_PREFIX + "out_of_sequence"] == 17
    assert counters[HW_PREFIX + 'odd"name'] == 3  # odd, but a number: the label escapes it
    for gone in ("np_cnp_sent", "rp_cnp_handled", "packet_seq_err", "duplicate_request",
                 "implied_nak_seq_err", "a" * 65, "a_directory"):
        assert gone not in hw_names
    assert not any("\udcff" in n for n in hw_names)
    assert counters["port_rcv_data"] == 0  # the other directory is read all the same


@pytest.mark.parametrize(
    ("content", "expected"),
    [("Y\n", "shared"), ("1\n", "shared"), ("N\n", "exclusive"), ("0\n", "exclusive")],
)
def test_netns_mode_values(tmp_path: Path, content: str, expected: str) -> None:
    node = build_node(tmp_path, [])
    node.write("module/ib_core/parameters/netns_mode", content)
    assert read_netns_mode(node.sysfs_root) == expected
    assert _inventory(node).netns_mode == expected


def test_netns_mode_missing(tmp_path: Path) -> None:
    node = build_node(tmp_path, [])
    node.set_netns_mode(None)
    assert read_netns_mode(node.sysfs_root) is None
    node.set_netns_mode("exclusive")
    assert read_netns_mode(node.sysfs_root) == "exclusive"


# -- GID tables -----------------------------------------------------------------------


def _add_gid(node: SimNode, index: int, address: str, gid_type: str | None) -> None:
    base = "class/infiniband/mlx5_0/ports/1"
    node.write(f"{base}/gids/{index}", address + "\n")
    if gid_type is not None:
        node.write(f"{base}/gid_attrs/types/{index}", gid_type + "\n")
        node.write(f"{base}/gid_attrs/ndevs/{index}", "eth0\n")


@pytest.mark.parametrize(
    ("address", "kind", "ip"),
    [
        ("2001:0db8:0000:0000:0000:0000:0000:0042", GidKind.GLOBAL_IPV6, "2001:db8::42"),
        ("fd00:0000:0000:0000:0000:0000:0000:0007", GidKind.GLOBAL_IPV6, "fd00::7"),
        ("0000:0000:0000:0000:0000:ffff:0a00:0001", GidKind.IPV4_MAPPED, "10.0.0.1"),
        (
            "fe80:0000:0000:0000:ba59:9fff:fed4:3c22",
            GidKind.LINK_LOCAL,
            "fe80::ba59:9fff:fed4:3c22",
        ),
        ("ff02:0000:0000:0000:0000:0000:0000:0001", GidKind.OTHER, None),
    ],
)
def test_gid_kinds(tmp_path: Path, address: str, kind: GidKind, ip: str | None) -> None:
    node = _small(tmp_path)
    _add_gid(node, 9, address, "RoCE v2")
    gid = next(g for g in _by_name(_inventory(node))["mlx5_0"].ports[0].gids if g.index == 9)
    assert (gid.kind, gid.ip, gid.address) == (kind, ip, address)


def test_gid_with_unreadable_type_is_unused(tmp_path: Path) -> None:
    node = _small(tmp_path)
    # A stale address in gids/N whose type the kernel refuses (EINVAL) is not in use;
    # the sim stands for the refusal with a missing file and with a directory.
    _add_gid(node, 10, "2001:0db8:0000:0000:0000:0000:0000:0010", None)
    _add_gid(node, 11, "2001:0db8:0000:0000:0000:0000:0000:0011", None)
    (node.port_dir("mlx5_0") / "gid_attrs" / "types" / "11").mkdir()
    inv = _inventory(node)
    assert [g.index for g in _by_name(inv)["mlx5_0"].ports[0].gids] == [0, 1, 2, 3]
    assert inv.warnings == ()


def test_full_gid_table_is_read_to_the_end(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path, hcas=1, bond=False)
    _add_gid(node, 255, "0000:0000:0000:0000:0000:ffff:0a00:00ff", "RoCE v2")
    gids = _by_name(_inventory(node))["mlx5_0"].ports[0].gids
    assert gids[-1].index == 255
    assert gids[-1].ip == "10.0.0.255"


# -- broken trees ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SimNode]:
    return broken_nodes(tmp_path_factory.mktemp("broken"))


def _mentions(warning: str, path: Path) -> bool:
    return str(path) in warning or os.path.realpath(path) in warning


BROKEN = [
    "dangling_symlink",
    "dangling_device",
    "garbage_state",
    "missing_uverbs",
    "empty_port",
    "bad_port_name",
    "binary_junk",
    "dangling_uverbs",
    "bad_netns",
]


@pytest.mark.parametrize("name", BROKEN)
def test_broken_tree_warns_once_per_damaged_path(
    broken: dict[str, SimNode], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    node = broken[name]
    with caplog.at_level(logging.WARNING, logger="rdma_hca.sysfs"):
        inv = _inventory(node)
    assert node.damaged
    for path in node.damaged:
        hits = [w for w in inv.warnings if _mentions(w, path)]
        assert len(hits) == 1, (path, inv.warnings)
    assert [r for r in caplog.records if r.name == "rdma_hca.sysfs"] == []


def test_broken_trees_cover_every_builder_case(broken: dict[str, SimNode]) -> None:
    assert set(broken) == {*BROKEN, "missing_dev_node"}


def test_dangling_class_symlink_skips_only_that_entry(broken: dict[str, SimNode]) -> None:
    inv = _inventory(broken["dangling_symlink"])
    assert [h.name for h in inv.hcas] == ["mlx5_0", "mlx5_1"]
    assert all(h.usable for h in inv.hcas)


def test_dangling_device_link_leaves_pci_unknown(broken: dict[str, SimNode]) -> None:
    hca = _by_name(_inventory(broken["dangling_device"]))["mlx5_1"]
    assert (hca.pci_address, hca.numa_node, hca.driver) == (None, None, None)
    assert hca.ports[0].netdevs == ("eth1",)  # still known from the GIDs


def test_garbage_state_is_unknown_and_down(broken: dict[str, SimNode]) -> None:
    hca = _by_name(_inventory(broken["garbage_state"]))["mlx5_0"]
    port = hca.ports[0]
    assert (port.state, port.phys_state) == (UNKNOWN, UNKNOWN)
    assert not port.is_up
    assert hca.numa_node is None


def test_missing_uverbs_makes_hca_unusable(broken: dict[str, SimNode]) -> None:
    hcas = _by_name(_inventory(broken["missing_uverbs"]))
    assert hcas["mlx5_0"].usable
    bad = hcas["mlx5_1"]
    assert not bad.usable
    assert bad.uverbs is None
    assert "ib_uverbs" in bad.problems[0]


def test_missing_dev_node_makes_hca_unusable(broken: dict[str, SimNode]) -> None:
    node = broken["missing_dev_node"]
    inv = _inventory(node)
    hcas = _by_name(inv)
    bad = hcas["mlx5_1"]
    assert bad.uverbs is not None and not bad.uverbs.present
    assert not bad.usable
    uverbs = node.uverbs_name("mlx5_1")
    expected = f"device node /dev/infiniband/{uverbs} is missing under {node.dev_root}"
    assert bad.problems[0].startswith(expected)
    assert [w for w in inv.warnings if expected in w] != []
    assert hcas["mlx5_0"].usable


def test_port_without_files_and_bad_port_names_are_skipped(
    broken: dict[str, SimNode],
) -> None:
    for name in ("empty_port", "bad_port_name"):
        hca = _by_name(_inventory(broken[name]))["mlx5_0"]
        assert [p.number for p in hca.ports] == [1]


def test_binary_junk_fields_become_none(broken: dict[str, SimNode]) -> None:
    hcas = _by_name(_inventory(broken["binary_junk"]))
    assert hcas["mlx5_0"].fw_ver is None
    assert hcas["mlx5_0"].node_guid is None
    port = hcas["mlx5_1"].ports[0]
    assert (port.rate, port.rate_gbps) == ("", None)
    assert 3 not in [g.index for g in port.gids]
    assert next(g for g in port.gids if g.index == 1).type == ""
    assert all(h.usable for h in hcas.values())


def test_dangling_uverbs_does_not_hurt_others(broken: dict[str, SimNode]) -> None:
    assert all(h.usable for h in _inventory(broken["dangling_uverbs"]).hcas)


def test_bad_netns_mode_is_unknown(broken: dict[str, SimNode]) -> None:
    assert _inventory(broken["bad_netns"]).netns_mode is None
    assert read_netns_mode(broken["bad_netns"].sysfs_root) is None


# -- random junk ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    specs = [
        HcaSpec(
            name=f"mlx5_{i}",
            pci_address=f"0000:{0x3B + i:02x}:00.0",
            numa_node=i,
            ports=(PortSpec(netdev=f"eth{i}", ipv4=f"10.0.{i}.1", gid_table_size=8),),
            uverbs_index=i,
        )
        for i in range(2)
    ]
    return build_node(tmp_path_factory.mktemp("fuzz"), specs)


FUZZ_TARGETS = [
    "class/infiniband/mlx5_0/ports/1/state",
    "class/infiniband/mlx5_0/ports/1/phys_state",
    "class/infiniband/mlx5_0/ports/1/rate",
    "class/infiniband/mlx5_0/ports/1/link_layer",
    "class/infiniband/mlx5_0/ports/1/gids/2",
    "class/infiniband/mlx5_0/ports/1/gids/5",
    "class/infiniband/mlx5_0/ports/1/gid_attrs/types/3",
    "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0",
    "class/infiniband/mlx5_0/node_guid",
    "class/infiniband/mlx5_0/device/numa_node",
    "class/infiniband/mlx5_0/device/vendor",
    "class/infiniband_verbs/uverbs0/ibdev",
    "module/ib_core/parameters/netns_mode",
]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    writes=st.lists(st.tuples(st.sampled_from(FUZZ_TARGETS), st.binary(max_size=80)), max_size=6)
)
def test_random_bytes_never_raise(fuzz_node: SimNode, writes: list[tuple[str, bytes]]) -> None:
    for rel, data in writes:
        fuzz_node.write(rel, data)
    inv = _inventory(fuzz_node)
    assert [h.name for h in inv.hcas] == ["mlx5_0", "mlx5_1"]
    assert len(_by_name(inv)["mlx5_1"].ports) == 1
    states = read_port_states(fuzz_node.sysfs_root, ["mlx5_0", "mlx5_1"])
    assert ("mlx5_1", 1) in states
    assert read_netns_mode(fuzz_node.sysfs_root) in (None, "shared", "exclusive")


def test_odd_gid_table_entries_are_named_and_skipped(tmp_path: Path) -> None:
    node = _small(tmp_path)
    gids = node.port_dir("mlx5_0") / "gids"
    (gids / "7").unlink()
    (gids / "7").mkdir()  # unreadable entry
    (gids / "extra").write_text("0000:0000:0000:0000:0000:ffff:0a00:0063\n")
    inv = _inventory(node)
    assert len(inv.warnings) == 2
    assert any(str(gids / "7") in w for w in inv.warnings)
    assert any(str(gids / "extra") in w for w in inv.warnings)
    assert [g.index for g in _by_name(inv)["mlx5_0"].ports[0].gids] == [0, 1, 2, 3]


def test_readers_only_tests_use_live_with_the_tests() -> None:
    from rdma_hca.node import inventory, port_polls

    for module in (port_polls, inventory):
        assert not hasattr(module, "discover")
        assert not hasattr(module, "read_netns_mode")


def test_the_gpus_are_found_with_their_pcie_root(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "n", hcas=4, bond=False, gid_table_size=4)
    # Not GPUs: an NVIDIA function of another class, a function of another vendor, and
    # one whose vendor file cannot be read.
    devices = node.sysfs_root / "bus" / "pci" / "devices"
    for name, vendor, cls in (("0000:e0:00.1", "0x10de", "0x040300"),
                              ("0000:e1:00.0", "0x1002", "0x038000")):
        fn = node.sysfs_root / "devices" / "pci0000:e0" / name
        fn.mkdir(parents=True)
        (fn / "vendor").write_text(vendor + "\n")
        (fn / "class").write_text(cls + "\n")
        (devices / name).symlink_to(os.path.relpath(fn, devices))
    odd = node.sysfs_root / "devices" / "pci0000:e0" / "0000:e2:00.0"
    (odd / "vendor").mkdir(parents=True)
    (devices / "0000:e2:00.0").symlink_to(os.path.relpath(odd, devices))
    inv = discover_node(node.sysfs_root, node.dev_root)
    by_root: dict[str, list[str]] = {}
    for gpu in inv.gpus:
        assert gpu.pcie_root is not None and gpu.device == "0x2330"
        by_root.setdefault(gpu.pcie_root, []).append(gpu.pci_address)
    assert by_root == node.gpus_by_root()
    assert {h.pcie_root for h in inv.hcas} <= set(by_root)  # each HCA has GPUs beside it
    assert inv.gpus[0].dcgm_bus_id == "00000000:" + inv.gpus[0].pci_address[5:].upper()
    assert not any(w for w in inv.warnings if "0000:e" in w)  # not the HCAs' business


def test_a_gpu_bus_id_reads_as_dcgm_writes_it() -> None:
    from rdma_hca.node.model import Gpu

    assert Gpu("0000:3b:00.0", None, None, None).dcgm_bus_id == "00000000:3B:00.0"
    assert Gpu("10000:c1:1f.7", None, None, None).dcgm_bus_id == "00010000:C1:1F.7"
