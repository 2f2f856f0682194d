"""DRA figures for ``make bench``: NodePrepareResources latency, port down -> slice updated,
and what the driver costs the API server (``bench_api``).

Both run the real driver on a DraStage (simulated node, fake API server over HTTP,
kubelet emulator over unix sockets), in this process.

- Prepare: each call prepares a fresh claim (the claim read from the API server, a CDI
  spec and the checkpoint written), then it is unprepared; once with no other claim
  prepared, once with 100. The baseline is a bare grpc.aio DRAPlugin servicer doing the
  same I/O (the same GET through the same client, a spec and a checkpoint of the same
  size written with fsync and rename), called in turn with the driver: the ratio is
  what the driver's own machinery costs. Both with the default settings (the client's
  budgets as they ship), POD_UID set as the chart sets it.
- A burst of pods at once (``bench_burst``).
- Port down: from the port's state file changing in sysfs to the API server storing a
  slice whose device carries the link-down taint, on a quiet node (no slice write within
  the flap damper's spacing). The stage's health poll is 50 ms; a
  daemon also wakes at once on the rtnetlink link event.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from rdma_hca.contract.cdi import cdi_device_name, cdi_id, cdi_kind
from rdma_hca.contract.checkpoint import CHECKPOINT_VERSION
from rdma_hca.daemon._proto.dra import dra_v1_pb2, dra_v1_pb2_grpc
from rdma_hca.daemon.dra.kubeapi import SliceApi
from rdma_hca.devkit.bench_report import Figure, Spec, Target
from rdma_hca.devkit.dra.bench_api import API_SPECS, NODE, api_figures, tainted_is
from rdma_hca.devkit.dra.bench_burst import BURST_SPECS, burst
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.kit.files import write_atomic
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.settings.model import Settings

DRIVER = "rdma-hca.io"
DEFAULT_POLL = Settings().health_poll_seconds
BARE = "bare grpc.aio servicer, same I/O"
# Within a whisker of the bare servicer doing the same I/O, as a Go driver is.
DRA_PREPARE = Spec("dra_prepare_p50_ms", "NodePrepareResources p50 (fresh claim)", "ms",
                   Target(1.1, on_ratio=True), baseline_label=BARE)
DRA_PREPARE_100 = Spec("dra_prepare_100_p50_ms",
                       "NodePrepareResources p50 (fresh claim, 100 already prepared)", "ms",
                       Target(1.1, on_ratio=True), baseline_label=BARE)
DRA_PORT_DOWN = Spec("dra_port_down_slice_ms", "port down → slice tainted (max)", "ms",
                     Target(1000.0))
DRA_SPECS = [DRA_PREPARE, DRA_PREPARE_100, DRA_PORT_DOWN, *BURST_SPECS, *API_SPECS]


class _BareDra(dra_v1_pb2_grpc.DRAPluginServicer):
    """The same I/O as a Prepare, and nothing else: the claim read from the same API server
    through the same client, one CDI spec and one checkpoint written with fsync and
    rename, on the same kind of worker thread. Its checkpoint holds as many claims as
    the driver's."""

    def __init__(self, api: SliceApi, workdir: Path, io: OffLoop, prepared: int) -> None:
        self.api = api
        self.workdir = workdir
        self.io = io
        self.entries = {f"kept-{i}": {"namespace": "bench", "name": f"kept-{i}", "devices": [{
            "request_names": ["hca"], "pool": NODE, "device": "mlx5-0", "hca": "mlx5_0",
            "cdi_ids": [cdi_id(DRIVER, f"kept-{i}", "mlx5-0")]}]} for i in range(prepared)}

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        resp = dra_v1_pb2.NodePrepareResourcesResponse()
        for c in request.claims:
            obj = await self.api.get_claim(c.namespace, c.name)
            result = obj["status"]["allocation"]["devices"]["results"][0]
            device = result["device"]
            ident = cdi_id(DRIVER, c.uid, device)
            spec = {"cdiVersion": "0.6.0", "kind": cdi_kind(DRIVER), "devices": [{
                "name": cdi_device_name(c.uid, device), "containerEdits": {"deviceNodes": [
                    {"path": "/dev/infiniband/uverbs0", "hostPath": "/dev/infiniband/uverbs0",
                     "permissions": "rw"}], "env": ["RDMA_HCA_DEVICES=mlx5_0"]}}]}
            entries = {**self.entries, c.uid: {"namespace": c.namespace, "name": c.name,
                                                "devices": [{"device": device}]}}
            spec_path = str(self.workdir / f"bare-{c.uid}.json")
            checkpoint = str(self.workdir / "bare-checkpoint.json")

            def write(spec_path: str = spec_path, spec: Any = spec,
                      entries: Any = entries, checkpoint: str = checkpoint) -> None:
                write_atomic(spec_path, json.dumps(spec, indent=2, sort_keys=True) + "\n")
                write_atomic(checkpoint, json.dumps(
                    {"version": CHECKPOINT_VERSION, "claims": entries},
                    indent=1, sort_keys=True) + "\n", 0o600)

            await self.io.run("bare prepare", write)
            resp.claims[c.uid].devices.add(request_names=[result["request"]], pool_name=NODE,
                                           device_name=device, cdi_device_ids=[ident])
        return resp

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return dra_v1_pb2.NodeUnprepareResourcesResponse()


def _p50_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


async def prepare_latency(workdir: Path, calls: int, already: int, spec: Spec) -> Figure:
    """Ours and the bare servicer, call by call in turn, each preparing a fresh claim."""
    node = gpu_node(workdir / "node", hcas=8, gid_table_size=16)
    # With a pod UID, as the chart runs it: the checkpoint is shared with a possible second
    # instance, so a fresh claim also reads it under the claim's lock. Default settings on
    # both sides: the claim reads on their own budget, the status writes after each answer
    # on the driver's, as on a node.
    async with DraStage(node, workdir / "stage", node_name=NODE, pod_uid="bench-pod") as stage:
        assert stage.kubelet is not None
        if not await stage.registered():
            return spec.failed("the driver did not register")
        for i in range(already):
            uid = stage.api.add_claim("bench", f"kept{i}", [
                {"request": "hca", "driver": DRIVER, "pool": NODE, "device": f"mlx5-{i % 8}"}])
            await stage.kubelet.prepare(DRIVER, [("bench", uid, f"kept{i}")])
        kubeconfig = stage.api.write_kubeconfig(workdir / "bare-kubeconfig")
        api = await SliceApi.connect(str(kubeconfig), 5.0)
        bare_dir = workdir / "bare"
        bare_dir.mkdir(parents=True, exist_ok=True)
        path = os.path.join(stage.root, "bare.sock")
        server = grpc.aio.server()
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            _BareDra(api, bare_dir, OffLoop(5.0), already), server)
        server.add_insecure_port("unix://" + path)
        await server.start()
        ours: list[float] = []
        bare: list[float] = []
        try:
            async with grpc.aio.insecure_channel("unix://" + path) as channel:
                stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
                for i in range(calls):
                    uid = stage.api.add_claim("bench", f"c{i}", [
                        {"request": "hca", "driver": DRIVER, "pool": NODE,
                         "device": f"mlx5-{i % 8}"}])
                    start = time.perf_counter()
                    resp = await stage.kubelet.prepare(DRIVER, [("bench", uid, f"c{i}")])
                    ours.append(time.perf_counter() - start)
                    if resp.claims[uid].error:
                        return spec.failed(f"prepare failed: {resp.claims[uid].error}")
                    await stage.kubelet.unprepare(DRIVER, [("bench", uid, f"c{i}")])
                    request = dra_v1_pb2.NodePrepareResourcesRequest(
                        claims=[dra_v1_pb2.Claim(namespace="bench", uid=uid, name=f"c{i}")])
                    start = time.perf_counter()
                    await stub.NodePrepareResources(request, timeout=10)
                    bare.append(time.perf_counter() - start)
        finally:
            await server.stop(0)
            await api.close()
    return spec.figure(
        _p50_ms(ours), _p50_ms(bare),
        note=f"{calls} calls each, alternating; {already} claims already prepared; default "
             "settings; POD_UID set (rolling-update mode); a claim GET "
             "over HTTP from the same fake API server, a CDI spec and the checkpoint written "
             "with fsync and rename; in-process")


async def port_down_latency(workdir: Path, runs: int) -> Figure:
    node = gpu_node(workdir / "node", hcas=8, gid_table_size=16)
    async with DraStage(node, workdir / "stage", node_name=NODE,
                        poll_seconds=DEFAULT_POLL) as stage:
        if not await stage.until(lambda: bool(stage.devices())):
            return DRA_PORT_DOWN.failed("no slice was published")
        assert stage.driver is not None
        spacing = stage.driver.helper.publisher.damper.spacing
        samples: list[float] = []
        for i in range(runs):
            hca = f"mlx5_{i % 8}"
            device = f"mlx5-{i % 8}"
            # The figure is a quiet node's first change: no write within the damper's spacing
            # (a change right after a write waits for it, see dra_flap_slice_writes_30s).
            await asyncio.sleep(spacing)
            start = time.perf_counter()
            node.set_port(hca, up=False)
            if not await stage.until(tainted_is(stage, device, True), timeout=10):
                return DRA_PORT_DOWN.failed("the slice never changed")
            samples.append(time.perf_counter() - start)
            node.set_port(hca, up=True)
            await stage.until(tainted_is(stage, device, False), timeout=10)
    return DRA_PORT_DOWN.figure(
        round(max(samples) * 1000, 1),
        note=f"{runs} runs at the daemon's default health poll ({DEFAULT_POLL:g} s), each on a "
             f"quiet node, slice written over HTTP to the fake API server; "
             f"p50 {_p50_ms(samples)} ms")


async def dra_figures(quick: bool) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="rdma-hca-dra-bench-") as tmp:
        return [
            await prepare_latency(Path(tmp) / "prepare", 10 if quick else 100, 0, DRA_PREPARE),
            await prepare_latency(Path(tmp) / "prepare100", 10 if quick else 100, 100,
                                  DRA_PREPARE_100),
            await port_down_latency(Path(tmp) / "port", 2 if quick else 10),
            *await burst(Path(tmp) / "burst", 20 if quick else 300),
            *await api_figures(Path(tmp) / "api", quick),
        ]


def run_dra_bench(quick: bool = False) -> list[Figure]:
    """The DRA figures, for the benchmark report."""
    return asyncio.run(dra_figures(quick))
