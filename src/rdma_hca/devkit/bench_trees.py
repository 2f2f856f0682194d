"""Benchmarks on large simulated trees: discovery, and the event loop's lag under load.

For each size one tree is built (HCAs × 2 ports × 256 GIDs) and used twice:

- ``discover_node`` timed against the syscall floor of reading the GID files;
- for 64 and 256 HCAs, a daemon runs in-process on the tree while a timer measures
  how late the event loop wakes it (its worst lag) during /metrics scrapes and during
  rediscoveries, against the same timer on the same daemon left idle. Everything the
  daemon does on the loop shows up as lag; reads of the machine run on threads.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from rdma_hca.devkit.bench_report import Figure, Spec, Target, median, percentile

LAG_SIZES = (64, 256)
LAG_TIMER = 0.001  # the timer asks to wake every millisecond
SCRAPES = 10
REDISCOVERIES = 3
IDLE_MAX = 2.0  # seconds the idle baseline is measured, at most
WAIT = 30.0


class Recorder(Protocol):
    workdir: Path
    details: dict[str, Any]

    def put(self, figure: Figure) -> None: ...


def discovery_spec(hcas: int) -> Spec:
    target = Target(100.0) if hcas == 64 else None
    return Spec(f"discovery_{hcas}_hcas_ms",
                f"discover_node, {hcas} HCAs × 2 ports × 256 GIDs (median)", "ms", target,
                "reading the GID files alone")


def lag_specs(hcas: int) -> tuple[Spec, Spec]:
    return (
        Spec(f"loop_lag_scrape_{hcas}_hcas_ms",
             f"event loop worst lag during /metrics scrapes, {hcas} HCAs", "ms", Target(5.0),
             "same daemon idle"),
        Spec(f"loop_lag_rediscovery_{hcas}_hcas_ms",
             f"event loop worst lag during rediscovery, {hcas} HCAs", "ms", Target(5.0),
             "same daemon idle"),
    )


def scrape_specs(hcas: int) -> tuple[Spec, Spec, Spec]:
    return (
        Spec(f"scrape_{hcas}_hcas_ms",
             f"/metrics scrape with every counter and hw counter changed, {hcas} HCAs (median)",
             "ms", Target(5.0) if hcas == 64 else None, "same scrape, counters unchanged"),
        Spec(f"counter_read_{hcas}_hcas_ms",
             f"reading every port's counters and hw counters and making their /metrics "
             f"text, {hcas} HCAs (median)", "ms"),
        Spec(f"render_{hcas}_hcas_ms",
             f"rendering /metrics with every counter changed, {hcas} HCAs (median)", "ms",
             Target(1.0, on_ratio=True), "prometheus_client's exposition of the same series"),
    )


def tree_specs(hcas: int) -> list[Spec]:
    return [discovery_spec(hcas),
            *((*lag_specs(hcas), *scrape_specs(hcas)) if hcas in LAG_SIZES else ())]


def _render_against_library(daemon: Any, statuses: Sequence[Any]) -> tuple[list[float],
                                                                             list[float]]:
    """Seconds to render each status as /metrics does (the port text kept per inventory,
    every counter changed), and for prometheus_client's ``generate_latest`` to write the same
    series from its own metric families, made beforehand as a live registry holds them."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from rdma_hca.daemon.observe.metrics import render
    from rdma_hca.daemon.observe.port_metrics import PortText

    kept = PortText()
    ours: list[float] = []
    body = b""
    for status in statuses:
        began = time.perf_counter()
        body = render(status, (), 0, kept)
        ours.append(time.perf_counter() - began)
    families = list(text_string_to_metric_families(body.decode()))

    class Held:
        def collect(self) -> Any:
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Held())
    library: list[float] = []
    for _ in statuses:
        began = time.perf_counter()
        generate_latest(registry)
        library.append(time.perf_counter() - began)
    return ours, library


def two_port_hcas(count: int) -> list[Any]:
    """ConnectX-7-like HCAs with two RoCE v2 ports of 256 GIDs each, one netdev per port."""
    from rdma_hca.devkit.sim.specs import HcaSpec, PortSpec

    specs = []
    for i in range(count):
        ports = tuple(
            PortSpec(netdev=f"eth{2 * i + p}", ipv4=f"10.{(2 * i + p) // 256}.{(2 * i + p) % 256}"
                     ".11", gid_table_size=256)
            for p in range(2)
        )
        specs.append(HcaSpec(
            name=f"mlx5_{i}",
            pci_address=f"{i // 100:04x}:{0x0C + 2 * (i % 100):02x}:00.0",
            device="0x1021",
            numa_node=(i * 2) // count,
            node_guid=":".join(f"{0xB8599F0300D43C22 + 0x100 * i:016x}"[j:j + 4]
                               for j in range(0, 16, 4)),
            ports=ports,
            uverbs_index=i,
        ))
    return specs


def _port_dirs(sysfs_root: str) -> list[str]:
    """Every port's directory, reached through the class links as discovery does."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    return [os.path.join(base, hca, "ports", port) for hca in sorted(os.listdir(base))
            for port in sorted(os.listdir(os.path.join(base, hca, "ports")))]


def _gid_files(sysfs_root: str) -> list[str]:
    """Every GID entry of every port."""
    files = []
    for port in _port_dirs(sysfs_root):
        gids = os.path.join(port, "gids")
        files += [os.path.join(gids, g) for g in os.listdir(gids)]
    return files


def _counter_files(sysfs_root: str) -> list[str]:
    """Every counter and hw counter file of every port."""
    files = []
    for port in _port_dirs(sysfs_root):
        for kind in ("counters", "hw_counters"):
            folder = os.path.join(port, kind)
            if os.path.isdir(folder):
                files += [os.path.join(folder, c) for c in sorted(os.listdir(folder))]
    return files


def _change_counters(files: Sequence[str], round_: int) -> None:
    """A new value in every counter file, as after a busy interval: the traffic counters
    in the billions (Go's exponent form), the others small. The port text formats only
    the values that changed, so a scrape after this is the most it formats."""
    from rdma_hca.devkit.sim.specs import replace_lines

    replace_lines({
        path: str(10**9 + 1_000_003 * round_ + i if ("data" in path or "packets" in path)
                  else round_ + i % 7)
        for i, path in enumerate(files)})


def _read_all(paths: Sequence[str]) -> float:
    """Seconds to open, read and close each file: the syscall floor of reading GID tables."""
    opener, reader, closer = os.open, os.read, os.close
    flags = os.O_RDONLY
    started = time.perf_counter()
    for path in paths:
        fd = opener(path, flags)
        try:
            reader(fd, 64)
        finally:
            closer(fd)
    return time.perf_counter() - started


def _ms(seconds: float) -> float:
    return seconds * 1000.0


async def step_tree(rec: Recorder, hcas: int, runs: int, kubelet_dir: Path) -> None:
    """Build one tree; measure discovery on it, then (for LAG_SIZES) the loop's lag."""
    from rdma_hca.devkit.sim.tree import build_node

    root = rec.workdir / f"discovery-{hcas}"
    built = time.perf_counter()
    node = await asyncio.to_thread(build_node, root, two_port_hcas(hcas))
    build_seconds = time.perf_counter() - built
    try:
        await _discovery(rec, node, hcas, runs, build_seconds)
        if hcas in LAG_SIZES:
            await _loop_lag(rec, node, hcas, kubelet_dir)
    finally:
        await asyncio.to_thread(shutil.rmtree, root, True)


async def _discovery(rec: Recorder, node: Any, hcas: int, runs: int,
                     build_seconds: float) -> None:
    from rdma_hca.devkit.bench_procs import BenchError
    from rdma_hca.node.inventory import discover_node

    spec = discovery_spec(hcas)
    gid_files = _gid_files(str(node.sysfs_root))
    times: list[float] = []
    floor: list[float] = []
    inventory = None
    for _ in range(runs):
        started = time.perf_counter()
        inventory = discover_node(node.sysfs_root, node.dev_root)
        times.append(time.perf_counter() - started)
        floor.append(_read_all(gid_files))
        await asyncio.sleep(0)  # let the emulator's loop breathe between runs
    found = [h for h in inventory.hcas if len(h.ports) == 2] if inventory else []
    if len(found) != hcas:
        raise BenchError(f"discovery found {len(found)} two-port HCAs of {hcas} built")
    rec.details[spec.key] = {"runs_ms": [_ms(t) for t in times],
                             "read_gid_files_ms": [_ms(t) for t in floor],
                             "gid_files": len(gid_files),
                             "tree_build_s": round(build_seconds, 2)}
    rec.put(spec.figure(
        _ms(median(times)), _ms(median(floor)),
        note=f"median of {len(times)} `discover_node` calls (first, cold: "
             f"{_ms(times[0]):.0f} ms) on a tree built with `build_node`. Baseline: "
             f"`os.open`/`os.read`/`os.close` of the {len(gid_files)} GID files alone, "
             "the least any discovery that reads every GID entry must spend."))


class LagMeter:
    """A timer that asks to wake every millisecond and keeps how late it woke."""

    def __init__(self) -> None:
        self.lates: list[float] = []
        self._cpu = time.thread_time()

    @property
    def loop_cpu(self) -> float:
        """CPU seconds the loop's thread used since the reset (read on the loop)."""
        return time.thread_time() - self._cpu

    @property
    def worst(self) -> float:
        return max(self.lates, default=0.0)

    @property
    def p99(self) -> float:
        return percentile(self.lates, 99) if self.lates else 0.0

    def reset(self) -> None:
        self.lates = []
        self._cpu = time.thread_time()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(LAG_TIMER)
            self.lates.append(loop.time() - asked - LAG_TIMER)


_SCRAPER = """
import http.client, sys
port = int(sys.argv[1])
print("ready", flush=True)
while sys.stdin.readline().strip() == "go":
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    size = len(resp.read())
    if resp.status != 200:
        sys.exit(f"/metrics answered {resp.status}")
    conn.close()
    print(size, flush=True)
"""


class Scraper:
    """Another process that scrapes /metrics when told, as Prometheus does; started
    before the measurement, so that starting a process is not what the timer sees."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _SCRAPER, str(self.port),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert self.proc.stdout is not None
        ready = await asyncio.wait_for(self.proc.stdout.readline(), WAIT)
        if ready.strip() != b"ready":
            raise RuntimeError("the scraper did not start")

    async def scrape(self) -> int:
        """One scrape now; the bytes received."""
        assert self.proc is not None and self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(b"go\n")
        line = await asyncio.wait_for(self.proc.stdout.readline(), WAIT)
        if not line.strip().isdigit():
            await self.stop()
            raise RuntimeError(f"the scraper failed (status {self.proc.returncode})")
        return int(line)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"quit\n")
            await asyncio.wait_for(self.proc.communicate(), WAIT)


async def _loop_lag(rec: Recorder, node: Any, hcas: int, kubelet_dir: Path) -> None:
    from rdma_hca.daemon.main import prefer_the_loop, settle_heap
    from rdma_hca.daemon.wiring import Daemon
    from rdma_hca.settings.model import Settings

    scrape_spec, rediscovery_spec = lag_specs(hcas)
    settings = replace(Settings(), sysfs_root=str(node.sysfs_root),
                       dev_root=str(node.dev_root), kubelet_dir=str(kubelet_dir),
                       metrics_address="127.0.0.1:0")
    daemon = Daemon(settings, netlink=False)
    meter = LagMeter()
    switch = prefer_the_loop()  # as `serve` does
    await daemon.start()
    settle_heap()  # as `serve` does once started
    timer = asyncio.create_task(meter.run(), name="lag-timer")
    try:
        assert daemon.http is not None
        port = daemon.http.bound_port
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.5)  # let start-up settle (first passes, registration)

        scraper = Scraper(port)
        await scraper.start()
        try:
            await asyncio.sleep(0.2)
            counter_files = _counter_files(str(node.sysfs_root))
            size = 0
            scrape_window, scrape_cpu = 0.0, 0.0
            lates: list[float] = []
            scrape_times: list[float] = []
            read_times: list[float] = []
            for round_ in range(SCRAPES):
                # Every counter given a new value before each scrape, the most a scrape
                # formats: the bench's own writes, on a thread, whose hold of the GIL
                # would wake the timer late, so they stay out of the measured window.
                await asyncio.to_thread(_change_counters, counter_files, round_ + 1)
                await asyncio.sleep(0.01)
                meter.reset()
                started = loop.time()
                # The counters read again, as the health loop does every few seconds
                # while someone scrapes, then one scrape.
                began = time.perf_counter()
                await daemon.health.refresh_counters()
                read_times.append(time.perf_counter() - began)
                began = time.perf_counter()
                size += await scraper.scrape()
                scrape_times.append(time.perf_counter() - began)
                scrape_window += loop.time() - started
                lates += meter.lates
                scrape_cpu += meter.loop_cpu
            scrape_lag = max(lates, default=0.0)
            scrape_p99 = percentile(lates, 99) if lates else 0.0
            # The counters read again with their values unchanged: new mappings, the
            # same values, so only the comparisons are made.
            same_times: list[float] = []
            for _ in range(SCRAPES):
                await daemon.health.refresh_counters()
                began = time.perf_counter()
                await scraper.scrape()
                same_times.append(time.perf_counter() - began)
            kept_times: list[float] = []
            for _ in range(SCRAPES):
                began = time.perf_counter()
                await scraper.scrape()
                kept_times.append(time.perf_counter() - began)
            counters = daemon.health.counters
            samples = sum(len(v) for v in counters.values())
        finally:
            await scraper.stop()

        meter.reset()
        started = loop.time()
        for _ in range(REDISCOVERIES):
            before = daemon.health.passes
            daemon.health.poke(full=True)
            async with asyncio.timeout(WAIT):
                while daemon.health.passes <= before:
                    await asyncio.sleep(0.01)
        rediscovery_window = loop.time() - started
        rediscovery_lag, rediscovery_p99 = meter.worst, meter.p99
        rediscovery_cpu = meter.loop_cpu

        # The same daemon left alone for as long: the lag its polls cost anyway.
        meter.reset()
        await asyncio.sleep(min(max(scrape_window, rediscovery_window), IDLE_MAX))
        idle_lag, idle_p99, idle_cpu = meter.worst, meter.p99, meter.loop_cpu
        # Last: the library's families are some 60k objects, which a collection during
        # the lag measurements above would have to walk.
        statuses = []
        for round_ in range(SCRAPES):
            await asyncio.to_thread(_change_counters, counter_files, SCRAPES + round_ + 1)
            await daemon.health.refresh_counters()
            statuses.append(daemon.status())
        render_times, library_times = _render_against_library(daemon, statuses)
        del statuses
    finally:
        timer.cancel()
        await asyncio.gather(timer, return_exceptions=True)
        await daemon.stop()
        sys.setswitchinterval(switch)
    rec.details[f"loop_lag_{hcas}_hcas"] = {
        "scrape_worst_ms": _ms(scrape_lag), "scrape_p99_ms": _ms(scrape_p99),
        "scrape_window_s": round(scrape_window, 2),
        "scrape_loop_cpu_ms": _ms(scrape_cpu), "scrapes": SCRAPES, "metrics_bytes": size // SCRAPES,
        "rediscovery_worst_ms": _ms(rediscovery_lag),
        "rediscovery_p99_ms": _ms(rediscovery_p99),
        "rediscovery_loop_cpu_ms": _ms(rediscovery_cpu),
        "rediscovery_window_s": round(rediscovery_window, 2),
        "rediscoveries": REDISCOVERIES, "idle_worst_ms": _ms(idle_lag),
        "idle_p99_ms": _ms(idle_p99), "idle_loop_cpu_ms": _ms(idle_cpu),
    }
    rec.put(scrape_spec.figure(
        _ms(scrape_lag), _ms(idle_lag),
        note=f"{SCRAPES} scrapes of /metrics ({size // SCRAPES // 1024} KiB each) by another "
             "process, each after every port counter was given a new value and read again "
             "(off the loop, as the health loop does between real scrapes; the writes of "
             "the new values are left out of the window), while a 1 ms timer on the "
             "daemon's loop records how late it "
             f"wakes (worst; p99 {_ms(scrape_p99):.1f} ms); baseline: the same timer, the "
             f"daemon idle for as long (p99 {_ms(idle_p99):.1f} ms)."))
    scrape_time, read_spec, render_spec = scrape_specs(hcas)
    rec.details[render_spec.key] = {"ours_ms": [_ms(t) for t in render_times],
                                    "library_ms": [_ms(t) for t in library_times]}
    rec.put(render_spec.figure(
        _ms(median(render_times)), _ms(median(library_times)),
        note=f"{SCRAPES} renders in the benchmark's process, each of a status taken after "
             "every counter was given a new value and read again (the port text kept per "
             "inventory, as the HTTP "
             "server keeps it); baseline: prometheus_client's generate_latest of the same "
             "series (parsed from our text into its metric families beforehand, as a live "
             "registry holds them)."))
    rec.details[scrape_time.key] = {"scrapes_ms": [_ms(t) for t in scrape_times],
                                    "same_values_ms": [_ms(t) for t in same_times],
                                    "kept_ms": [_ms(t) for t in kept_times],
                                    "counter_reads_ms": [_ms(t) for t in read_times],
                                    "counter_samples": samples}
    rec.put(scrape_time.figure(
        _ms(median(scrape_times)), _ms(median(kept_times)),
        note=f"{SCRAPES} scrapes by another process, each after every one of the "
             f"{samples} counters ({samples // max(1, len(counters))} a port: the sysfs "
             "ABI's and the driver's hw_counters) was given a new value and read again, so "
             "every counter value is new (read again with the values unchanged: "
             f"{_ms(median(same_times)):.1f} ms); the refresh makes the port text of the "
             "values it read (its cost is in the counter read figure, and formatting alone "
             "in the render figure), so the scrape serves it; baseline: scrapes with the "
             "counters not read again."))
    rec.put(read_spec.figure(
        _ms(median(read_times)),
        note=f"the health loop's counter refresh ({samples} files, on a worker thread with "
             "the read deadline, then their /metrics text made on a worker thread), as it "
             "runs every few seconds while someone scrapes."))
    rec.put(rediscovery_spec.figure(
        _ms(rediscovery_lag), _ms(idle_lag),
        note=f"{REDISCOVERIES} full rediscoveries (as a netlink address event or SIGHUP "
             f"asks for), same timer (p99 {_ms(rediscovery_p99):.1f} ms); discovery itself "
             "runs on a thread."))
