"""LLDP figures for ``make bench``: what a flood on the wire costs, and how soon a switch
change reaches the ResourceSlice.

Both take the recorded-frame path: an AF_UNIX datagram socket pair stands in for each
AF_PACKET socket (no network namespace, no CAP_NET_RAW needed). From the socket on,
everything is the daemon's: the event loop's reader, the bounded reads, the rate limit,
the parser, the neighbour table, the DRA driver's offer and the slice publisher. What
the kernel spends on the packet path is not in the figure.

- Flood: a child process runs the listener on one port; this process sends it 10,000
  frames a second for a few seconds; the child's CPU (user + system) over the wall time
  is the figure. The baseline is the same child with a bare reader (the same reads per
  wakeup, nothing done with the frames): the ratio is what the rate limit and the
  counting cost.
- Switch change: the real DRA driver on a DraStage (simulated node, fake API server over
  HTTP); each run sends one frame with a different chassis on a quiet node (no slice
  write within the publisher's spacing) and times it until the API server holds a slice
  whose device names the new switch.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rdma_hca.contract.fabric import SWITCH
from rdma_hca.daemon.fabric.listener import READS_PER_WAKEUP, LldpListener
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
LLDP_FLOOD_CPU = Spec("lldp_flood_cpu_percent",
                      "LLDP flood of 10,000 frames/s on one port: CPU (% of one core)", "%",
                      Target(25.0), baseline_label="bare reader, same reads, no work")
LLDP_SWITCH_SLICE = Spec("lldp_switch_change_slice_ms",
                         "LLDP switch change → slice written (max)", "ms", Target(1000.0))
LLDP_SPECS = [LLDP_FLOOD_CPU, LLDP_SWITCH_SLICE]


# --- the flood ---------------------------------------------------------------------------


def _one_port() -> NodeInventory:
    port = Port(number=1, state="ACTIVE", phys_state="LinkUp", link_layer=LinkLayer.ETHERNET,
                rate="400 Gb/sec (4X NDR)", rate_gbps=400.0, netdevs=("eth0",), gids=())
    hca = Hca(name="mlx5_0", driver="mlx5_core", node_guid=None, fw_ver=None, board_id=None,
              hca_type=None, pci_address=None, pci_vendor=None, pci_device=None,
              numa_node=None, ports=(port,),
              uverbs=CharDevice("uverbs0", "/dev/infiniband/uverbs0", True))
    return NodeInventory(hcas=(hca,), rdma_cm=None, netns_mode="shared")


async def _child(fd: int, seconds: float, bare: bool) -> dict[str, Any]:
    sock = socket.socket(fileno=fd)
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

        loop.add_reader(fd, readable)
    else:
        lis = LldpListener("/nonexistent", hold_seconds=30.0, files=OffLoop(5.0),
                           opener=lambda _netdev: sock)
        await lis.follow(_one_port())
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    wall, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.sleep(seconds)
    end, after = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    out: dict[str, Any] = {"cpu_percent": 100.0 * cpu / (end - wall)}
    if lis is not None:
        stats = lis.stats()
        out.update(frames=stats.frames.get("eth0", 0), dropped=dict(stats.dropped))
        lis.close()
    else:
        out["frames"] = frames[0]
    return out


def child_main() -> None:
    """The flood's child process: ``fd seconds bare|listener`` on the command line."""
    fd, seconds, kind = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    print(json.dumps(asyncio.run(_child(fd, seconds, kind == "bare"))), flush=True)


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
            except BlockingIOError:
                pass  # the receiver's queue is full: the frame is lost, as on the wire
            except ConnectionRefusedError:
                return sent  # the child has measured and closed its end
        delay = start + (tick + 1) / 100 - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    return sent


async def _flood_run(seconds: float, bare: bool) -> dict[str, Any]:
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    far.setblocking(False)
    code = "from rdma_hca.devkit.bench_lldp import child_main; child_main()"
    try:
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, str(near.fileno()), str(seconds),
                "bare" if bare else "listener", pass_fds=[near.fileno()],
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        finally:
            near.close()  # the child has its own copy
        assert proc.stdin is not None and proc.stdout is not None
        if (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() != b"ready":
            raise RuntimeError("the flood's child did not start")
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        frame = build_frame(bytes.fromhex("0c42a1000001"), "Ethernet1", system_name="leaf-1")
        # The sender runs a little longer than the child measures: the flood spans it.
        sent = await asyncio.to_thread(_send, far, frame, seconds + 0.3)
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        await proc.wait()
    finally:
        far.close()
    out: dict[str, Any] = json.loads(line)
    out["sent"] = sent
    return out


async def flood_cpu(seconds: float) -> Figure:
    ours = await _flood_run(seconds, bare=False)
    bare = await _flood_run(seconds, bare=True)
    read_rate = ours["frames"] / seconds
    return LLDP_FLOOD_CPU.figure(
        round(ours["cpu_percent"], 2), round(bare["cpu_percent"], 2),
        note=f"{seconds:g} s of {FLOOD_RATE} frames/s offered, {read_rate:.0f}/s read by the "
             f"listener, {ours['dropped'].get('rate', 0)} dropped by its rate limit unparsed; "
             f"{PATH}")


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
