"""A burst of pods starting at once on one node, for ``make bench``: with the driver's
default settings (its two API budgets as they ship) and POD_UID set as the chart sets it.

Every pod's NodePrepareResources call (one fresh claim each) goes out at once through the
kubelet emulator, against the devkit's strict fake API server over HTTP. The figures: all
calls answered and how long the burst took; a Prepare right after the burst against one
before it (the claim status writes the burst left behind are still going out); claim
GETs per fresh claim; and the time until every claim's ``status.devices`` entry is on
the server. Printed, never asserted.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import grpc

from rdma_hca.devkit.bench_report import Figure, Spec, Target
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.nodes import gpu_node

DRIVER = "rdma-hca.io"
NODE = "bench-node"
HCAS = 8
SAMPLES = 5  # Prepares before the burst, and right after it
BURST_TOTAL = Spec("dra_burst_300_s", "300 pods' NodePrepareResources at once (a fresh "
                   "claim each), all answered", "s", Target(10.0))
BURST_FAILED = Spec("dra_burst_300_failed", "calls of that burst that failed", "calls",
                    Target(0.0))
AFTER_BURST = Spec("dra_prepare_after_burst_ms", "NodePrepareResources right after that "
                   "burst (fresh claim)", "ms", Target(5.0, on_ratio=True),
                   baseline_label="the same, before the burst")
GETS_PER_CLAIM = Spec("dra_claim_gets_per_fresh_claim", "claim GETs per fresh claim",
                      "requests", Target(1.0))
STATUS_WRITTEN = Spec("dra_burst_300_status_written_s", "burst start → every claim's "
                      "status.devices entry on the API server", "s", Target(60.0))
BURST_SPECS = [BURST_TOTAL, BURST_FAILED, AFTER_BURST, GETS_PER_CLAIM, STATUS_WRITTEN]


def _claim(api: FakeApiServer, name: str, i: int) -> str:
    return api.add_claim("bench", name, [{"request": "hca", "driver": DRIVER, "pool": NODE,
                                          "device": f"mlx5-{i % HCAS}"}])


def _claim_gets(api: FakeApiServer, since: int) -> int:
    return sum(1 for r in api.requests[since:]
               if r.method == "GET" and "/resourceclaims/" in r.path)


def _written(api: FakeApiServer, names: set[str]) -> bool:
    found = [c for c in api.cluster.resource_claims if c["metadata"]["name"] in names]
    return len(found) == len(names) and all(
        any(e.get("driver") == DRIVER for e in (c.get("status") or {}).get("devices") or [])
        for c in found)


async def _one(stage: DraStage, name: str, i: int) -> tuple[float, str]:
    """One pod's Prepare of a fresh claim: seconds, and the error ("" when prepared)."""
    assert stage.kubelet is not None
    uid = _claim(stage.api, name, i)
    start = time.perf_counter()
    try:
        resp = await stage.kubelet.prepare(DRIVER, [("bench", uid, name)])
    except grpc.aio.AioRpcError as exc:
        return time.perf_counter() - start, f"{exc.code().name}: {exc.details()}"
    return time.perf_counter() - start, resp.claims[uid].error


async def burst(workdir: Path, pods: int) -> list[Figure]:
    scaled = pods != 300
    specs = [s if not scaled else Spec(s.key, s.label.replace("300", str(pods)), s.unit,
                                       s.target, s.baseline_label) for s in BURST_SPECS]
    total_spec, failed_spec, after_spec, gets_spec, status_spec = specs
    node = gpu_node(workdir / "node", hcas=HCAS, gid_table_size=16)
    async with DraStage(node, workdir / "stage", node_name=NODE, pod_uid="bench-pod",
                        kubelet_wipes=False) as stage:
        if not (await stage.registered() and await stage.until(lambda: bool(stage.devices()))):
            return [s.failed("the driver did not register or publish") for s in specs]
        writer = stage.driver.status_writer if stage.driver is not None else None
        before: list[float] = []
        for i in range(SAMPLES):
            seconds, error = await _one(stage, f"before{i}", i)
            if error:
                return [s.failed(f"a Prepare before the burst failed: {error}") for s in specs]
            before.append(seconds)
        if writer is not None and stage.driver is not None:
            # A quiet node, as before any burst: nothing queued, the driver's budget full.
            await writer.drained()
            config = stage.driver.config
            await asyncio.sleep(config.api_burst / config.api_qps)
        mark = len(stage.api.requests)
        names = {f"pod{i}" for i in range(pods)}
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(_one(stage, f"pod{i}", i) for i in range(pods)))
        took = time.perf_counter() - start
        after: list[float] = []
        claims_waited = (stage.driver.stats().api_wait_seconds.get("claims", 0.0)
                         if stage.driver is not None else 0.0)
        for i in range(SAMPLES):
            seconds, error = await _one(stage, f"after{i}", i)
            after.append(seconds)
        after_wait = ((stage.driver.stats().api_wait_seconds.get("claims", 0.0) - claims_waited)
                      / SAMPLES if stage.driver is not None else 0.0)
        gets = _claim_gets(stage.api, mark)
        written = await stage.until(lambda: _written(stage.api, names), timeout=120.0)
        status_s = time.perf_counter() - start
        waited = stage.driver.stats().api_wait_seconds if stage.driver is not None else {}
    errors = [e for _, e in outcomes if e]
    slowest = max(s for s, _ in outcomes)
    note = (f"{pods} calls at once, one fresh claim each, default settings "
            f"(dra.claimApiQps 50/100, dra.apiQps 5/10), POD_UID set; "
            f"{pods - len(errors)}/{pods} answered, slowest {slowest:.2f} s; token waits: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(waited.items()))
            + (f"; first error: {errors[0]}" if errors else ""))
    return [
        total_spec.figure(round(took, 2), note=note),
        failed_spec.figure(float(len(errors)), note=f"of {pods}"),
        after_spec.figure(round(statistics.median(after) * 1000, 2),
                          round(statistics.median(before) * 1000, 2),
                          note=f"median of {SAMPLES} sequential fresh claims each, right "
                               "after the burst answered (its status writes still going "
                               "out) and on a quiet node before it; of it, waiting for a "
                               f"token of the claims budget: {after_wait * 1000:.1f} ms a "
                               "call (the burst used it up: one token per 1/claimApiQps)"),
        gets_spec.figure(round(gets / (pods + SAMPLES), 3),
                         note=f"{gets} claim GETs for {pods + SAMPLES} fresh claims, status "
                              "writes included"),
        status_spec.figure(round(status_s, 1), note=f"{pods} status writes, one apply each, at "
                                                    "dra.apiQps 5")
        if written else status_spec.failed("not every entry was written within 120 s"),
    ]
