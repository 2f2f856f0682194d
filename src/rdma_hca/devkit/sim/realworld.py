"""Trees shaped like real machines' sysfs, written from what those machines print.

They differ from the tidy catalogue in the ways real dumps do: mlx4 fills its unused
InfiniBand GID entries with the subnet prefix and a zero interface ID, a LAG bond spreads
one HCA over two PCI functions, a second port sits polling with no cable, PCI functions
hang behind root ports under several root complexes.
"""

from __future__ import annotations

from pathlib import Path

from rdma_hca.devkit.sim.specs import HcaSpec, PortSpec
from rdma_hca.devkit.sim.tree import SimNode, build_node

IB_PREFIX_ONLY = "fe80:0000:0000:0000:0000:0000:0000:0000"


def mlx4_infiniband_node(root: Path) -> SimNode:
    """A ConnectX-3 (mlx4_0) on FDR InfiniBand: port 1 ACTIVE at 56 Gb/s with its port
    GID in entry 0 and the other 127 entries of its 128-entry table prefix-only; port 2
    has no cable (DOWN/Polling). IPoIB ib0/ib1, umad and issm per port, under
    ``pci0000:80``."""
    ports = (
        PortSpec(
            link_layer="InfiniBand",
            rate="56 Gb/sec (4X FDR)",
            netdev="ib0",
            gid_table_size=128,
            lid=0x1B,
            sm_lid=0x1,
            unused_gid=IB_PREFIX_ONLY,
        ),
        PortSpec(
            link_layer="InfiniBand",
            up=False,
            rate="10 Gb/sec (4X SDR)",
            netdev="ib1",
            gid_table_size=128,
            unused_gid=IB_PREFIX_ONLY,
        ),
    )
    spec = HcaSpec(
        name="mlx4_0",
        driver="mlx4_core",
        pci_address="0000:81:00.0",
        pcie_root="pci0000:80",
        bridges=("0000:80:02.0",),
        device="0x1003",
        numa_node=1,
        board_id="MT_1090120019",
        hca_type="MT4099",
        fw_ver="2.42.5000",
        node_guid="f452:1403:0017:1ac0",
        ports=ports,
        uverbs_index=0,
    )
    node = build_node(root, [spec])
    # A port with no cable polls for a peer; the sim's "down" port is Disabled.
    node.write("class/infiniband/mlx4_0/ports/2/phys_state", "2: Polling\n")
    return node


def mlx5_roce_bond_node(root: Path) -> SimNode:
    """A ConnectX-6 Dx in LAG mode (mlx5_bond_0 over ens1f0np0/ens1f1np1 as bond0, IPv4
    and global IPv6 RoCE v2 GIDs) beside a ConnectX-6 Dx port with its link down
    (mlx5_2 on ens2f0np0). Two root complexes, one per card."""
    bond = HcaSpec(
        name="mlx5_bond_0",
        pci_address="0000:98:00.0",
        pcie_root="pci0000:97",
        bridges=("0000:97:02.0",),
        device="0x101d",
        numa_node=1,
        board_id="MT_0000000359",
        hca_type="MT4125",
        fw_ver="22.36.1010",
        node_guid="1070:fd03:00a5:9a3c",
        ports=(PortSpec(rate="100 Gb/sec (2X HDR)", netdev="bond0", ipv4="10.224.1.7",
                        ipv6="2001:db8:e0::7"),),
        uverbs_index=1,
        bond_slaves=("ens1f0np0", "ens1f1np1"),
    )
    single = HcaSpec(
        name="mlx5_2",
        pci_address="0000:3b:00.0",
        pcie_root="pci0000:3a",
        bridges=("0000:3a:00.0",),
        device="0x101d",
        numa_node=0,
        board_id="MT_0000000359",
        hca_type="MT4125",
        fw_ver="22.36.1010",
        node_guid="1070:fd03:00a5:9b10",
        ports=(PortSpec(up=False, rate="100 Gb/sec (2X HDR)", netdev="ens2f0np0"),),
        uverbs_index=0,
    )
    return build_node(root, [bond, single])
