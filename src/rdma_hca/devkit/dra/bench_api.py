"""What the DRA driver costs the API server, for ``make bench``: requests per slice write,
requests per node per minute idle, and slice writes while a port flaps every 100 ms (held
down by the flap hold, then released once stable for ``flapHoldSeconds``).

The real driver runs on a DraStage (simulated node, the devkit's fake API server over
HTTP, the kubelet emulator); the fake server counts every request by verb and path, so the
figures are counts, not timings. They are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from rdma_hca.contract.dra import RESYNC_SECONDS
from rdma_hca.devkit.bench_report import Figure, Spec, Target
from rdma_hca.devkit.dra.stage import DraStage, with_changes
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.settings.model import Settings

NODE = "bench-node"
SLICES = "/resourceslices"
REQUESTS_PER_WRITE = Spec("dra_requests_per_slice_write", "API requests per slice write",
                          "requests", Target(1.0))
IDLE_PER_MINUTE = Spec("dra_idle_requests_per_node_minute", "API requests per node per "
                       "minute, idle", "requests", Target(1.0))
FLAP_HOLD = Settings().flap_hold_seconds
FLAP_WRITES = Spec("dra_flap_slice_writes_30s", "slice writes in 30 s of a port flapping "
                   "every 100 ms", "writes", Target(4.0))
FLAP_SETTLE = Spec("dra_flap_settle_ms", "flapping stops → untainted slice published "
                   f"(≈ the flap hold, {FLAP_HOLD:g} s by default)", "ms",
                   Target((FLAP_HOLD + 3.0) * 1000))
API_SPECS = [REQUESTS_PER_WRITE, IDLE_PER_MINUTE, FLAP_WRITES, FLAP_SETTLE]


def _driver_requests(api: FakeApiServer, since: int) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in api.requests[since:]]


def _writes(requests: list[tuple[str, str]]) -> int:
    return sum(1 for m, p in requests if m in ("POST", "PUT", "DELETE") and SLICES in p)


def _tainted(stage: DraStage, device: str) -> bool:
    return "taints" in stage.devices().get(device, {})


def tainted_is(stage: DraStage, device: str, wanted: bool) -> Callable[[], bool]:
    """Whether ``device`` carries a taint in what the server holds is ``wanted``."""
    return lambda: _tainted(stage, device) == wanted


def _published(stage: DraStage, hca: str, up: bool) -> Callable[[], bool]:
    """The driver saw the port as ``up`` and that offer is what the server holds."""
    def done() -> bool:
        driver = stage.driver
        if driver is None or not driver.tasks or not driver.stats().idle:
            return False
        offer = driver.offering.offer()
        seen = [h for h in offer.hcas.values() if h.name == hca]
        return (bool(seen) and seen[0].any_port_up == up
                and driver.helper.publisher.published_digest == offer.digest)
    return done


async def _ready(stage: DraStage) -> bool:
    """Published, registered, and nothing pending: from here on, requests are the test's."""
    return (await stage.until(lambda: bool(stage.devices())) and await stage.registered()
            and await stage.until(lambda: stage.driver is not None and stage.driver.stats().idle))


async def requests_per_write(workdir: Path, changes: int) -> Figure:
    node = gpu_node(workdir / "node", hcas=8, gid_table_size=8)
    async with DraStage(node, workdir / "stage", node_name=NODE, kubelet_wipes=False) as s:
        if not await _ready(s):
            return REQUESTS_PER_WRITE.failed("no slice was published")
        mark = len(s.api.requests)
        for i in range(changes):
            # Each HCA goes down and back once: more changes of one would be a flap, held.
            hca, down = i // 2 % 8, i % 2 == 0
            node.set_port(f"mlx5_{hca}", up=not down)
            if not await s.until(tainted_is(s, f"mlx5-{hca}", down), timeout=10):
                return REQUESTS_PER_WRITE.failed("the slice never changed")
        sent = _driver_requests(s.api, mark)
        writes = _writes(sent)
    lists = sum(1 for m, p in sent if m == "GET" and p.endswith(SLICES))
    return REQUESTS_PER_WRITE.figure(
        round(len(sent) / max(writes, 1), 2),
        note=f"{changes} port changes on an 8-HCA node: {len(sent)} requests, {writes} slice "
             f"writes, {lists} LIST")


async def idle_per_minute(workdir: Path, seconds: float) -> Figure:
    # The check of the server's copy is what an idle node costs; it runs once per resync
    # interval. Measured at a short interval and scaled to the default one.
    resync = 2.0
    node = gpu_node(workdir / "node", hcas=8, gid_table_size=8)

    async with DraStage(node, workdir / "stage", node_name=NODE, kubelet_wipes=False,
                        config=with_changes(resync_seconds=resync)) as s:
        if not await _ready(s):
            return IDLE_PER_MINUTE.failed("no slice was published")
        mark = len(s.api.requests)
        start = time.monotonic()
        await asyncio.sleep(seconds)
        elapsed = time.monotonic() - start
        sent = _driver_requests(s.api, mark)
    per_minute_here = len(sent) / elapsed * 60
    scaled = per_minute_here * resync / RESYNC_SECONDS
    return IDLE_PER_MINUTE.figure(
        round(scaled, 2),
        note=f"{len(sent)} requests in {elapsed:.1f} s at a {resync:g} s resync "
             f"({_writes(sent)} writes), scaled to the default {RESYNC_SECONDS:g} s")


async def flapping(workdir: Path, seconds: float, hold: float) -> list[Figure]:
    """``seconds`` of mlx5_3 flapping every 100 ms, ending up; then the hold runs out."""
    node = gpu_node(workdir / "node", hcas=8, gid_table_size=8)
    async with DraStage(node, workdir / "stage", node_name=NODE, kubelet_wipes=False,
                        flap_hold_seconds=hold) as s:
        if not await _ready(s):
            why = "no slice was published"
            return [FLAP_WRITES.failed(why), FLAP_SETTLE.failed(why)]
        mark = len(s.api.requests)
        end = time.monotonic() + seconds
        up = True
        while time.monotonic() < end or not up:
            up = not up
            node.set_port("mlx5_3", up=up)
            await asyncio.sleep(0.1)
        stopped = time.monotonic()
        writes = _writes(_driver_requests(s.api, mark))
        held = _tainted(s, "mlx5-3")
        settled = await s.until(lambda: _published(s, "mlx5_3", True)()
                                and not _tainted(s, "mlx5-3"), timeout=hold + 10)
        settle_ms = (time.monotonic() - stopped) * 1000
    # Not scaled to 30 s: once held, the flapping writes nothing more.
    flap = f"{seconds:g} s of flapping" + (" (not scaled)" if seconds != 30 else "")
    note = (f"{flap}: {writes} slice writes, tainted at its end: {held}; "
            f"flapHoldSeconds {hold:g}, health poll 50 ms")
    return [
        FLAP_WRITES.figure(writes, note=note),
        FLAP_SETTLE.figure(round(settle_ms, 1),
                           note=f"from the last change (up) to the untainted slice: the "
                                f"{hold:g} s hold, then one write")
        if settled else FLAP_SETTLE.failed("the untainted slice was never published"),
    ]


async def api_figures(workdir: Path, quick: bool) -> list[Figure]:
    return [
        await requests_per_write(workdir / "writes", 2 if quick else 6),
        await idle_per_minute(workdir / "idle", 2.0 if quick else 20.0),
        # Quick: a shorter flap and hold (the writes do not grow with the flap's length).
        *await flapping(workdir / "flap", 4.0 if quick else 30.0,
                        3.0 if quick else FLAP_HOLD),
    ]
