"""The kinds of node the tests, the demo and the benchmarks run on.

``tree`` holds the machinery (``SimNode``, the specs); this module holds the catalogue:
a GPU server, InfiniBand, eRDMA, Soft RoCE, a node without RDMA. Broken and hostile trees
are in ``hostile``, trees shaped like real machines in ``realworld``, a big SR-IOV node in
``sriov``: import each builder from the module that holds it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rdma_hca.devkit.sim.pcitree import GpuSpec
from rdma_hca.devkit.sim.specs import HcaSpec, PortSpec, guid_text
from rdma_hca.devkit.sim.tree import SimNode, build_node


def _guid(base: int) -> str:
    return guid_text(base.to_bytes(8, "big"))


def _shuffled(count: int) -> list[int]:
    """A fixed permutation that is never the identity, so code that assumes uverbsN
    belongs to the N-th HCA fails on the sim as it would on real GPU servers."""
    order = list(range(count))
    random.Random(7919 + count).shuffle(order)
    if count > 1 and order == sorted(order):
        order = order[1:] + order[:1]
    return order


_SLOTS_PER_DOMAIN = 28  # pairs of HCAs per PCI domain: 8 buses each from 0x08 to 0xe7


def _switch_slot(hca: int, kind: int) -> tuple[str, str, tuple[str, ...]]:
    """(address, root complex, bridges) of HCA number ``hca`` (kind 0) or of the GPU
    beside it (kind 1). Each pair of HCAs gets 8 buses from B: the root complex on B,
    its root port B:01.0, a switch upstream port on B+1, downstream ports on B+2 and
    one endpoint bus each below them: HCA, GPU, HCA, GPU on B+3 to B+6."""
    pair, second = divmod(hca, 2)
    domain, slot = divmod(pair, _SLOTS_PER_DOMAIN)
    base = 0x08 * (slot + 1)
    d = f"{domain:04x}"
    lane = 2 * second + kind
    bridges = (
        f"{d}:{base:02x}:01.0",
        f"{d}:{base + 1:02x}:00.0",
        f"{d}:{base + 2:02x}:{lane:02x}.0",
    )
    return f"{d}:{base + 3 + lane:02x}:00.0", f"pci{d}:{base:02x}", bridges


def gpu_node(
    root: Path,
    *,
    ipv6: bool = False,
    hcas: int = 8,
    bond: bool = True,
    numa_nodes: int = 2,
    gid_table_size: int = 256,
    bond_ipv6: bool | None = None,
) -> SimNode:
    """A GPU server: ``hcas`` ConnectX-7 RoCE v2 HCAs mlx5_0.. (400 Gb/s, netdevs eth0..,
    one IPv4 address each and with ``ipv6`` a global IPv6 address too), spread evenly
    over ``numa_nodes`` NUMA nodes (0 means the platform reports none), uverbs numbers
    shuffled; with ``bond`` also ``mlx5_bond_0``: two 200 Gb/s ports bonded as bond0.
    ``gid_table_size`` below the real 256 only makes builds cheaper for tests.
    ``bond_ipv6=False`` with ``ipv6`` makes the mixed node: the bond keeps only its IPv4
    address, so it has no global IPv6 RoCE GID while the other HCAs have one.

    PCI: every two HCAs share a root complex with two GPUs, behind one PCIe switch, as
    on HGX-class servers (GPU 2k and 2k+1 beside mlx5_2k and mlx5_2k+1); the bond sits
    under a root complex of its own with no GPU. ``node.expected_pcie_root(name)`` and
    ``node.gpus_by_root()`` give the answers.
    """
    total = hcas + (1 if bond else 0)
    order = _shuffled(total)
    specs: list[HcaSpec] = []
    gpus: list[GpuSpec] = []
    for i in range(hcas):
        address, pcie, bridges = _switch_slot(i, 0)
        numa = (i * numa_nodes) // hcas if numa_nodes > 0 else None
        gpu_address, _, gpu_bridges = _switch_slot(i, 1)
        gpus.append(GpuSpec(gpu_address, pcie, gpu_bridges, numa_node=numa))
        port = PortSpec(
            netdev=f"eth{i}",
            ipv4=f"10.{i // 256}.{i % 256}.11",
            ipv6=f"2001:db8:0:{i:x}::11" if ipv6 else None,
            gid_table_size=gid_table_size,
        )
        specs.append(
            HcaSpec(
                name=f"mlx5_{i}",
                pci_address=address,
                pcie_root=pcie,
                bridges=bridges,
                device="0x1021",
                numa_node=numa,
                board_id="MT_0000000838",
                hca_type="MT4129",
                fw_ver="28.39.1002",
                node_guid=_guid(0xB8599F0300D43C22 + 0x100 * i),
                ports=(port,),
                uverbs_index=order[i],
            )
        )
    if bond:
        port = PortSpec(
            netdev="bond0",
            rate="200 Gb/sec (4X HDR)",
            ipv4="192.168.0.11",
            ipv6="2001:db8:ffff::11" if (ipv6 if bond_ipv6 is None else bond_ipv6) else None,
            gid_table_size=gid_table_size,
        )
        specs.append(
            HcaSpec(
                name="mlx5_bond_0",
                pci_address="0000:f1:00.0",
                pcie_root="pci0000:f0",
                bridges=("0000:f0:01.0",),
                device="0x101d",
                numa_node=numa_nodes - 1 if numa_nodes > 0 else None,
                node_guid=_guid(0x0C42A10300B0C0D0),
                ports=(port,),
                uverbs_index=order[hcas],
                bond_slaves=("ens241f0np0", "ens241f1np1"),
            )
        )
    node = build_node(root, specs)
    for gpu in gpus:
        node.add_gpu(gpu)
    return node


@dataclass(frozen=True)
class RoceHca:
    """One single-port RoCE HCA of :func:`roce_node`: its addresses and state.

    ``ipv6_first`` puts the IPv6 GIDs before the IPv4 ones (the address configured
    first gets the lower index), so the same family sits at different indices on
    different HCAs; ``bond_slaves`` makes it a bonded HCA over those netdevs.
    """

    name: str
    ipv4: str | None = None
    ipv6: str | None = None
    up: bool = True
    ipv6_first: bool = False
    netdev: str | None = None
    bond_slaves: tuple[str, ...] = ()


def roce_node(root: Path, hcas: Sequence[RoceHca]) -> SimNode:
    """RoCE v2 HCAs laid out as given, each on a PCIe root of its own (pci0000:N0) with
    netdev ``eth<i>`` unless named: the GID tables NCCL's choice depends on (IPv4 only,
    IPv6 only, both at different indices, a down port, mlx5_1 beside mlx5_10)."""
    specs = []
    for i, h in enumerate(hcas):
        bus = 0x10 * (i + 1)
        specs.append(HcaSpec(
            name=h.name,
            pci_address=f"0000:{bus + 1:02x}:00.0",
            pcie_root=f"pci0000:{bus:02x}",
            bridges=(f"0000:{bus:02x}:01.0",),
            device="0x1021",
            numa_node=0,
            node_guid=_guid(0xB8599F0300D50000 + 0x100 * i),
            ports=(PortSpec(netdev=h.netdev or f"eth{i}", ipv4=h.ipv4, ipv6=h.ipv6, up=h.up,
                            ipv6_first=h.ipv6_first, gid_table_size=16),),
            uverbs_index=i,
            bond_slaves=h.bond_slaves,
        ))
    return build_node(root, specs)


def infiniband_node(root: Path) -> SimNode:
    """One two-port ConnectX HCA on InfiniBand (200 Gb/s HDR), IPoIB ib0/ib1, a subnet
    manager at LID 1, umad and issm per port."""
    ports = tuple(
        PortSpec(
            link_layer="InfiniBand",
            rate="200 Gb/sec (4X HDR)",
            netdev=f"ib{i}",
            gid_table_size=128,
            lid=5 + i,
            sm_lid=1,
        )
        for i in range(2)
    )
    spec = HcaSpec(
        name="mlx5_0",
        pci_address="0000:3b:00.0",
        device="0x101b",
        numa_node=0,
        board_id="MT_0000000223",
        hca_type="MT4123",
        fw_ver="20.39.1002",
        node_guid="0c42:a103:0065:7a10",
        ports=ports,
        uverbs_index=0,
    )
    return build_node(root, [spec])


def erdma_node(root: Path) -> SimNode:
    """A cloud VM with two eRDMA HCAs (driver erdma, vendor 0x1ded) whose NUMA node the
    platform does not report (numa_node reads -1)."""
    specs = [
        HcaSpec(
            name=f"erdma_{i}",
            driver="erdma",
            pci_address=f"0000:00:{5 + i:02x}.0",
            vendor="0x1ded",
            device="0x107f",
            numa_node=None,
            board_id=None,
            hca_type=None,
            fw_ver="0.2.0",
            node_guid=_guid(0x00163E0300112200 + i),
            ports=(
                PortSpec(
                    rate="25 Gb/sec (1X EDR)",
                    netdev=f"eth{i}",
                    ipv4=f"172.16.{i}.10",
                    gid_table_size=16,
                ),
            ),
            uverbs_index=i,
        )
        for i in range(2)
    ]
    return build_node(root, specs)


def soft_roce_node(root: Path, *, siw: bool = False) -> SimNode:
    """Soft RoCE: ``rxe0`` on eth0 with no PCI parent (its netdev is in the ``parent``
    file); with ``siw`` also an iWARP ``siw0`` on eth1 whose ``device`` link is not PCI."""
    specs = [
        HcaSpec(
            name="rxe0",
            driver=None,
            board_id=None,
            hca_type=None,
            fw_ver="0.0.0",
            node_guid="5054:00ff:fe12:3456",
            ports=(PortSpec(rate="10 Gb/sec (4X SDR)", netdev="eth0", ipv4="192.168.122.10"),),
            uverbs_index=0,
            soft_parent="eth0",
        )
    ]
    if siw:
        specs.append(
            HcaSpec(
                name="siw0",
                driver=None,
                board_id=None,
                hca_type=None,
                fw_ver="0.0.0",
                node_guid="5054:00ff:fe12:3457",
                node_type="4: RNIC",
                ports=(PortSpec(rate="10 Gb/sec (4X SDR)", netdev="eth1", gid_table_size=1),),
                uverbs_index=1,
                parent_device="virtual/net/eth1",
            )
        )
    return build_node(root, specs)


def no_rdma_node(root: Path) -> SimNode:
    """A node with a sysfs tree and netdevs but no RDMA modules: no class/infiniband."""
    node = SimNode(Path(root))
    node._make_base(rdma=False, rdma_cm=False, netns_mode=None)
    node._virtual_netdev("eth0")
    return node
