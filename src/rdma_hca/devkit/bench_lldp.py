"""LLDP figures for ``make bench``: what a flood on the wire costs, and how soon a switch
change reaches the ResourceSlice.

- Flood: one process runs the listener on one port and another sends it 10,000 frames a
  second for a few seconds; the listener process's CPU (user + system) over the wall
  time is the figure. Where the machine allows a network namespace (``unshare``), on a
  veth pair with a real AF_PACKET socket; elsewhere on the recorded-frame path, an
  AF_UNIX datagram socket pair in place of the raw socket (the kernel's packet path is
  then not in the figure). The note says which. The baseline is the same process with a
  bare reader (the same reads per wakeup, nothing done with the frames): the ratio is
  what the rate limit, the counting and the parsing cost.
- Switch change: the real DRA driver on a DraStage (simulated node, fake API server over
  HTTP) and the listener on socket pairs; each run sends one frame with a different
  chassis on a quiet node (no slice write within the publisher's spacing) and times it
  until the API server holds a slice whose device names the new switch.

From the socket on, everything is the daemon's: the event loop's reader, the bounded
reads, the rate limit, the parser, the neighbour table, the offer and the publisher.
"""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rdma_hca.contract.fabric import SWITCH
from rdma_hca.daemon.fabric.listener import READS_PER_WAKEUP, LldpListener
from rdma_hca.daemon.fabric.rawsocket import open_lldp_socket
from rdma_hca.daemon.wiring import follow_neighbours
from rdma_hca.devkit.bench_report import Figure, Spec, Target
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.node.lldp import MAX_FRAME, build_frame
from rdma_hca.node.model import CharDevice, Hca, LinkLayer, NodeInventory, Port

DRIVER = "rdma-hca.io"
FLOOD_RATE = 10_000  # frames a second
PATH = ("recorded-frame path: AF_UNIX datagram socket pairs in place of AF_PACKET sockets "
        "(runs without a network namespace or CAP_NET_RAW; the kernel's packet path is "
        "not counted)")
VETH_PATH = ("real kernel path: a veth pair in a network namespace of its own, the "
             "listener's AF_PACKET socket on one end, the sender a process of its own on the "
             "other")
VETH, PEER = "lldpb0", "lldpb0p"
UNSHARE = ("unshare", "--net", "--map-root-user")
CHILD = "from rdma_hca.devkit.bench_lldp import child_main; child_main()"
SENDER = "from rdma_hca.devkit.bench_lldp import sender_main; sender_main()"
LLDP_FLOOD_CPU = Spec("lldp_flood_cpu_percent",
                      "LLDP flood of 10,000 frames/s on one port: CPU (% of one core)", "%",
                      Target(25.0), baseline_label="bare reader, same reads, no work")
LLDP_SWITCH_SLICE = Spec("lldp_switch_change_slice_ms",
                         "LLDP switch change → slice written (max)", "ms", Target(1000.0))
LLDP_SPECS = [LLDP_FLOOD_CPU, LLDP_SWITCH_SLICE]


# --- the flood ---------------------------------------------------------------------------


def _one_port(netdev: str) -> NodeInventory:
    port = Port(number=1, state="ACTIVE", phys_state="LinkUp", link_layer=LinkLayer.ETHERNET,
                rate="400 Gb/sec (4X NDR)", rate_gbps=400.0, netdevs=(netdev,), gids=())
    hca = Hca(name="mlx5_0", driver="mlx5_core", node_guid=None, fw_ver=None, board_id=None,
              hca_type=None, pci_address=None, pci_vendor=None, pci_device=None,
              numa_node=None, ports=(port,),
              uverbs=CharDevice("uverbs0", "/dev/infiniband/uverbs0", True))
    return NodeInventory(hcas=(hca,), rdma_cm=None, netns_mode="shared")


def _frame() -> bytes:
    return build_frame(bytes.fromhex("0c42a1000001"), "Ethernet1", system_name="leaf-1")


def _veth() -> None:
    for args in (("link", "add", VETH, "type", "veth", "peer", "name", PEER),
                 ("link", "set", VETH, "up"), ("link", "set", PEER, "up")):
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


async def _child(source: str, seconds: float, bare: bool) -> dict[str, Any]:
    """One side of the flood: the listener (or the bare reader) on one port, measured."""
    if source == "veth":
        _veth()
        netdev = VETH
        sock = open_lldp_socket(VETH)
    else:
        netdev = "eth0"
        sock = socket.socket(fileno=int(source))
        sock.setblocking(False)
    loop = asyncio.get_running_loop()
    frames = [0]
    lis: LldpListener | None = None
    if bare:
        buffer = bytearray(MAX_FRAME)

        def readable() -> None:
            for _ in range(READS_PER_WAKEUP):
                try:
                    sock.recv_into(buffer, 0, socket.MSG_TRUNC)
                except BlockingIOError:
                    return
                frames[0] += 1

        loop.add_reader(sock.fileno(), readable)
    else:
        lis = LldpListener("/nonexistent", hold_seconds=30.0, files=OffLoop(5.0),
                           opener=lambda _netdev: sock)
        await lis.follow(_one_port(netdev))
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    sender = None
    if source == "veth":
        # The sender is a process of its own in this namespace: its CPU is not ours.
        sender = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SENDER, PEER, str(seconds + 1.0),
            stdout=asyncio.subprocess.PIPE)
        assert sender.stdout is not None
        await asyncio.wait_for(sender.stdout.readline(), 30)
    wall, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.sleep(seconds)
    end, after = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    if sender is not None:
        sender.kill()
        await sender.wait()
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    out: dict[str, Any] = {"cpu_percent": 100.0 * cpu / (end - wall)}
    if lis is not None:
        stats = lis.stats()
        out.update(frames=stats.frames.get(netdev, 0), dropped=dict(stats.dropped))
        lis.close()
    else:
        out["frames"] = frames[0]
    return out


def child_main() -> None:
    """The flood's measured process: ``<fd>|veth seconds bare|listener``."""
    source, seconds, kind = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    print(json.dumps(asyncio.run(_child(source, seconds, kind == "bare"))), flush=True)


def sender_main() -> None:
    """The flood's sender on a veth end: ``netdev seconds``."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sock.bind((sys.argv[1], 0))
    sock.setblocking(False)
    print("sending", flush=True)
    _send(sock, _frame(), float(sys.argv[2]))


def _send(sock: socket.socket, frame: bytes, seconds: float) -> int:
    """FLOOD_RATE frames a second for ``seconds``, in 10 ms batches; how many went out."""
    batch = FLOOD_RATE // 100
    sent = 0
    start = time.perf_counter()
    for tick in range(int(seconds * 100)):
        for _ in range(batch):
            try:
                sock.send(frame)
                sent += 1
            except ConnectionRefusedError:
                return sent  # the measured process is done and closed its end
            except OSError:
                pass  # a full queue (EAGAIN, ENOBUFS): the frame is lost, as on the wire
        delay = start + (tick + 1) / 100 - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    return sent


def veth_allowed() -> str | None:
    """Why the flood cannot run on a veth pair in a namespace of its own here, or None."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "no unshare or ip command"
    probe = subprocess.run([*UNSHARE, "ip", "link", "add", VETH, "type", "veth", "peer",
                            "name", PEER], capture_output=True, text=True, timeout=30,
                           check=False)
    if probe.returncode != 0:
        return f"no network namespace allowed ({probe.stderr.strip() or probe.returncode})"
    return None


async def _flood_run(seconds: float, bare: bool, veth: bool) -> dict[str, Any]:
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    far.setblocking(False)
    kind = "bare" if bare else "listener"
    try:
        try:
            if veth:
                proc = await asyncio.create_subprocess_exec(
                    *UNSHARE, sys.executable, "-c", CHILD, "veth", str(seconds), kind,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            else:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", CHILD, str(near.fileno()), str(seconds), kind,
                    pass_fds=[near.fileno()],
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        finally:
            near.close()  # the child has its own copy
        assert proc.stdin is not None and proc.stdout is not None
        if (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() != b"ready":
            raise RuntimeError("the flood's measured process did not start")
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        sent = None
        if not veth:
            # The sender runs a little longer than the child measures: the flood spans it.
            sent = await asyncio.to_thread(_send, far, _frame(), seconds + 0.3)
        line = await asyncio.wait_for(proc.stdout.readline(), 30 + seconds)
        await proc.wait()
    finally:
        far.close()
    out: dict[str, Any] = json.loads(line)
    out["sent"] = sent
    return out


async def flood_cpu(seconds: float, *, veth: bool | None = None) -> Figure:
    """On a veth pair where the machine allows a network namespace (``veth`` None: look),
    else on the recorded-frame path."""
    why = veth_allowed() if veth is None else (None if veth else "not asked for")
    on_veth = why is None
    ours = await _flood_run(seconds, False, on_veth)
    bare = await _flood_run(seconds, True, on_veth)
    read_rate = ours["frames"] / seconds
    path = VETH_PATH if on_veth else f"{PATH}; a veth pair was not used: {why}"
    return LLDP_FLOOD_CPU.figure(
        round(ours["cpu_percent"], 2), round(bare["cpu_percent"], 2),
        note=f"{seconds:g} s of {FLOOD_RATE} frames/s offered, {read_rate:.0f}/s read by the "
             f"listener, {ours['dropped'].get('rate', 0)} dropped by its rate limit unparsed; "
             f"{path}")


# --- a switch change to the slice ----------------------------------------------------------


def _switch_of(stage: DraStage, device: str) -> str | None:
    for s in stage.api.slices(stage.node_name):
        for d in s["spec"]["devices"]:
            if d["name"] == device:
                value = d.get("attributes", {}).get(f"{DRIVER}/{SWITCH}", {})
                return str(value["string"]) if "string" in value else None
    return None


async def switch_change_latency(workdir: Path, runs: int) -> Figure:
    node = gpu_node(workdir / "node", hcas=8, gid_table_size=16)
    pairs: dict[str, tuple[socket.socket, socket.socket]] = {}

    def opener(netdev: str) -> socket.socket:
        near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        near.setblocking(False)
        pairs[netdev] = (near, far)
        return near

    async with DraStage(node, workdir / "stage") as stage:
        if not await stage.until(lambda: bool(stage.devices())):
            return LLDP_SWITCH_SLICE.failed("no slice was published")
        assert stage.driver is not None and stage.watcher is not None
        inventory = stage.watcher.inventory
        assert inventory is not None
        lis = LldpListener(str(node.sysfs_root), hold_seconds=30.0, files=OffLoop(5.0),
                           opener=opener)
        tasks = [asyncio.create_task(lis.run()),
                 asyncio.create_task(follow_neighbours(lis, stage.driver))]
        try:
            await lis.follow(inventory)
            for i in range(8):  # every port hears its switch first
                pairs[f"eth{i}"][1].send(build_frame(bytes([2, 0, 0, 0, 0, 1]), f"Ethernet{i}",
                                                     system_name="leaf-a"))
            if not await stage.until(lambda: all(_switch_of(stage, f"mlx5-{i}") == "leaf-a"
                                                 for i in range(8))):
                return LLDP_SWITCH_SLICE.failed("the first neighbours never reached the slice")
            spacing = stage.driver.helper.publisher.damper.spacing
            samples: list[float] = []
            for run in range(runs):
                i = run % 8
                name = f"leaf-{run}"
                await asyncio.sleep(spacing)  # a quiet node: the first change after a write
                start = time.perf_counter()
                pairs[f"eth{i}"][1].send(build_frame(bytes([2, 0, 0, 0, 1, run]),
                                                     f"Ethernet{i}", system_name=name))
                if not await stage.until(lambda i=i, name=name:  # type: ignore[misc]
                                         _switch_of(stage, f"mlx5-{i}") == name, timeout=10):
                    return LLDP_SWITCH_SLICE.failed("the slice never named the new switch")
                samples.append(time.perf_counter() - start)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for near, far in pairs.values():
                near.close()
                far.close()
    ordered = sorted(samples)
    return LLDP_SWITCH_SLICE.figure(
        round(ordered[-1] * 1000, 1),
        note=f"{runs} runs, each on a quiet node, one frame with a different chassis and "
             f"system name → the API server holds a slice naming it (fake API server over "
             f"HTTP); p50 {ordered[len(ordered) // 2] * 1000:.1f} ms; {PATH}")


async def lldp_figures(quick: bool) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="rdma-hca-lldp-bench-") as tmp:
        return [await flood_cpu(2.0 if quick else 5.0),
                await switch_change_latency(Path(tmp) / "switch", 3 if quick else 10)]
