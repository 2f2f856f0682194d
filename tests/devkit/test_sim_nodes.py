"""The simulated nodes look like real sysfs and dev trees and change like them."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.hostile import broken_nodes, hostile_nodes
from rdma_hca.devkit.sim.realworld import mlx4_infiniband_node, mlx5_roce_bond_node
from rdma_hca.devkit.sim.specs import HcaSpec
from rdma_hca.devkit.sim.tree import SimNode, build_node

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000\n"


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return sim.gpu_node(tmp_path_factory.mktemp("gpu"))


def _links(root: Path) -> list[Path]:
    """Every symlink under root (os.walk does not follow them, so none is visited twice)."""
    found = [Path(d) / n for d, dirs, files in os.walk(root) for n in dirs + files]
    return [p for p in found if p.is_symlink()]


def test_class_entries_are_relative_links_into_devices(gpu: SimNode) -> None:
    cls = gpu.sysfs_root / "class" / "infiniband"
    assert sorted(p.name for p in cls.iterdir()) == sorted(gpu.specs)
    for entry in cls.iterdir():
        target = os.readlink(entry)
        assert target.startswith(f"../../devices/{gpu.expected_pcie_root(entry.name)}/")
        assert target.endswith(f"/infiniband/{entry.name}")
        assert entry.resolve().is_dir()


def test_every_symlink_resolves(gpu: SimNode) -> None:
    links = _links(gpu.sysfs_root)
    assert len(links) > 30
    assert [p for p in links if not p.exists()] == []


def test_pci_function_directory(gpu: SimNode) -> None:
    pci = gpu.pci_dir("mlx5_6")
    assert pci is not None
    assert (gpu.hca_dir("mlx5_6") / "device").resolve() == pci.resolve()
    assert (pci / "vendor").read_text() == "0x15b3\n"
    assert (pci / "device").read_text() == "0x1021\n"
    assert (pci / "numa_node").read_text() == "1\n"
    assert os.path.basename(os.readlink(pci / "driver")) == "mlx5_core"
    assert (pci / "net" / "eth6").is_dir()


def test_abi_version_files_beside_devices(gpu: SimNode) -> None:
    verbs = gpu.sysfs_root / "class" / "infiniband_verbs"
    assert (verbs / "abi_version").is_file()
    assert not (verbs / "abi_version").is_symlink()
    assert (gpu.sysfs_root / "class" / "infiniband_mad" / "abi_version").is_file()
    for name in gpu.specs:
        uverbs = verbs / gpu.uverbs_name(name)
        assert (uverbs / "ibdev").read_text() == f"{name}\n"


def test_uverbs_numbers_are_shuffled_and_unique(gpu: SimNode) -> None:
    numbers = [gpu.specs[f"mlx5_{i}"].uverbs_index for i in range(8)]
    numbers.append(gpu.specs["mlx5_bond_0"].uverbs_index)
    assert sorted(numbers) == list(range(9))
    assert numbers != list(range(9))


def test_dev_tree_has_a_file_per_device(gpu: SimNode) -> None:
    dev = gpu.dev_root / "infiniband"
    expected = {gpu.uverbs_name(n) for n in gpu.specs} | {gpu.umad_name(n) for n in gpu.specs}
    expected.add("rdma_cm")
    assert {p.name for p in dev.iterdir()} == expected
    assert all(p.is_file() and p.stat().st_size == 0 for p in dev.iterdir())


def test_gid_table_has_every_entry(gpu: SimNode) -> None:
    gids = gpu.port_dir("mlx5_0") / "gids"
    entries = sorted(int(p.name) for p in gids.iterdir())
    assert entries == list(range(256))
    assert (gids / "255").read_text() == ZERO_GID
    assert (gids / "3").read_text() == "0000:0000:0000:0000:0000:ffff:0a00:000b\n"
    types = gpu.port_dir("mlx5_0") / "gid_attrs" / "types"
    assert (types / "3").read_text() == "RoCE v2\n"
    assert (types / "2").read_text() == "IB/RoCE v1\n"
    ndevs = gpu.port_dir("mlx5_0") / "gid_attrs" / "ndevs"
    assert (ndevs / "0").read_text() == "eth0\n"


def test_port_attributes(gpu: SimNode) -> None:
    port = gpu.port_dir("mlx5_1")
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "phys_state").read_text() == "5: LinkUp\n"
    assert (port / "link_layer").read_text() == "Ethernet\n"
    assert (port / "rate").read_text() == "400 Gb/sec (4X NDR)\n"
    assert (port / "counters" / "port_rcv_data").read_text() == "0\n"


def test_bond_slaves_are_enslaved_to_bond0(gpu: SimNode) -> None:
    pci = gpu.pci_dir("mlx5_bond_0")
    assert pci is not None
    slave = pci / "net" / "ens241f0np0"
    assert os.path.basename(os.readlink(slave / "master")) == "bond0"
    second = pci.parent / "0000:f1:00.1" / "net" / "ens241f1np1"
    assert (second / "master").resolve().name == "bond0"
    assert (gpu.sysfs_root / "class" / "net" / "bond0").resolve().is_dir()


def test_gpu_node_sizes_and_numa(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "big", hcas=64, bond=False, numa_nodes=4, gid_table_size=4)
    assert node.hca_names == [f"mlx5_{i}" for i in range(64)]
    assert len({s.pci_address for s in node.specs.values()}) == 64
    assert [node.specs[f"mlx5_{i}"].numa_node for i in (0, 15, 16, 63)] == [0, 0, 1, 3]
    flat = sim.gpu_node(tmp_path / "flat", hcas=2, bond=False, numa_nodes=0, gid_table_size=4)
    pci = flat.pci_dir("mlx5_0")
    assert pci is not None
    assert (pci / "numa_node").read_text() == "-1\n"


def test_infiniband_node_has_umad_and_issm_per_port(ib_node: SimNode) -> None:
    mad = ib_node.sysfs_root / "class" / "infiniband_mad"
    for port in (1, 2):
        for name in (ib_node.umad_name("mlx5_0", port), ib_node.issm_name("mlx5_0", port)):
            assert (mad / name / "ibdev").read_text() == "mlx5_0\n"
            assert (mad / name / "port").read_text() == f"{port}\n"
            assert (ib_node.dev_root / "infiniband" / name).is_file()
        assert (ib_node.port_dir("mlx5_0", port) / "link_layer").read_text() == "InfiniBand\n"
    gid0 = (ib_node.port_dir("mlx5_0", 2) / "gids" / "0").read_text()
    assert gid0 == "fe80:0000:0000:0000:0c42:a103:0065:7a11\n"
    assert len(list((ib_node.port_dir("mlx5_0", 1) / "gids").iterdir())) == 128
    pci = ib_node.pci_dir("mlx5_0")
    assert pci is not None
    assert (pci / "net" / "ib1" / "dev_port").read_text() == "1\n"


def test_erdma_node(erdma_node: SimNode) -> None:
    for name in ("erdma_0", "erdma_1"):
        pci = erdma_node.pci_dir(name)
        assert pci is not None
        assert (pci / "vendor").read_text() == "0x1ded\n"
        assert (pci / "numa_node").read_text() == "-1\n"
        assert os.path.basename(os.readlink(pci / "driver")) == "erdma"


def test_soft_roce_node(soft_roce_node: SimNode) -> None:
    rxe = soft_roce_node.hca_dir("rxe0")
    assert os.readlink(rxe) == "../../devices/virtual/infiniband/rxe0"
    assert (rxe / "parent").read_text() == "eth0\n"
    assert not os.path.lexists(rxe / "device")
    assert soft_roce_node.pci_dir("rxe0") is None
    siw_device = (soft_roce_node.hca_dir("siw0") / "device").resolve()
    assert siw_device == (soft_roce_node.sysfs_root / "devices/virtual/net/eth1").resolve()


def test_no_rdma_node(tmp_path: Path) -> None:
    node = sim.no_rdma_node(tmp_path)
    assert (node.sysfs_root / "class" / "net" / "eth0").exists()
    assert not (node.sysfs_root / "class" / "infiniband").exists()
    assert not (node.dev_root / "infiniband").exists()
    assert node.specs == {}


def test_remove_and_add_hca(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path, hcas=3, gid_table_size=4)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    uverbs = node.uverbs_name("mlx5_bond_0")
    node.remove_hca("mlx5_bond_0")
    assert node.hca_names == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert not os.path.lexists(node.hca_dir("mlx5_bond_0"))
    assert not (node.dev_root / "infiniband" / uverbs).exists()
    assert not (node.sysfs_root / "class" / "net" / "ens241f0np0").exists()
    assert [p for p in _links(node.sysfs_root) if not p.exists()] == []
    assert "mlx5_bond_0" in node.specs  # kept so it can come back
    node.add_hca(node.specs["mlx5_bond_0"])
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert after == before


def test_bad_changes_are_refused(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "n", hcas=2, bond=False, gid_table_size=4)
    with pytest.raises(ValueError, match="already present"):
        node.add_hca(node.specs["mlx5_0"])
    taken = node.specs["mlx5_0"].uverbs_index
    clash = HcaSpec(name="mlx5_9", pci_address="0000:99:00.0", uverbs_index=taken)
    with pytest.raises(ValueError, match="uverbs"):
        node.add_hca(clash)
    with pytest.raises(KeyError, match="mlx5_10"):
        node.set_port("mlx5_10", up=False)
    with pytest.raises(KeyError):
        node.set_port("mlx5_1", 2, up=False)
    with pytest.raises(ValueError, match="shared"):
        node.set_netns_mode("sometimes")
    twice = [HcaSpec(name="a", uverbs_index=0), HcaSpec(name="a", uverbs_index=1)]
    with pytest.raises(ValueError, match="unique"):
        build_node(tmp_path / "dup", twice)


def test_live_changes(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path, hcas=2, bond=False, gid_table_size=4)
    node.set_port("mlx5_1", up=False)
    assert (node.port_dir("mlx5_1") / "state").read_text() == "1: DOWN\n"
    assert (node.port_dir("mlx5_1") / "phys_state").read_text() == "3: Disabled\n"
    assert node.specs["mlx5_1"].ports[0].up is False
    node.set_port("mlx5_1", up=True)
    assert (node.port_dir("mlx5_1") / "state").read_text() == "4: ACTIVE\n"
    node.set_counter("mlx5_0", 1, "port_xmit_data", 42)
    assert (node.port_dir("mlx5_0") / "counters" / "port_xmit_data").read_text() == "42\n"
    netns = node.sysfs_root / "module" / "ib_core" / "parameters" / "netns_mode"
    assert netns.read_text() == "Y\n"
    node.set_netns_mode("exclusive")
    assert netns.read_text() == "N\n"
    name = node.uverbs_name("mlx5_0")
    node.remove_dev_node(name)
    assert not (node.dev_root / "infiniband" / name).exists()
    node.restore_dev_node(name)
    assert (node.dev_root / "infiniband" / name).is_file()
    written = node.write("class/infiniband/mlx5_0/ports/1/gids/3", b"junk")
    assert written.read_bytes() == b"junk"
    assert (node.port_dir("mlx5_0") / "gids" / "2").read_text() != "junk"


def test_broken_nodes_mark_what_they_damaged(tmp_path: Path) -> None:
    nodes = broken_nodes(tmp_path)
    assert len(nodes) == 10
    for name, node in nodes.items():
        assert node.damaged, name
        if name != "missing_dev_node":
            assert all(os.path.lexists(p) for p in node.damaged), name
    missing = nodes["missing_dev_node"]
    assert not missing.damaged[0].exists()
    assert not (nodes["dangling_symlink"].hca_dir("mlx5_9")).exists()
    state = nodes["garbage_state"].port_dir("mlx5_0") / "state"
    assert state.read_text() == "banana\n"


def test_a_file_can_become_a_fifo_and_back(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "n", hcas=1, bond=False, gid_table_size=4)
    rel = "class/infiniband/mlx5_0/ports/1/state"
    path = node.replace_with_fifo(rel)
    real = Path(os.path.realpath(path))
    assert stat.S_ISFIFO(real.stat().st_mode)
    # A reader blocked in open() returns once the FIFO is released (or, had it not got
    # there yet, reads the file put back).
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(real.read_bytes()), daemon=True)
    reader.start()
    reader.join(0.05)
    assert reader.is_alive()
    node.release_fifos()
    reader.join(10)
    assert not reader.is_alive()
    assert got and got[0] in (b"", b"4: ACTIVE\n")
    assert real.read_text() == "4: ACTIVE\n"
    assert node.fifos == {}
    assert not any(p.name.endswith((".fifo-released", ".fifo-sim")) for p in real.parent.iterdir())


def test_pci_functions_are_linked_from_the_pci_bus(gpu: SimNode) -> None:
    bus = gpu.sysfs_root / "bus" / "pci" / "devices"
    for name, spec in gpu.specs.items():
        assert spec.pci_address is not None
        assert (bus / spec.pci_address).resolve() == gpu.pci_dir(name).resolve()  # type: ignore[union-attr]
    gpus = [a for addresses in gpu.gpus_by_root().values() for a in addresses]
    assert len(gpus) == 8
    for address in gpus:
        function = (bus / address).resolve()
        assert function.parent.parent.parent.parent.name.startswith("pci0000:")
        assert (function / "class").read_text() == "0x030200\n"


def test_hostile_and_real_world_builders(tmp_path: Path) -> None:
    hostile = hostile_nodes(tmp_path / "hostile")
    assert all(n.damaged for k, n in hostile.items() if k != "prefix_only_gids")
    odd = hostile["non_utf8_names"].sysfs_root / "class" / "infiniband"
    assert b"mlx5_\xff" in os.listdir(os.fsencode(odd))
    mlx4 = mlx4_infiniband_node(tmp_path / "mlx4")
    gids = mlx4.port_dir("mlx4_0") / "gids"
    assert {(gids / str(i)).read_text() for i in range(1, 128)} == {
        "fe80:0000:0000:0000:0000:0000:0000:0000\n"}
    lag = mlx5_roce_bond_node(tmp_path / "lag")
    assert lag.expected_pcie_root("mlx5_bond_0") == "pci0000:97"
