"""A big SR-IOV node: ``pfs`` ConnectX-6 Dx physical functions with ``vfs`` virtual
functions each, every function an RDMA device (8 × (1 + 24) = 200 by default), which is
more than one ResourceSlice may hold."""

from __future__ import annotations

from pathlib import Path

from rdma_hca.devkit.sim.specs import HcaSpec, PortSpec
from rdma_hca.devkit.sim.tree import SimNode, build_node

PF_DEVICE = "0x101d"  # ConnectX-6 Dx
VF_DEVICE = "0x101e"  # its virtual function


def sriov_node(root: Path, *, pfs: int = 8, vfs: int = 24, gid_table_size: int = 2) -> SimNode:
    """PF ``i`` is mlx5_<i*(vfs+1)> at 0000:<bus>:00.0; its VFs follow it, numbered on,
    at functions 00.2 onwards of the same bus; netdevs enp<bus>s0 and enp<bus>s0v<j>."""
    specs: list[HcaSpec] = []
    for i in range(pfs):
        bus = 0x10 + i * 0x10
        root_complex = f"pci0000:{bus - 1:02x}"
        functions = [(f"0000:{bus:02x}:00.0", PF_DEVICE, f"enp{bus}s0")]
        for j in range(vfs):
            slot = j + 2
            functions.append((f"0000:{bus:02x}:{slot // 8:02x}.{slot % 8}", VF_DEVICE,
                              f"enp{bus}s0v{j}"))
        for k, (address, device, netdev) in enumerate(functions):
            index = i * (vfs + 1) + k
            specs.append(HcaSpec(
                name=f"mlx5_{index}",
                pci_address=address,
                pcie_root=root_complex,
                bridges=(f"0000:{bus - 1:02x}:01.0",),
                device=device,
                numa_node=i * 2 // pfs,
                node_guid=f"b859:9f03:{i:04x}:{k:04x}",
                ports=(PortSpec(netdev=netdev, ipv4=f"10.{i}.{k}.11",
                                gid_table_size=gid_table_size),),
                uverbs_index=index,
            ))
    return build_node(root, specs)
