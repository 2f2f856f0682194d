"""DRA figures for ``make bench``: NodePrepareResources latency, port down -> slice updated,
and what the driver costs the API server (``bench_api``).

Both run the real driver on a DraStage (simulated node, fake API server over HTTP,
kubelet emulator over unix sockets), in this process.

- Prepare: each call prepares a fresh claim (the claim read from the API server, a CDI
  spec and the checkpoint written), then it is unprepared. The baseline is a bare
  grpc.aio DRAPlugin servicer answering a precomputed response on a unix socket, called
  by the same client: what the driver adds is the cost of the work itself.
- Port down: from the port's state file changing in sysfs to the API server storing a
  slice whose device carries the link-down taint, on a quiet node (no slice write within
  the flap damper's spacing). The stage's health poll is 50 ms; a
  daemon also wakes at once on the rtnetlink link event.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from rdma_hca.daemon._proto.dra import dra_v1_pb2, dra_v1_pb2_grpc
from rdma_hca.devkit.bench_report import Figure, Spec, Target
from rdma_hca.devkit.dra.bench_api import API_SPECS, api_figures
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.settings.config import Settings

DRIVER = "rdma-hca.io"
NODE = "bench-node"
DEFAULT_POLL = Settings().health_poll_seconds
DRA_PREPARE = Spec("dra_prepare_p50_ms", "NodePrepareResources p50 (fresh claim)", "ms",
                   baseline_label="bare grpc.aio servicer")
DRA_PORT_DOWN = Spec("dra_port_down_slice_ms", "port down → slice tainted (max)", "ms",
                     Target(1000.0))
DRA_SPECS = [DRA_PREPARE, DRA_PORT_DOWN, *API_SPECS]


class _BareDra(dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, response: dra_v1_pb2.NodePrepareResourcesResponse) -> None:
        self.response = response

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return self.response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return dra_v1_pb2.NodeUnprepareResourcesResponse()


def _p50_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


async def _bare_latency(response: Any, calls: int, root: str) -> float:
    path = os.path.join(root, "bare.sock")
    server = grpc.aio.server()
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_BareDra(response), server)
    server.add_insecure_port("unix://" + path)
    await server.start()
    try:
        async with grpc.aio.insecure_channel("unix://" + path) as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            request = dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="ns", uid="u", name="c")])
            samples = []
            for _ in range(calls):
                start = time.perf_counter()
                await stub.NodePrepareResources(request, timeout=10)
                samples.append(time.perf_counter() - start)
        return _p50_ms(samples)
    finally:
        await server.stop(0)


async def prepare_latency(workdir: Path, calls: int) -> Figure:
    node = gpu_node(workdir / "node", hcas=8, gid_table_size=16)
    async with DraStage(node, workdir / "stage", node_name=NODE) as stage:
        assert stage.kubelet is not None
        if not await stage.registered():
            return DRA_PREPARE.failed("the driver did not register")
        samples: list[float] = []
        last: Any = None
        for i in range(calls):
            uid = stage.api.add_claim("bench", f"c{i}", [
                {"request": "hca", "driver": DRIVER, "pool": NODE, "device": f"mlx5-{i % 8}"}])
            start = time.perf_counter()
            last = await stage.kubelet.prepare(DRIVER, [("bench", uid, f"c{i}")])
            samples.append(time.perf_counter() - start)
            if last.claims[uid].error:
                return DRA_PREPARE.failed(f"prepare failed: {last.claims[uid].error}")
            await stage.kubelet.unprepare(DRIVER, [("bench", uid, f"c{i}")])
        bare = await _bare_latency(last, calls, stage.root)
    return DRA_PREPARE.figure(
                  _p50_ms(samples), bare,
                  note=f"{calls} claims: claim read over HTTP, CDI spec and checkpoint written; "
                       "in-process")


def _tainted(stage: DraStage, device: str, wanted: bool) -> Callable[[], bool]:
    return lambda: ("taints" in stage.devices().get(device, {})) == wanted


async def port_down_latency(workdir: Path, runs: int) -> Figure:
    node = gpu_node(workdir / "node", hcas=8, gid_table_size=16)
    async with DraStage(node, workdir / "stage", node_name=NODE,
                        poll_seconds=DEFAULT_POLL) as stage:
        if not await stage.until(lambda: bool(stage.devices())):
            return DRA_PORT_DOWN.failed("no slice was published")
        assert stage.driver is not None and stage.driver.publisher is not None
        spacing = stage.driver.publisher.damper.spacing
        samples: list[float] = []
        for i in range(runs):
            hca = f"mlx5_{i % 8}"
            device = f"mlx5-{i % 8}"
            # The figure is a quiet node's first change: no write within the damper's spacing
            # (a change right after a write waits for it, see dra_flap_slice_writes_30s).
            await asyncio.sleep(spacing)
            start = time.perf_counter()
            node.set_port(hca, up=False)
            if not await stage.until(_tainted(stage, device, True), timeout=10):
                return DRA_PORT_DOWN.failed("the slice never changed")
            samples.append(time.perf_counter() - start)
            node.set_port(hca, up=True)
            await stage.until(_tainted(stage, device, False), timeout=10)
    return DRA_PORT_DOWN.figure(
        round(max(samples) * 1000, 1),
        note=f"{runs} runs at the daemon's default health poll ({DEFAULT_POLL:g} s), each on a "
             f"quiet node, slice written over HTTP to the fake API server; "
             f"p50 {_p50_ms(samples)} ms")


async def dra_figures(quick: bool) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="rdma-hca-dra-bench-") as tmp:
        return [
            await prepare_latency(Path(tmp) / "prepare", 30 if quick else 300),
            await port_down_latency(Path(tmp) / "port", 3 if quick else 10),
            *await api_figures(Path(tmp) / "api", quick),
        ]


def run_dra_bench(quick: bool = False) -> list[Figure]:
    """The DRA figures, for the benchmark report."""
    return asyncio.run(dra_figures(quick))
