"""Hostile-client benchmarks: what an attack on the plugin socket costs the daemon.

Each function starts ``rdma-hca serve`` as a child process on a simulated GPU node
under ``workdir``, with the kubelet emulator in this process's event loop, waits for
the registration, runs one bounded attack over the plugin's unix socket, and returns
its figures. Nothing leaves the machine; every loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.daemon.deviceplugin.registration import socket_name
from rdma_hca.devkit.bench_procs import BenchError, Child, sample_process, serve_argv
from rdma_hca.devkit.bench_report import Figure, Spec, Target
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.nodes import gpu_node

RESOURCE = "rdma/hca"
SLOTS = 1000
WAIT = 30.0  # for the daemon to register; only reached when something is broken
# Under gRPC's default 4 MiB limit, which the daemon used to accept: ~4 MB of IDs.
OVERSIZED_IDS = 62_000
OVERSIZED_ID = "x" * 63


@dataclass(frozen=True)
class AllocateLoad:
    clients: int
    calls: int
    errors: int
    seconds: float

    @property
    def requests_per_second(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class FloodMemory:
    oversized: int
    malformed: int
    rss_before_kib: int
    rss_after_kib: int
    still_serves: bool


@dataclass(frozen=True)
class StrayStreams:
    streams: int
    registrations: int  # caused by the stray streams; 0 is right


@dataclass(frozen=True)
class PreferredAllocation:
    available: int
    must_include: int
    seconds: float


def _raw(data: bytes) -> bytes:
    """Bytes as they are: the flood sends what no serializer would make."""
    return data


@dataclass
class _Served:
    child: Child
    kubelet: KubeletEmulator
    target: str


@contextlib.asynccontextmanager
async def _served(workdir: str, *extra: str) -> AsyncIterator[_Served]:
    """A registered ``rdma-hca serve`` child on a simulated GPU node under ``workdir``."""
    root = Path(workdir)
    node = gpu_node(root / "node", gid_table_size=8)
    plugin_dir = root / "dp"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    child = Child("rdma-hca serve", serve_argv(str(node.sysfs_root), str(node.dev_root),
                                               str(plugin_dir), "", extra),
                  os.path.join(workdir, "serve.log"))
    try:
        await child.start()
        try:
            await child.race(kubelet.wait_for(
                lambda: kubelet.registrations(RESOURCE) > 0
                and kubelet.allocatable(RESOURCE) > 0, timeout=WAIT), "registering")
        except TimeoutError as exc:
            raise BenchError(f"the daemon did not register: {exc}{child.log_tail()}") from None
        yield _Served(child, kubelet, "unix://" + str(plugin_dir / socket_name(RESOURCE)))
    finally:
        await child.stop()
        await kubelet.stop()


async def allocate_under_clients(workdir: str, clients: int = 20,
                                 seconds: float = 3.0) -> AllocateLoad:
    """Allocate calls per second a ``serve`` process answers to ``clients`` concurrent clients.

    Each client has its own connection and calls Allocate for one slot in a loop for
    ``seconds``; calls answered in that window (and failed ones) are counted.
    """
    async with _served(workdir) as served:
        request = api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=["hca-0001"])])
        deadline = time.monotonic() + seconds
        calls = errors = 0

        async def client() -> None:
            nonlocal calls, errors
            async with grpc.aio.insecure_channel(served.target) as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                while time.monotonic() < deadline:
                    try:
                        await stub.Allocate(request, timeout=WAIT)
                        calls += 1
                    except grpc.aio.AioRpcError:
                        errors += 1

        start = time.monotonic()
        await served.child.race(asyncio.gather(*(client() for _ in range(clients))),
                                "answering Allocate")
        return AllocateLoad(clients, calls, errors, time.monotonic() - start)


async def rss_after_floods(workdir: str, oversized: int = 150,
                           malformed: int = 1000) -> FloodMemory:
    """RSS of a ``serve`` process before and after a flood of bad Allocate requests.

    ``oversized`` requests of ~4 MB (62,000 IDs of 63 characters: within gRPC's
    default limit, over the daemon's) and then ``malformed`` requests whose bytes do
    not decode, sent one after the other on one connection. The daemon must refuse
    them all and keep serving; its resident memory should stay where it was.
    """
    async with _served(workdir) as served:
        big = api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=[OVERSIZED_ID] * OVERSIZED_IDS)
        ]).SerializeToString()
        async with grpc.aio.insecure_channel(
                served.target, options=[("grpc.max_send_message_length", 2 * len(big))]
        ) as channel:
            allocate = channel.unary_unary("/v1beta1.DevicePlugin/Allocate",
                                           request_serializer=_raw,
                                           response_deserializer=_raw)
            await allocate(api_pb2.AllocateRequest(container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=["hca-0001"])
            ]).SerializeToString(), timeout=WAIT)
            await asyncio.sleep(0.5)
            before = sample_process(served.child.pid).rss_kib
            for payload, count in ((big, oversized), (b"\x0a\xff\xff\xff\xff", malformed)):
                for _ in range(count):
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await served.child.race(allocate(payload, timeout=WAIT), "flooded")
            await asyncio.sleep(0.5)
            after = sample_process(served.child.pid).rss_kib
        ok = True
        try:
            await served.kubelet.allocate(RESOURCE, [["hca-0002"]])
        except Exception:  # a failure here is a figure, reported as such
            ok = False
        return FloodMemory(oversized, malformed, before, after, ok)


async def stray_stream_registrations(workdir: str, streams: int = 50) -> StrayStreams:
    """Registrations caused by clients that open ListAndWatch, read once and cancel.

    ``streams`` such clients run one after the other, each on its own connection; the
    kubelet emulator counts the daemon's registrations before and after (0 is right:
    only the kubelet's own stream ending means "register again").
    """
    async with _served(workdir) as served:
        before = served.kubelet.registrations(RESOURCE)
        for _ in range(streams):
            async with grpc.aio.insecure_channel(served.target) as channel:
                call = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty())
                await served.child.race(asyncio.wait_for(call.read(), WAIT), "streaming")
                call.cancel()
        await asyncio.sleep(1.0)  # a registration the streams caused would land by now
        return StrayStreams(streams, served.kubelet.registrations(RESOURCE) - before)


async def preferred_allocation_time(workdir: str, available: int = 20_000,
                                    must_include: int = 20_000) -> PreferredAllocation:
    """Seconds one GetPreferredAllocation with ``available`` + ``must_include`` IDs takes.

    Measured at the client, against an exclusive pool (where the kubelet calls it).
    """
    async with _served(workdir, "--mode", "exclusive") as served:
        request = api_pb2.PreferredAllocationRequest(container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=[f"id-{i:06d}" for i in range(available)],
                must_include_deviceIDs=[f"id-{i:06d}" for i in range(0, 2 * must_include, 2)],
                allocation_size=must_include + 1)])
        async with grpc.aio.insecure_channel(served.target) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            start = time.monotonic()
            await served.child.race(stub.GetPreferredAllocation(request, timeout=120),
                                    "choosing")
            return PreferredAllocation(available, must_include, time.monotonic() - start)


ATTACK_RPS = Spec("attack_allocate_rps", "Allocate under 20 concurrent clients", "req/s")
ATTACK_RSS = Spec("attack_flood_rss_mib",
                  "RSS after 150 oversized + 1000 malformed Allocates", "MiB",
                  Target(1.3, on_ratio=True), "before the flood")
ATTACK_STRAY = Spec("attack_stray_registrations",
                    "re-registrations caused by 50 stray ListAndWatch clients", "count",
                    Target(0.0))
ATTACK_PREFERRED = Spec("attack_preferred_20k_ms",
                        "GetPreferredAllocation, 20k available + 20k must-include IDs", "ms",
                        Target(1000.0))
ATTACK_SPECS = [ATTACK_RPS, ATTACK_RSS, ATTACK_STRAY, ATTACK_PREFERRED]


async def attack_figures(workdir: str, quick: bool) -> list[Figure]:
    """The hostile-load rows of ``make bench``, each against its own ``serve`` process."""
    def own(name: str) -> str:
        path = os.path.join(workdir, name)
        os.makedirs(path, exist_ok=True)
        return path

    load = await allocate_under_clients(own("load"), seconds=1.5 if quick else 3.0)
    flood = await rss_after_floods(own("flood"))
    stray = await stray_stream_registrations(own("stray"))
    chosen = await preferred_allocation_time(own("preferred"))
    return [
        ATTACK_RPS.figure(load.requests_per_second,
                          note=f"{load.calls} calls answered in {load.seconds:.1f} s by one "
                               f"`rdma-hca serve`, {load.clients} clients each on its own "
                               f"connection; {load.errors} failed"),
        ATTACK_RSS.figure(flood.rss_after_kib / 1024, flood.rss_before_kib / 1024,
                          note=f"{flood.oversized} requests of ~4 MB (over the daemon's receive "
                               f"limit) then {flood.malformed} undecodable ones on one "
                               "connection; VmRSS before and after; still serves Allocate: "
                               f"{'yes' if flood.still_serves else 'NO'}"),
        ATTACK_STRAY.figure(float(stray.registrations),
                            note=f"{stray.streams} clients one after another open ListAndWatch, "
                                 "read one message and cancel; registrations the kubelet "
                                 "emulator saw meanwhile"),
        ATTACK_PREFERRED.figure(chosen.seconds * 1000.0,
                                note="one call against an exclusive pool, timed at the client"),
    ]
