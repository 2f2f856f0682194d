"""The LLDP scenario on a real kernel, run in a network namespace of its own.

``test_lldp_kernel`` runs this file under ``unshare --net --map-root-user``: it makes veth
pairs, writes a simulated sysfs whose HCAs name one end of each as their netdevs (a
bond's members for the bonded HCA), runs the real listener with real AF_PACKET sockets,
sends LLDP frames from the other ends (well-formed, malformed, a flood, a switch
replaced, TTL 0, a TTL that runs out) and prints what it saw as JSON.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from rdma_hca.contract.fabric import SWITCH, SWITCH_PORT
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.daemon.fabric.listener import LldpListener
from rdma_hca.devkit.sim.specs import HcaSpec, PortSpec
from rdma_hca.devkit.sim.tree import build_node
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.node.deadline_reader import NodeReader
from rdma_hca.node.lldp import build_frame
from rdma_hca.settings.model import Mode

# HCA side <-> switch side.
PAIRS = {"hca0": "sw0", "m0": "swm0", "m1": "swm1"}
LEAF_1 = bytes.fromhex("0c42a1000001")
LEAF_2 = bytes.fromhex("0c42a1000002")
FLOOD = 3000


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def wires() -> dict[str, socket.socket]:
    for hca_end, switch_end in PAIRS.items():
        ip("link", "add", hca_end, "type", "veth", "peer", "name", switch_end)
        ip("link", "set", hca_end, "up")
        ip("link", "set", switch_end, "up")
    out = {}
    for switch_end in PAIRS.values():
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        s.bind((switch_end, 0))
        out[switch_end] = s
    return out


async def scenario(root: Path) -> dict[str, Any]:
    send = wires()
    node = build_node(root, [
        HcaSpec(name="mlx5_0", pci_address="0000:3b:00.0",
                ports=(PortSpec(netdev="hca0", ipv4="10.0.0.1", gid_table_size=4),)),
        HcaSpec(name="mlx5_bond_0", pci_address="0000:98:00.0", node_guid="1070:fd03:00a5:9a3c",
                uverbs_index=1, bond_slaves=("m0", "m1"),
                ports=(PortSpec(netdev="bond0", ipv4="10.0.0.2", gid_table_size=4),)),
    ])
    inventory = await NodeReader(node.sysfs_root, node.dev_root, deadline=5.0).discover()
    lis = LldpListener(str(node.sysfs_root), hold_seconds=2.0, files=OffLoop(5.0))
    run = asyncio.create_task(lis.run())
    out: dict[str, Any] = {}
    try:
        await lis.follow(inventory)
        out["listening"] = sorted(lis.stats().netdevs)
        out["off"] = lis.stats().off

        def switch_of(hca: str) -> str | None:
            return next((n.switch for n in lis.neighbours.value if n.hca == hca), None)

        send["sw0"].send(build_frame(LEAF_1, "Ethernet1", system_name="leaf-1"))
        out["heard"] = await wait_until(lambda: switch_of("mlx5_0") == "leaf-1", 5.0)
        good = lis.neighbours.generation
        good_frame = build_frame(LEAF_1, "Ethernet1", system_name="leaf-1")
        for bad in (good_frame[:30], bytes(6) + good_frame[6:],
                    good_frame[:14] + b"\x04\x07\x04" + bytes(6)):
            send["sw0"].send(bad.ljust(60, b"\0"))
        await wait_until(lambda: sum(lis.stats().dropped.values()) >= 3, 5.0)
        out["dropped_bad"] = dict(lis.stats().dropped)
        out["unchanged_by_garbage"] = lis.neighbours.generation == good

        await asyncio.sleep(0.3)  # a few tokens back in the bucket
        send["sw0"].send(build_frame(LEAF_2, "Ethernet5", system_name="leaf-2"))
        out["replaced"] = await wait_until(lambda: switch_of("mlx5_0") == "leaf-2", 5.0)
        out["changes_for_replace"] = lis.neighbours.generation - good
        offer = DeviceOffer.build(inventory.hcas, "rdma-hca.io", Mode.SHARED, True, None,
                                  neighbours={n.hca: n for n in lis.neighbours.value})
        attrs = {d["name"]: d["attributes"] for d in offer.devices}
        out["slice_switch"] = attrs["mlx5-0"].get(f"rdma-hca.io/{SWITCH}")
        out["slice_switch_port"] = attrs["mlx5-0"].get(f"rdma-hca.io/{SWITCH_PORT}")

        send["swm1"].send(build_frame(LEAF_2, "Ethernet9", system_name="leaf-2"))
        out["bond_heard"] = await wait_until(lambda: switch_of("mlx5_bond_0") == "leaf-2", 5.0)
        out["bond_netdev"] = next(n.netdev for n in lis.neighbours.value
                                  if n.hca == "mlx5_bond_0")

        before = lis.stats().frames.get("hca0", 0)
        seen = lis.neighbours.generation
        flood = build_frame(LEAF_1, "Ethernet66", system_name="rogue")
        sent = 0
        for _ in range(FLOOD):
            try:
                send["sw0"].send(flood)
                sent += 1
            except OSError:
                pass
            if sent % 200 == 0:
                await asyncio.sleep(0)  # let the loop read, as it would under a flood
        await asyncio.sleep(0.2)
        stats = lis.stats()
        out["flood_sent"] = sent
        out["flood_read"] = stats.frames.get("hca0", 0) - before
        out["flood_rate_dropped"] = stats.dropped["rate"]
        # The flood's first frames fit the bucket: one change, then nothing more.
        out["flood_changes"] = lis.neighbours.generation - seen

        await asyncio.sleep(0.3)  # a few tokens back in the bucket
        send["sw0"].send(build_frame(LEAF_2, "Ethernet5", system_name="leaf-2", ttl=0))
        out["ttl0_forgotten"] = await wait_until(lambda: switch_of("mlx5_0") is None, 5.0)
        send["sw0"].send(build_frame(LEAF_2, "Ethernet5", system_name="leaf-2", ttl=1))
        out["ttl1_heard"] = await wait_until(lambda: switch_of("mlx5_0") == "leaf-2", 5.0)
        out["ttl1_expired"] = await wait_until(lambda: switch_of("mlx5_0") is None, 5.0)
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        out["closed"] = lis.stats().netdevs == ()
        for s in send.values():
            s.close()
    return out


async def without_capability(root: Path) -> dict[str, Any]:
    """Run where raw sockets are refused (a user namespace of no capability): LLDP says
    it is off, once, and nothing is listened on."""
    node = build_node(root, [HcaSpec(name="mlx5_0", pci_address="0000:3b:00.0",
                                     ports=(PortSpec(netdev="lo", gid_table_size=4),))])
    inventory = await NodeReader(node.sysfs_root, node.dev_root, deadline=5.0).discover()
    lis = LldpListener(str(node.sysfs_root), hold_seconds=2.0, files=OffLoop(5.0))
    await lis.follow(inventory)
    await lis.follow(inventory)
    return {"off": lis.stats().off, "listening": list(lis.stats().netdevs)}


if __name__ == "__main__":
    run = without_capability if sys.argv[2:] == ["no-capability"] else scenario
    print(json.dumps(asyncio.run(run(Path(sys.argv[1])))))
