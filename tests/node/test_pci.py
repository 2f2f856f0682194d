"""PCI topology: each HCA's bus ID and PCIe root, checked against trees whose answer is known.

Kubernetes defines ``resource.kubernetes.io/pcieRoot`` as the first component of the
function's path under /sys/devices, found through /sys/bus/pci/devices/<bus id>; the
tests compute it that way, independently of discovery, as well as from the sim's specs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.specs import HcaSpec, PortSpec
from rdma_hca.devkit.sim.tree import SimNode, build_node
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.model import Hca


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return sim.gpu_node(tmp_path_factory.mktemp("gpu"), gid_table_size=8)


def _hcas(node: SimNode) -> dict[str, Hca]:
    return {h.name: h for h in discover_node(node.sysfs_root, node.dev_root).hcas}


def _root_the_kubernetes_way(sysfs: Path, bus_id: str) -> str:
    link = sysfs / "bus" / "pci" / "devices" / bus_id
    target = os.path.normpath(os.path.join(link.parent, os.readlink(link)))
    rel = os.path.relpath(target, sysfs / "devices")
    assert os.path.basename(target) == bus_id
    return rel.split(os.sep)[0]


def test_every_hca_has_the_root_of_its_tree(gpu: SimNode) -> None:
    hcas = _hcas(gpu)
    assert set(hcas) == set(gpu.specs)
    for name, hca in hcas.items():
        spec = gpu.specs[name]
        assert hca.pci_bus_id == spec.pci_address
        assert hca.pcie_root == gpu.expected_pcie_root(name)
        assert hca.pcie_root is not None
        assert hca.pcie_root == _root_the_kubernetes_way(gpu.sysfs_root, spec.pci_address or "")


def test_gpu_node_has_several_roots_each_with_two_gpus_beside_two_hcas(gpu: SimNode) -> None:
    hcas = _hcas(gpu)
    roots = {h.pcie_root for h in hcas.values()}
    assert len(roots) == 5  # four GPU switches and the bond's own root
    gpus = gpu.gpus_by_root()
    assert len(gpus) == 4
    for name, hca in hcas.items():
        beside = [h for h in hcas.values() if h.pcie_root == hca.pcie_root]
        if name == "mlx5_bond_0":
            assert hca.pcie_root not in gpus
            assert beside == [hca]
            continue
        assert hca.pcie_root is not None
        assert len(gpus[hca.pcie_root]) == 2
        assert len(beside) == 2
    for root, addresses in gpus.items():
        for address in addresses:
            function = (gpu.sysfs_root / "bus" / "pci" / "devices" / address).resolve()
            assert (function / "vendor").read_text() == "0x10de\n"
            assert (function / "class").read_text() == "0x030200\n"
            assert _root_the_kubernetes_way(gpu.sysfs_root, address) == root


def test_function_on_the_root_bus_and_default_topology(tmp_path: Path) -> None:
    erdma = sim.erdma_node(tmp_path / "erdma")
    for name, hca in _hcas(erdma).items():
        assert hca.pcie_root == "pci0000:00" == erdma.expected_pcie_root(name)
        assert hca.pci_bus_id == erdma.specs[name].pci_address


def test_soft_devices_have_no_pci_place(tmp_path: Path) -> None:
    node = sim.soft_roce_node(tmp_path / "soft", siw=True)
    for name, hca in _hcas(node).items():
        assert (hca.pci_bus_id, hca.pcie_root) == (None, None)
        assert node.expected_pcie_root(name) is None


def test_bus_id_outside_the_standard_form_gets_no_attributes(tmp_path: Path) -> None:
    # VMD domains have five digits; Kubernetes accepts only four, so no pciBusID/pcieRoot.
    spec = HcaSpec(name="mlx5_0", pci_address="10000:e1:00.0", pcie_root="pci10000:e0",
                       bridges=("10000:e0:01.0",), uverbs_index=0,
                       ports=(PortSpec(netdev="eth0", gid_table_size=4),))
    node = build_node(tmp_path / "vmd", [spec])
    hca = _hcas(node)["mlx5_0"]
    assert hca.pci_address == "10000:e1:00.0"
    assert (hca.pci_bus_id, hca.pcie_root) == (None, None)


def test_device_under_a_non_pci_root_has_no_pcie_root(tmp_path: Path) -> None:
    spec = HcaSpec(name="hns_0", driver=None, pci_address=None,
                       parent_device="platform/HISI00C2:00", uverbs_index=0,
                       ports=(PortSpec(netdev="eth0", gid_table_size=4),))
    hca = _hcas(build_node(tmp_path / "platform", [spec]))["hns_0"]
    assert (hca.pci_address, hca.pci_bus_id, hca.pcie_root) == (None, None, None)
