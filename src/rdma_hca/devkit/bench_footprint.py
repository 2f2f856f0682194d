"""Footprint figures for ``make bench``: each front end's memory after start and after a burst,
split by where it goes, and its start-up split into phases, against the bare floor.

Each front end (the device plugin with default settings; the DRA driver alone, on a 13-HCA
node, against the devkit's fake API server over HTTPS with a CA of its own, as in a pod)
runs as ``rdma-hca serve`` inside ``bench_footprint_child``, which first imports what that
front end loads one package at a time (in the order the command itself loads them), noting
VmRSS after each; what a package costs is its growth there. After registration and again
after a burst (2000 Allocates over 10 connections; 100 NodePrepareResources and
NodeUnprepareResources of fresh claims, 10 at once) the child reports its VmRSS, and once
more between the two, after one ``/metrics`` scrape: the Prometheus client is loaded by the
first scrape, not at start, and a daemon on a node is scraped, so the figure after start is
taken after that scrape (the note gives the one before it). Each report splits VmRSS into
the imports, the anonymous memory that is not a thread stack (the heap: objects, caches,
buffers), thread stacks, and the TLS contexts it made (each priced by what one costs in a
fresh interpreter).

The bare floor is ``bench_bare``: a process that imports grpc and serves one unix socket,
started, asked one Allocate and measured in the same run.

``python -m rdma_hca.devkit.bench_footprint_alone [--quick]`` runs this section alone and prints
its figures and their split as JSON (``make bench`` runs it with the rest).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.devkit.bench_bare import READY_LINE
from rdma_hca.devkit.bench_procs import BenchError, Child, bare_argv, free_tcp_port, scrape_once
from rdma_hca.devkit.bench_report import Figure, Spec, Target, median

# What `serve` imports, then what its start loads of its own (the kubelet directories' inotify
# watch). Each front end's modules load when the daemon is made, and only that front end's:
SERVE_ENTRIES = ("rdma_hca.cli", "rdma_hca.daemon.main", "asyncinotify")
# the device plugin's pools, lifecycle and Allocate counts,
DP_ENTRIES = (*SERVE_ENTRIES, "rdma_hca.daemon.deviceplugin.kubelet",
              "rdma_hca.daemon.deviceplugin.runtime", "rdma_hca.daemon.deviceplugin.allocations")
# the DRA driver's modules and its Event recorder's.
DRA_ENTRIES = ("rdma_hca.daemon.dra.driver", "rdma_hca.daemon.dra.config",
               "rdma_hca.daemon.offer.nodeevents")
# What the API client loads when it is built (kube.client._build_http).
API_ENTRIES = ("httpx2", "lightkube", "lightkube.config.client_adapter", "httpcore2", "anyio", "h2",
               "truststore")
DRA_HCAS = 13
DRIVER = "rdma-hca.io"
NODE = "bench-node"
REPORT_TIMEOUT = 10.0
_MIB = 1024.0

FP_DP_START = Spec("fp_dp_rss_start_mib", "device plugin RSS after start and one scrape", "MiB",
                   Target(1.15, on_ratio=True), "bare grpc.aio process")
FP_DP_BURST = Spec("fp_dp_rss_burst_mib", "device plugin RSS after 2000 Allocates", "MiB",
                   baseline_label="the same, after start")
FP_DRA_START = Spec("fp_dra_rss_start_mib",
                    f"DRA driver alone RSS after start and one scrape, {DRA_HCAS} HCAs", "MiB",
                    Target(50.0), "bare grpc.aio process")
FP_DRA_BURST = Spec("fp_dra_rss_burst_mib", "DRA driver alone RSS after 100 prepares", "MiB",
                    baseline_label="the same, after start")
FP_DP_UP = Spec("fp_dp_start_ms", "start → registered, device plugin (median, phases in note)",
                "ms", Target(2.5, on_ratio=True), "bare process start → serving")
FP_DRA_UP = Spec("fp_dra_start_ms", "start → registered, DRA driver alone (median)", "ms",
                 Target(2.5, on_ratio=True), "bare process start → serving")
FOOTPRINT_SPECS = [FP_DP_START, FP_DP_BURST, FP_DRA_START, FP_DRA_BURST, FP_DP_UP, FP_DRA_UP]


def _child_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "rdma_hca.devkit.bench_footprint_child", *args]


async def import_groups(entries: Sequence[str]) -> tuple[str, int, str]:
    """(GROUPS for the run child, KiB of one TLS context, how it was made)."""
    proc = await asyncio.create_subprocess_exec(
        *_child_argv("order", *entries), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise BenchError(f"listing the imports of {', '.join(entries)} failed: "
                         f"{err.decode(errors='replace')[-500:]}")
    doc = json.loads(out)
    merged: list[tuple[str, list[str]]] = []
    for label, mods in doc["groups"]:
        # Cython's runtime modules belong with the extension that loaded them.
        if merged and (label.startswith("_") or label == "cython_runtime"):
            merged[-1][1].extend(mods)
        else:
            merged.append((label, list(mods)))
    groups = ";".join(f"{label}={','.join(mods)}" for label, mods in merged)
    return groups, int(doc["tls_context_kib"]), str(doc["tls_kind"])


class Measured:
    """One front end running in the footprint child, its reports taken on request."""

    def __init__(self, child: Child, report: Path, spawned: float) -> None:
        self.child = child
        self.report = report
        self.spawned = spawned

    async def take(self) -> dict[str, Any]:
        self.report.unlink(missing_ok=True)
        os.kill(self.child.pid, signal.SIGUSR1)
        deadline = time.monotonic() + REPORT_TIMEOUT
        while not self.report.exists():
            if time.monotonic() > deadline or self.child.exited():
                raise BenchError(f"{self.child.name} wrote no report{self.child.log_tail()}")
            await asyncio.sleep(0.02)
        doc: dict[str, Any] = json.loads(self.report.read_text())
        return doc


def split(doc: dict[str, Any], tls_kib: int) -> dict[str, Any]:
    """Where VmRSS goes, in MiB."""
    status = doc["status_kib"]
    steps = doc["imports_kib"]
    imports = {label: round((kib - steps[i - 1][1]) / _MIB, 2)
               for i, (label, kib) in enumerate(steps) if i > 0}
    imported = steps[-1][1]
    stacks = doc["stacks_kib"]
    tls = doc["tls_contexts_made"]
    return {
        "rss": round(status["VmRSS"] / _MIB, 2),
        "interpreter": round(steps[0][1] / _MIB, 2),
        "imports": imports,
        "after_imports": round(imported / _MIB, 2),
        "since_imports": round((status["VmRSS"] - imported) / _MIB, 2),
        "anon": round(status["RssAnon"] / _MIB, 2),
        "file": round(status["RssFile"] / _MIB, 2),
        "heap": round((status["RssAnon"] - stacks) / _MIB, 2),
        "thread_stacks": round(stacks / _MIB, 2),
        "threads": status["Threads"],
        "python_threads": doc["threads"],
        "tls_contexts": tls,
        "big_anonymous_kib": doc["big_anonymous_kib"],
        "tls_contexts_mib_each": round(tls_kib / _MIB, 2),
        "loaded_after_imports": doc["loaded_after_imports"],
    }


def split_text(s: dict[str, Any]) -> str:
    biggest = sorted(s["imports"].items(), key=lambda kv: -kv[1])
    imports = ", ".join(f"{k} {v:.1f}" for k, v in biggest if v >= 0.05)
    return (f"interpreter {s['interpreter']:.1f} MiB; imports {imports} (MiB, each measured as "
            f"it loads, in the order the command loads them); since the imports "
            f"{s['since_imports']:.1f} MiB; of VmRSS, anonymous {s['anon']:.1f} (heap "
            f"{s['heap']:.1f}, thread stacks {s['thread_stacks']:.1f} for {s['threads']} "
            f"threads) and file-backed {s['file']:.1f}; {s['tls_contexts']} TLS context(s) "
            f"made, {s['tls_contexts_mib_each']:.1f} MiB each in a fresh interpreter; "
            f"loaded after the imports: {', '.join(s['loaded_after_imports']) or 'nothing'}")


def phases(doc: dict[str, Any], spawned: float, registered: float) -> dict[str, float]:
    marks = doc["marks"]
    return {
        "interpreter_ms": round((marks["main"] - spawned) * 1000, 1),
        "imports_ms": round((marks["imports"] - marks["main"]) * 1000, 1),
        "to_sysfs_read_ms": round((marks.get("sysfs", marks["imports"]) - marks["imports"])
                                  * 1000, 1),
        "to_registered_ms": round((registered - marks.get("sysfs", marks["imports"])) * 1000,
                                  1),
    }


def phases_text(p: dict[str, float]) -> str:
    return (f"interpreter {p['interpreter_ms']:.0f} ms, imports {p['imports_ms']:.0f} ms "
            f"(measured one package at a time), first sysfs read done "
            f"{p['to_sysfs_read_ms']:.0f} ms later (the daemon's own remaining imports "
            f"included), registered {p['to_registered_ms']:.0f} ms after that")


class Footprint:
    """The footprint step of one run: needs the run's node, emulator and work directory."""

    def __init__(self, workdir: Path, runs: int, spawn: Callable[[Child], Awaitable[Child]],
                 stop: Callable[[Child], Awaitable[None]]) -> None:
        self.workdir = workdir
        self.runs = runs
        self.spawn = spawn
        self.stop = stop
        self.details: dict[str, Any] = {}

    async def bare_rss(self) -> float:
        """The bare floor's RSS (MiB) after one Allocate."""
        return (await self.bare_start("bare", measure=True))[1]

    async def bare_start(self, tag: str, measure: bool = False) -> tuple[float, float]:
        """One start of the bare server: ms from spawning to serving, and with ``measure``
        its RSS (MiB) after one Allocate."""
        response = self.workdir / "fp-response.bin"
        if not response.exists():
            response.write_bytes(api_pb2.AllocateResponse().SerializeToString())
        sock = str(self.workdir / f"fp-{tag}.sock")
        child = Child("bare server (footprint)", bare_argv(sock, str(response)),
                      str(self.workdir / f"fp-{tag}.log"), ready_line=READY_LINE)
        started = time.perf_counter()
        await self.spawn(child)
        await child.wait_ready(30.0)
        took = (time.perf_counter() - started) * 1000
        rss = 0.0
        if measure:
            async with grpc.aio.insecure_channel("unix://" + sock) as ch:
                await api_pb2_grpc.DevicePluginStub(ch).Allocate(api_pb2.AllocateRequest())
            from rdma_hca.devkit.bench_procs import sample_process

            rss = sample_process(child.pid).rss_kib / _MIB
        await self.stop(child)
        return took, rss

    async def run(self, run: int, tag: str, groups: str, tls_kib: int, serve: Sequence[str],
                  env: dict[str, str] | None, registered: Callable[[], Awaitable[None]],
                  metrics: str, burst: tuple[str, Callable[[], Awaitable[None]]],
                  got: dict[str, Any]) -> None:
        """Run ``run`` of a front end. The first imports ``groups`` one package at a time
        and is measured after start, after one scrape and after ``burst`` (what it is
        doing, and doing it) into ``got``; the others import nothing ahead and are timed
        (``got["start_ms"]``)."""
        if run > 0:
            # A bare start just before each timed one: the machine's load drifts within a
            # run, and each ratio should compare starts made under the same load.
            got.setdefault("bare_ms", []).append(
                (await self.bare_start(f"bare-{tag}{run}"))[0])
        measured, took = await self.start(f"{tag}{run}", groups if run == 0 else "", serve,
                                           env, registered)
        if run > 0:
            got.setdefault("start_ms", []).append(took * 1000)
        else:
            doc = await measured.take()
            got["start"] = split(doc, tls_kib)
            got["phases"] = phases(doc, measured.spawned, measured.spawned + took)
            await measured.child.race(scrape_once(metrics), "answering a scrape")
            got["scraped"] = split(await measured.take(), tls_kib)
            what, doing = burst
            await measured.child.race(doing(), what)
            got["burst"] = split(await measured.take(), tls_kib)
        await self.stop(measured.child)

    async def start(self, tag: str, groups: str, serve: Sequence[str],
                    env: dict[str, str] | None,
                    registered: Callable[[], Awaitable[None]]) -> tuple[Measured, float]:
        """Spawn ``serve`` in the measuring child; ``groups`` empty: nothing imported ahead,
        so the time to registration is the command's own (the first run of each front end
        imports the groups one at a time for the memory split and is not timed)."""
        report = self.workdir / f"fp-{tag}.json"
        argv = _child_argv("run", str(report), groups, "--", "serve", *serve)
        child = Child(f"rdma-hca serve ({tag}, footprint)", argv,
                      str(self.workdir / f"fp-{tag}.log"), env=env)
        spawned = time.time()
        started = time.perf_counter()
        await self.spawn(child)
        await child.race(registered(), "waiting for it to register")
        took = time.perf_counter() - started
        return Measured(child, report, spawned), took


def figures(fronts: dict[str, dict[str, Any]], bare_rss: float) -> list[Figure]:
    out: list[Figure] = []
    for key, start_spec, burst_spec, up_spec in (
            ("dp", FP_DP_START, FP_DP_BURST, FP_DP_UP),
            ("dra", FP_DRA_START, FP_DRA_BURST, FP_DRA_UP)):
        got = fronts.get(key)
        if got is None:
            continue
        first, after = got["scraped"], got["burst"]
        unscraped = got["start"]
        out.append(start_spec.figure(
            first["rss"], bare_rss,
            note=f"after registering and one /metrics scrape: {split_text(first)}; before "
                 f"that scrape (registered, the Prometheus client not loaded yet) "
                 f"{unscraped['rss']:.1f} MiB: {split_text(unscraped)}"))
        out.append(burst_spec.figure(after["rss"], first["rss"], note=split_text(after)))
        out.append(up_spec.figure(
            median(got["start_ms"]), median(got["bare_ms"]),
            note=f"median of {len(got['start_ms'])}, from spawning to registered, nothing "
                 "imported ahead, each just after a bare start (whose median is the "
                 "baseline)"
                 + ("; the DRA kubelet emulator looks for the registration socket every "
                    "2 ms" if key == "dra" else "")
                 + "; phases of the memory run (imports taken one package at a time): "
                 + phases_text(got["phases"])))
    return out


def footprint_tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="fp-", dir="/tmp"))


async def _allocate_burst(sock: str, calls: int, connections: int) -> None:
    from rdma_hca.daemon.deviceplugin.pool import shared_ids

    ids = shared_ids(1000)

    async def one(n: int) -> None:
        async with grpc.aio.insecure_channel("unix://" + sock,
                                             options=[("grpc.enable_http_proxy", 0)]) as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)
            for i in range(calls // connections):
                await stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=[ids[(n + i) % 1000]])]))

    await asyncio.gather(*(one(n) for n in range(connections)))


async def device_plugin(fp: Footprint, bench: Any, quick: bool) -> dict[str, Any]:
    """The device plugin with default settings on the run's node and kubelet emulator."""
    from rdma_hca.daemon.deviceplugin.registration import socket_name
    from rdma_hca.devkit.bench_procs import serve_argv

    groups, tls_kib, _ = await import_groups(DP_ENTRIES)
    metrics = f"127.0.0.1:{free_tcp_port()}"
    serve = serve_argv(str(bench.node.sysfs_root), str(bench.node.dev_root),
                       str(bench.plugin_dir), metrics)[4:]
    got: dict[str, Any] = {"start_ms": []}
    sock = str(bench.plugin_dir / socket_name("rdma/hca"))
    burst = ("answering the Allocate burst",
             lambda: _allocate_burst(sock, 400 if quick else 2000, 10))
    for run in range(fp.runs + 1):
        before = bench.kubelet.registrations("rdma/hca")

        async def registered(before: int = before) -> None:
            await bench.kubelet.wait_for(bench._registered_after(before), 30.0)

        await fp.run(run, "dp", groups, tls_kib, serve, None, registered, metrics, burst, got)
    return got


async def dra_alone(fp: Footprint, quick: bool) -> dict[str, Any]:
    """The DRA driver alone on a 13-HCA node, against the fake API server and the DRA
    kubelet emulator."""
    import shutil

    from rdma_hca.devkit.dra.kubelet import DraKubelet
    from rdma_hca.devkit.kube.apiserver import FakeApiServer
    from rdma_hca.devkit.kube.certs import ca_data, server_tls
    from rdma_hca.devkit.sim.nodes import gpu_node

    groups, tls_kib, _ = await import_groups((*SERVE_ENTRIES, *DRA_ENTRIES, *API_ENTRIES))
    node = gpu_node(fp.workdir / "fp-dra-node", hcas=DRA_HCAS)
    # Over HTTPS with the cluster's CA alone, as in a pod (the service account's ca.crt):
    # the driver makes the TLS context a node pays for.
    api = FakeApiServer(tls=server_tls(fp.workdir / "fp-tls")).start()
    root = footprint_tmp()
    got: dict[str, Any] = {"start_ms": []}
    try:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(fp.workdir / "fp-kubeconfig", ca=ca_data())
        env = {"KUBECONFIG": str(kubeconfig), "NODE_NAME": NODE}
        metrics = f"127.0.0.1:{free_tcp_port()}"
        serve = ["--dra", "--no-device-plugin", "--sysfs-root", str(node.sysfs_root),
                 "--dev-root", str(node.dev_root), "--kubelet-root", str(root),
                 "--metrics-address", metrics,
                 "--dra-start-jitter-seconds", "0"]
        for run in range(fp.runs + 1):
            # The kubelet's plugin watcher hears of the registration socket from inotify
            # (its reconciler then takes its own time, up to a second, which is the
            # kubelet's and not the driver's): the emulator looks every 2 ms rather than
            # its default 20, so the figure is the driver's start, not half a poll.
            kubelet = DraKubelet(str(root), NODE, poll_seconds=0.002)
            await kubelet.start()
            try:
                async def registered(k: DraKubelet = kubelet) -> None:
                    if not await k.wait_registered(DRIVER, 1, 30.0):
                        raise BenchError("the DRA driver did not register")

                burst = ("answering the prepare burst",
                         lambda k=kubelet: _prepare_burst(api, k, 20 if quick else 100, 10))
                await fp.run(run, "dra", groups, tls_kib, serve, env, registered, metrics,
                             burst, got)
            finally:
                await kubelet.stop()
    finally:
        api.stop()
        shutil.rmtree(root, ignore_errors=True)
    return got


async def _prepare_burst(api: Any, kubelet: Any, claims: int, at_once: int) -> None:
    async def one(i: int) -> None:
        uid = api.add_claim("bench", f"fp{i}", [
            {"request": "hca", "driver": DRIVER, "pool": NODE, "device": f"mlx5-{i % DRA_HCAS}"}])
        resp = await kubelet.prepare(DRIVER, [("bench", uid, f"fp{i}")])
        if resp.claims[uid].error:
            raise BenchError(f"prepare failed: {resp.claims[uid].error}")
        await kubelet.unprepare(DRIVER, [("bench", uid, f"fp{i}")])

    for first in range(0, claims, at_once):
        await asyncio.gather(*(one(i) for i in range(first, min(claims, first + at_once))))


async def footprint_figures(bench: Any, quick: bool) -> list[Figure]:
    """Every footprint figure of the run; ``bench`` is the run's Bench (node, emulator)."""
    # Run 0 of each front end is the memory run; the rest are timed, each beside a bare
    # start (a start is a fraction of a second: the median of six steadies the ratio).
    fp = Footprint(bench.workdir, 2 if quick else 6, bench.spawn, bench.stop_child)
    bare_rss = await fp.bare_rss()
    fronts = {"dp": await device_plugin(fp, bench, quick), "dra": await dra_alone(fp, quick)}
    bench.details["footprint"] = {"bare_rss_mib": round(bare_rss, 2), **fronts}
    return figures(fronts, bare_rss)

