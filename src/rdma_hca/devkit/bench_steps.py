"""The steps of one ``rdma-hca bench`` run (see ``bench``): the daemon started in process
and as processes, then measured against the kubelet emulator and the bare server.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.daemon.deviceplugin.pool import shared_ids
from rdma_hca.daemon.deviceplugin.registration import socket_name
from rdma_hca.daemon.watch.flaps import FLAP_WINDOW_SECONDS
from rdma_hca.devkit.bench_attacks import ATTACK_SPECS, attack_figures
from rdma_hca.devkit.bench_bare import READY_LINE
from rdma_hca.devkit.bench_footprint import FOOTPRINT_SPECS, footprint_figures
from rdma_hca.devkit.bench_lldp import LLDP_SPECS, lldp_figures
from rdma_hca.devkit.bench_plan import (
    ALLOC_P50,
    ALLOC_P99,
    DEFAULT_POLL,
    DOWN_MAX,
    DOWN_MAX_FAST,
    DOWN_MED,
    DOWN_MED_FAST,
    IDLE_CPU,
    IDLE_RSS,
    QUICK,
    RESTART_MAX,
    RESTART_MED,
    START_INPROC,
    START_SERVE,
    Plan,
)
from rdma_hca.devkit.bench_procs import (
    BenchError,
    Child,
    bare_argv,
    compile_package,
    cpu_percent,
    free_tcp_port,
    sample_process,
    scrape_once,
    serve_argv,
)
from rdma_hca.devkit.bench_report import Figure, Spec, median, percentile
from rdma_hca.devkit.bench_trees import LAG_SIZES, step_tree, tree_specs
from rdma_hca.devkit.dra.bench import DRA_SPECS, dra_figures
from rdma_hca.settings.model import Settings

if TYPE_CHECKING:
    from rdma_hca.daemon._proto.api_pb2_grpc import DevicePluginAsyncStub

RESOURCE = "rdma/hca"
SLOTS = 1000
REGISTER_TIMEOUT = 30.0
EVENT_TIMEOUT = 10.0
_CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]


def _ms(seconds: float) -> float:
    return seconds * 1000.0


class Bench:
    """One benchmark run: a work directory, the emulator, the children, the figures."""

    def __init__(self, plan: Plan, workdir: Path, log: Callable[[str], None]) -> None:
        from rdma_hca.devkit.sim.kubelet import KubeletEmulator
        from rdma_hca.devkit.sim.nodes import gpu_node

        self.plan = plan
        self.workdir = workdir
        self.say = log
        if compile_package():
            log("some of rdma_hca's modules did not compile: their children compile them "
                "at each start")
        self.node = gpu_node(workdir / "node")
        self.plugin_dir = workdir / "dp"
        self.plugin_dir.mkdir()
        self.kubelet = KubeletEmulator(self.plugin_dir)
        self.children: list[Child] = []
        self.figures: dict[str, Figure] = {}
        self.details: dict[str, Any] = {}
        self.rng = random.Random(20240611)

    # --- plumbing -----------------------------------------------------------------------

    async def guarded(self, specs: Sequence[Spec], step: Callable[[], Awaitable[None]]) -> None:
        """Run one step; if it fails, its rows say why instead of the whole run failing."""
        try:
            await step()
        except Exception as exc:  # one broken step must not cost the other figures
            why = str(exc).split("\n", 1)[0] or type(exc).__name__
            self.say(f"  failed: {type(exc).__name__}: {exc}")
            for spec in specs:
                self.figures.setdefault(spec.key, spec.failed(why))

    def put(self, figure: Figure) -> None:
        self.figures[figure.key] = figure

    async def spawn(self, child: Child) -> Child:
        self.children.append(child)
        await child.start()
        return child

    async def stop_child(self, child: Child) -> None:
        await child.stop()
        if child in self.children:
            self.children.remove(child)

    async def stop_all(self) -> None:
        for child in list(self.children):
            await self.stop_child(child)

    def _registered_after(self, before: int) -> Callable[[], bool]:
        k = self.kubelet

        def registered() -> bool:
            return k.registrations(RESOURCE) > before and k.allocatable(RESOURCE) == SLOTS

        return registered

    async def start_serve(self, tag: str, extra: Sequence[str] = ()) -> tuple[Child, float]:
        """Start ``rdma-hca serve``; return it and seconds from spawn to registered with 1000."""
        metrics = f"127.0.0.1:{free_tcp_port()}"
        argv = serve_argv(str(self.node.sysfs_root), str(self.node.dev_root),
                          str(self.plugin_dir), metrics, extra)
        child = Child(f"rdma-hca serve ({tag})", argv, str(self.workdir / f"serve-{tag}.log"))
        before = self.kubelet.registrations(RESOURCE)
        started = time.perf_counter()
        await self.spawn(child)
        await child.race(self.kubelet.wait_for(self._registered_after(before), REGISTER_TIMEOUT),
                         "waiting for it to register")
        return child, time.perf_counter() - started

    async def start_bare(self, tag: str, response_path: str) -> tuple[Child, str, float]:
        sock = str(self.workdir / f"bare-{tag}.sock")
        child = Child(f"bare server ({tag})", bare_argv(sock, response_path),
                      str(self.workdir / f"bare-{tag}.log"), ready_line=READY_LINE)
        started = time.perf_counter()
        await self.spawn(child)
        await child.wait_ready(REGISTER_TIMEOUT)
        return child, sock, time.perf_counter() - started

    # --- the run ------------------------------------------------------------------------

    async def run(self) -> None:
        await self.kubelet.start()
        try:
            await self._run_steps()
        finally:
            await self.stop_all()
            await self.kubelet.stop()

    async def _run_steps(self) -> None:
        response_path = str(self.workdir / "allocate-response.bin")
        self.say("footprint: each front end's memory and start-up, by where it goes")
        await self.guarded(FOOTPRINT_SPECS, self.step_footprint)
        self.say("start → registered (in process)")
        await self.guarded([START_INPROC], self.step_start_inprocess)
        self.say("start → registered (rdma-hca serve processes, and bare processes)")
        await self.guarded([START_SERVE], lambda: self.step_start_processes(response_path))
        self.say("idle footprint, then Allocate latency, port flaps, kubelet restarts")
        await self.guarded([IDLE_RSS, IDLE_CPU, ALLOC_P50, ALLOC_P99, DOWN_MED, DOWN_MAX,
                            RESTART_MED, RESTART_MAX],
                           lambda: self.step_long_lived(response_path))
        self.say("port flaps with --health-poll-seconds 0.25")
        await self.guarded([DOWN_MED_FAST, DOWN_MAX_FAST], self.step_fast_poll)
        for size in self.plan.discovery_sizes:
            self.say(f"discovery on {size} HCAs × 2 ports × 256 GIDs"
                     + (", and the event loop's lag" if size in LAG_SIZES else ""))
            await self.guarded(tree_specs(size), self._tree_step(size))
        self.say("hostile load: 20 clients, floods of bad requests, stray streams, 20k IDs")
        await self.guarded(ATTACK_SPECS, self.step_attacks)
        self.say("DRA: NodePrepareResources, port down → ResourceSlice tainted")
        await self.guarded(DRA_SPECS, self.step_dra)
        self.say("LLDP: a 10,000 frames/s flood, switch change → ResourceSlice")
        await self.guarded(LLDP_SPECS, self.step_lldp)

    async def step_lldp(self) -> None:
        for figure in await lldp_figures(self.plan is QUICK):
            self.put(figure)

    async def step_footprint(self) -> None:
        for figure in await footprint_figures(self, self.plan is QUICK):
            self.put(figure)

    async def step_dra(self) -> None:
        for figure in await dra_figures(self.plan is QUICK):
            self.put(figure)

    async def step_attacks(self) -> None:
        attacks = self.workdir / "attacks"
        attacks.mkdir(exist_ok=True)
        for figure in await attack_figures(str(attacks), self.plan is QUICK):
            self.put(figure)

    # --- 1. start-up ---------------------------------------------------------------------

    async def step_start_inprocess(self) -> None:
        from rdma_hca.daemon.wiring import Daemon

        settings = Settings(sysfs_root=str(self.node.sysfs_root),
                            dev_root=str(self.node.dev_root),
                            kubelet_dir=str(self.plugin_dir), metrics_address="")
        times: list[float] = []
        for _ in range(self.plan.start_runs):
            before = self.kubelet.registrations(RESOURCE)
            started = time.perf_counter()
            daemon = Daemon(settings, netlink=False)
            try:
                await daemon.start()
                await self.kubelet.wait_for(self._registered_after(before), REGISTER_TIMEOUT)
                times.append(time.perf_counter() - started)
            finally:
                await daemon.stop()
        self.details["start_inprocess_ms"] = [_ms(t) for t in times]
        self.put(START_INPROC.figure(
            _ms(median(times)),
            note=f"median of {len(times)}: `Daemon(settings)` to the emulator holding a new "
                 "registration with 1000 Healthy devices, in the benchmark's own event loop "
                 "(no interpreter start, metrics off)."))

    async def step_start_processes(self, response_path: str) -> None:
        ours: list[float] = []
        bare: list[float] = []
        # Any valid response does for start-up; the real one is taken later from the daemon.
        Path(response_path).write_bytes(api_pb2.AllocateResponse().SerializeToString())
        for run in range(self.plan.start_runs):
            child, took = await self.start_serve(f"start{run}")
            ours.append(took)
            await self.stop_child(child)
            bare_child, _, took = await self.start_bare(f"start{run}", response_path)
            bare.append(took)
            await self.stop_child(bare_child)
        self.details["start_serve_ms"] = [_ms(t) for t in ours]
        self.details["start_bare_ms"] = [_ms(t) for t in bare]
        self.put(START_SERVE.figure(
            _ms(median(ours)), _ms(median(bare)),
            note=f"median of {len(ours)}: from spawning `rdma-hca serve` to the "
                 "emulator holding a new registration with 1000 Healthy devices (interpreter "
                 "start and imports included). Baseline: spawning the bare grpc.aio server "
                 "until it prints that it serves (it does not register)."))

    # --- 2, 3, 4, 6. one long-lived daemon process ------------------------------------

    async def step_long_lived(self, response_path: str) -> None:
        serve, _ = await self.start_serve("main")
        ours_sock = str(self.plugin_dir / socket_name(RESOURCE))
        async with grpc.aio.insecure_channel("unix://" + ours_sock,
                                             options=_CHANNEL_OPTIONS) as ours_ch:
            ours_stub: DevicePluginAsyncStub = api_pb2_grpc.DevicePluginStub(ours_ch)
            first = await serve.race(ours_stub.Allocate(_request(0)), "answering Allocate")
            Path(response_path).write_bytes(first.SerializeToString())
            bare, bare_sock, _ = await self.start_bare("main", response_path)
            async with grpc.aio.insecure_channel("unix://" + bare_sock,
                                                 options=_CHANNEL_OPTIONS) as bare_ch:
                bare_stub: DevicePluginAsyncStub = api_pb2_grpc.DevicePluginStub(bare_ch)
                echo = await bare_stub.Allocate(_request(0))
                # Compared as messages: a map's entries (the env) may be serialized in
                # another order by the other process, which is the same response.
                if echo != first:
                    raise BenchError("the bare server's Allocate response differs from the "
                                     "daemon's; the comparison would not be fair")
                await self.measure_idle(serve, bare)
                await self.measure_allocate(serve, ours_stub, bare_stub)
            await self.stop_child(bare)
        await self.measure_flaps(serve, DEFAULT_POLL, DOWN_MED, DOWN_MAX, "poll_default")
        await self.measure_restarts(serve)
        await self.stop_child(serve)

    async def measure_idle(self, serve: Child, bare: Child) -> None:
        window = self.plan.idle_seconds
        # Scraped once, as on a node: the Prometheus client is loaded by the first scrape.
        metrics = serve.argv[serve.argv.index("--metrics-address") + 1]
        await serve.race(scrape_once(metrics), "answering a scrape")
        await asyncio.sleep(self.plan.settle_seconds)
        pids = {"ours": serve.pid, "bare": bare.pid}
        before = {k: sample_process(pid) for k, pid in pids.items()}
        started = time.perf_counter()
        await serve.race(asyncio.sleep(window), "idle")
        elapsed = time.perf_counter() - started
        after = {k: sample_process(pid) for k, pid in pids.items()}
        rss = {k: s.rss_kib / 1024 for k, s in after.items()}
        cpu = {k: cpu_percent(before[k], after[k], elapsed) for k in pids}
        self.details["idle"] = {"window_s": round(elapsed, 3), "rss_mib": rss,
                                "cpu_percent": cpu, "ticks_per_second": os.sysconf("SC_CLK_TCK")}
        self.put(IDLE_RSS.figure(
            rss["ours"], rss["bare"],
            note="VmRSS from /proc/PID/status after the window below: `rdma-hca serve` "
                 "registered and idle (default settings except paths; metrics on a free port; "
                 "one Allocate answered, then one /metrics scrape) against the bare server "
                 "process (one Allocate answered)."))
        self.put(IDLE_CPU.figure(
            cpu["ours"], cpu["bare"] if cpu["bare"] > 0 else None,
            note=f"utime+stime from /proc/PID/stat over {elapsed:.1f} s, after "
                 f"{self.plan.settle_seconds:g} s to settle; resolution is one clock tick "
                 f"(1/{os.sysconf('SC_CLK_TCK')} s), so a bare server at 0 ticks shows no "
                 "baseline."))

    async def measure_allocate(self, serve: Child,
                               ours: DevicePluginAsyncStub,
                               bare: DevicePluginAsyncStub) -> None:
        plan = self.plan
        samples: dict[str, list[float]] = {"ours": [], "bare": []}
        stubs = {"ours": ours, "bare": bare}
        for name, stub in stubs.items():
            await serve.race(_allocate_loop(stub, plan.allocate_warmup, []), f"warm-up ({name})")
        # Alternate blocks so a drift in the machine's load hits both sides alike.
        per_block = max(1, plan.allocate_calls // plan.allocate_blocks)
        for block in range(plan.allocate_blocks):
            order = ["ours", "bare"] if block % 2 == 0 else ["bare", "ours"]
            for name in order:
                await serve.race(_allocate_loop(stubs[name], per_block, samples[name]),
                                 f"Allocate ({name})")
        p50 = {k: _ms(percentile(v, 50)) for k, v in samples.items()}
        p99 = {k: _ms(percentile(v, 99)) for k, v in samples.items()}
        self.details["allocate"] = {"calls_each": len(samples["ours"]), "p50_ms": p50,
                                    "p99_ms": p99,
                                    "mean_ms": {k: _ms(sum(v) / len(v))
                                                for k, v in samples.items()}}
        how = (f"{len(samples['ours'])} sequential calls each after {plan.allocate_warmup} "
               f"warm-up calls, in {plan.allocate_blocks} alternating blocks, one container "
               "asking one ID, timed around the client call over the unix socket (the "
               "kubelet's side). Both servers are processes of their own and send the same "
               "response bytes.")
        self.put(ALLOC_P50.figure(p50["ours"], p50["bare"], note=how))
        self.put(ALLOC_P99.figure(p99["ours"], p99["bare"]))

    async def measure_flaps(self, serve: Child, poll: float, med: Spec, worst: Spec,
                            tag: str) -> None:
        k = self.kubelet
        hcas = self.node.hca_names
        down: list[float] = []
        up: list[float] = []
        last: dict[str, float] = {}  # when each HCA last changed
        for n in range(self.plan.flaps):
            hca = hcas[n % len(hcas)]
            # One change at a time, as a port that goes down once: an HCA changed again
            # within the flap window would be held down for flapHoldSeconds (a flap, not
            # what this measures).
            if hca in last:
                await asyncio.sleep(max(0.0, last[hca] + FLAP_WINDOW_SECONDS + 0.5
                                        - time.perf_counter()))
            # A random phase against the poll tick: flapping right after a tick would
            # always measure the worst case, right before one always the best.
            await asyncio.sleep(self.rng.uniform(0.0, poll))
            started = time.perf_counter()
            self.node.set_port(hca, 1, up=False)
            await serve.race(k.wait_for(lambda: k.allocatable(RESOURCE) == 0, EVENT_TIMEOUT),
                             f"waiting for {hca} down to show")
            down.append(time.perf_counter() - started)
            started = time.perf_counter()
            self.node.set_port(hca, 1, up=True)
            await serve.race(k.wait_for(lambda: k.allocatable(RESOURCE) == SLOTS, EVENT_TIMEOUT),
                             f"waiting for {hca} up to show")
            up.append(time.perf_counter() - started)
            last[hca] = time.perf_counter()
        self.details[f"port_flaps_{tag}"] = {"down_ms": [_ms(t) for t in down],
                                             "up_ms": [_ms(t) for t in up]}
        note = (f"{len(down)} flaps over the node's HCAs, each after a random wait of 0 to "
                f"{poll:g} s: `SimNode.set_port(up=False)` until the emulator's allocatable is "
                "0. Netlink sees no events for simulated netdevs, so this is the poll path; "
                f"port up → Healthy again: median {_ms(median(up)):.0f} ms, "
                f"max {_ms(max(up)):.0f} ms.")
        self.put(med.figure(_ms(median(down)), note=note))
        self.put(worst.figure(_ms(max(down))))

    async def measure_restarts(self, serve: Child) -> None:
        k = self.kubelet
        total: list[float] = []
        after_listen: list[float] = []
        registrations: list[int] = []
        for _ in range(self.plan.restarts):
            before = k.registrations(RESOURCE)
            started = time.perf_counter()
            await k.restart()
            listening = time.perf_counter()
            await serve.race(k.wait_for(self._registered_after(before), EVENT_TIMEOUT),
                             "waiting for it to register again")
            done = time.perf_counter()
            total.append(done - started)
            after_listen.append(done - listening)
            # Let late triggers (a deleted socket noticed after the new registration) land,
            # then count how many registrations the restart cost.
            await asyncio.sleep(0.3 + self.rng.uniform(0.0, 0.2))
            await serve.race(k.wait_for(lambda: k.allocatable(RESOURCE) == SLOTS, EVENT_TIMEOUT),
                             "settling after a restart")
            registrations.append(k.registrations(RESOURCE) - before)
        self.details["kubelet_restarts"] = {
            "from_restart_call_ms": [_ms(t) for t in total],
            "from_listening_ms": [_ms(t) for t in after_listen],
            "registrations_per_restart": registrations,
        }
        self.put(RESTART_MED.figure(
            _ms(median(total)),
            note=f"{len(total)} restarts: from calling `KubeletEmulator.restart()` (stop, "
                 "remove the sockets, listen again) until a new registration with 1000 Healthy "
                 f"devices; from the new kubelet.sock listening: median "
                 f"{_ms(median(after_listen)):.0f} ms. Registrations per restart: "
                 f"{', '.join(map(str, registrations))}."))
        self.put(RESTART_MAX.figure(_ms(max(total))))

    def _tree_step(self, hcas: int) -> Callable[[], Awaitable[None]]:
        async def step() -> None:
            await step_tree(self, hcas, self.plan.discovery_runs, self.plugin_dir)

        return step

    async def step_fast_poll(self) -> None:
        serve, _ = await self.start_serve("poll025", ["--health-poll-seconds", "0.25"])
        await self.measure_flaps(serve, 0.25, DOWN_MED_FAST, DOWN_MAX_FAST, "poll_0_25s")
        await self.stop_child(serve)


_IDS = shared_ids(SLOTS)


def _request(n: int) -> api_pb2.AllocateRequest:
    """One container asking one slot, cycling through the IDs as successive pods would."""
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[_IDS[n % SLOTS]])])


async def _allocate_loop(stub: DevicePluginAsyncStub, calls: int,
                         samples: list[float]) -> None:
    requests = [_request(n) for n in range(calls)]
    clock = time.perf_counter
    for request in requests:
        started = clock()
        await stub.Allocate(request)
        samples.append(clock() - started)
