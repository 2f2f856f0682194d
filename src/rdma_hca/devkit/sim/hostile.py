"""Broken and hostile trees: what a half-finished hot unplug, a confused driver or a
stuck HCA leaves in sysfs. Each is a healthy node damaged in one named way; ``damaged``
lists the broken paths so tests can check that discovery names every one.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from rdma_hca.devkit.sim.specs import HcaSpec, PortSpec, guid_text
from rdma_hca.devkit.sim.tree import SimNode, build_node


def _guid(base: int) -> str:
    return guid_text(base.to_bytes(8, "big"))


def _two_hcas() -> list[HcaSpec]:
    return [
        HcaSpec(
            name=f"mlx5_{i}",
            pci_address=f"0000:{0x3B + i:02x}:00.0",
            numa_node=0,
            node_guid=_guid(0xB8599F0300D43C22 + 0x100 * i),
            ports=(PortSpec(netdev=f"eth{i}", ipv4=f"10.0.{i}.1", gid_table_size=16),),
            uverbs_index=1 - i,
        )
        for i in range(2)
    ]


def broken_nodes(root: Path) -> dict[str, SimNode]:
    """Trees that are broken in one way each, every one built from two healthy HCAs
    (mlx5_0, mlx5_1) and then damaged. ``node.damaged`` lists the broken paths.

    - ``dangling_symlink``: class/infiniband/mlx5_9 points nowhere
    - ``dangling_device``: mlx5_1's ``device`` link points nowhere
    - ``garbage_state``: mlx5_0 port 1 state/phys_state and numa_node hold garbage
    - ``missing_uverbs``: mlx5_1 has no infiniband_verbs entry
    - ``missing_dev_node``: mlx5_1's uverbs device node is missing under dev_root
    - ``empty_port``: mlx5_0 has a port directory 2 with no files in it
    - ``bad_port_name``: mlx5_0 has a port directory named "abc"
    - ``binary_junk``: binary junk in fw_ver, node_guid, rate, a GID and a GID type
    - ``dangling_uverbs``: class/infiniband_verbs/uverbs9 points nowhere
    - ``bad_netns``: ib_core's netns_mode holds "maybe"
    """
    root = Path(root)
    nodes: dict[str, SimNode] = {}

    def make(name: str) -> SimNode:
        node = build_node(root / name, _two_hcas())
        nodes[name] = node
        return node

    node = make("dangling_symlink")
    link = node.hca_dir("mlx5_9")
    os.symlink("../../devices/pci0000:00/0000:00:1f.0/0000:ff:00.0/infiniband/mlx5_9", link)
    node.damaged.append(link)

    node = make("dangling_device")
    dev = node.hca_dir("mlx5_1") / "device"
    dev.unlink()
    os.symlink("../../../0000:ee:00.0", dev)
    node.damaged.append(dev)

    node = make("garbage_state")
    node.damaged.append(node.write("class/infiniband/mlx5_0/ports/1/state", "banana\n"))
    junk = b"5: \xffUp\x00\n"
    node.damaged.append(node.write("class/infiniband/mlx5_0/ports/1/phys_state", junk))
    pci = node.pci_dir("mlx5_0")
    assert pci is not None
    (pci / "numa_node").write_text("lots\n")
    node.damaged.append(pci / "numa_node")

    first, second = _two_hcas()
    node = build_node(root / "missing_uverbs", [first, replace(second, has_uverbs=False)])
    nodes["missing_uverbs"] = node
    node.damaged.append(node.sysfs_root / "class" / "infiniband_verbs")

    node = make("missing_dev_node")
    node.remove_dev_node(node.uverbs_name("mlx5_1"))
    node.damaged.append(node.dev_root / "infiniband" / node.uverbs_name("mlx5_1"))

    node = make("empty_port")
    empty = node.hca_dir("mlx5_0") / "ports" / "2"
    empty.mkdir()
    node.damaged.append(empty)

    node = make("bad_port_name")
    bad = node.hca_dir("mlx5_0") / "ports" / "abc"
    bad.mkdir()
    node.damaged.append(bad)

    node = make("binary_junk")
    for rel, junk in (
        ("class/infiniband/mlx5_0/fw_ver", b"\xff\xfe\x00\x01junk"),
        ("class/infiniband/mlx5_0/node_guid", b"\x89PNG\r\n\x1a\n"),
        ("class/infiniband/mlx5_1/ports/1/rate", b"\x00\x00\x00\x00"),
        ("class/infiniband/mlx5_1/ports/1/gids/3", b"\xde\xad\xbe\xef" * 10),
        ("class/infiniband/mlx5_1/ports/1/gid_attrs/types/1", b"RoCE \xff\n"),
    ):
        node.damaged.append(node.write(rel, junk))

    node = make("dangling_uverbs")
    link = node.sysfs_root / "class" / "infiniband_verbs" / "uverbs9"
    os.symlink("../../devices/virtual/infiniband_verbs/uverbs9", link)
    node.damaged.append(link)

    node = make("bad_netns")
    node.damaged.append(node.write("module/ib_core/parameters/netns_mode", "maybe\n"))
    return nodes


def hostile_nodes(root: Path) -> dict[str, SimNode]:
    """Trees whose content no well-behaved kernel writes, but bytes on disk can hold:

    - ``prefix_only_gids``: an InfiniBand port whose 64 unused GID entries hold the
      subnet prefix with a zero interface ID (only entry 0 is a GID)
    - ``non_utf8_names``: an HCA named ``mlx5_\\xff`` and a netdev ``eth\\xfe1`` (bytes
      that are not UTF-8)
    - ``impossible_numbers``: a 400-digit rate, LID, NUMA node and counter
    - ``state_mismatch``: phys_state ``5: Polling`` (the number says LinkUp) on mlx5_0
      and ``3: LinkUp`` (Disabled) on mlx5_1
    - ``unreadable_state``: mlx5_0's port state is a directory (reads fail with EISDIR)

    ``damaged`` lists the paths discovery must name in a warning.
    """
    root = Path(root)
    nodes: dict[str, SimNode] = {}

    ib = PortSpec(link_layer="InfiniBand", rate="200 Gb/sec (4X HDR)", netdev="ib0",
                  gid_table_size=64, lid=7, sm_lid=1,
                  unused_gid="fe80:0000:0000:0000:0000:0000:0000:0000")
    spec = HcaSpec(name="mlx5_0", pci_address="0000:3b:00.0", device="0x101b",
                   node_guid="0c42:a103:0065:7a10", ports=(ib,), uverbs_index=0)
    nodes["prefix_only_gids"] = build_node(root / "prefix_only_gids", [spec])

    first, second = _two_hcas()
    odd_hca = replace(first, name=os.fsdecode(b"mlx5_\xff"))
    odd_port = replace(second.ports[0], netdev=os.fsdecode(b"eth\xfe1"))
    node = build_node(root / "non_utf8_names", [odd_hca, replace(second, ports=(odd_port,))])
    node.damaged.append(node.hca_dir(odd_hca.name))
    nodes["non_utf8_names"] = node

    node = build_node(root / "impossible_numbers", _two_hcas())
    huge = "9" * 400
    for rel, content in (
        ("class/infiniband/mlx5_0/ports/1/rate", f"{huge} Gb/sec (4X NDR)\n"),
        ("class/infiniband/mlx5_1/device/numa_node", f"{huge}\n"),
    ):
        node.damaged.append(node.write(rel, content))
    node.set_counter("mlx5_0", 1, "port_rcv_data", 0)
    node.write("class/infiniband/mlx5_0/ports/1/counters/port_rcv_data", f"{huge}\n")
    nodes["impossible_numbers"] = node

    node = build_node(root / "state_mismatch", _two_hcas())
    node.damaged.append(node.write("class/infiniband/mlx5_0/ports/1/phys_state", "5: Polling\n"))
    node.damaged.append(node.write("class/infiniband/mlx5_1/ports/1/phys_state", "3: LinkUp\n"))
    nodes["state_mismatch"] = node

    node = build_node(root / "unreadable_state", _two_hcas())
    state = node.port_dir("mlx5_0") / "state"
    state.unlink()
    state.mkdir()
    node.damaged.append(state)
    nodes["unreadable_state"] = node
    return nodes
