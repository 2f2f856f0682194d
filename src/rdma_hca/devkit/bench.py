"""``rdma-hca bench`` (``make bench``): the daemon's timing and footprint, side by side.

One run measures, on simulated trees and against the kubelet emulator:

1. start → registered, for ``rdma-hca serve`` as a process and for ``Daemon.start``;
2. Allocate latency over the unix socket against a bare grpc.aio server process that
   returns the same bytes (``bench_bare``);
3. port down → the kubelet sees the devices Unhealthy, at two poll intervals;
4. kubelet restart → registered again;
5. discovery on large trees (8, 64, 256 HCAs × 2 ports × 256 GIDs), and on 64 and 256
   the event loop's worst lag during /metrics scrapes and rediscoveries (``bench_trees``);
6. idle memory and CPU of the daemon process against the bare server process;
7. hostile clients, the DRA driver (``bench_attacks``, ``dra.bench``), and LLDP: the CPU
   of a 10,000 frames/s flood and a switch change → ResourceSlice (``bench_lldp``).

The figures go to ``BENCHMARKS.md`` and ``benchmarks.json`` (see ``bench_report``). A
measurement that fails is reported as missing, with the reason, and the others still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rdma_hca.devkit.bench_plan import FULL, QUICK, ordered
from rdma_hca.devkit.bench_report import (
    Figure,
    Report,
    machine_info,
    render_console,
    render_markdown,
    report_json,
)
from rdma_hca.devkit.bench_steps import Bench

EXIT_FAILED = 1
EXIT_USAGE = 2


def _pick_tree_base() -> tuple[str | None, str]:
    """tmpfs for the trees when there is one: sysfs is in memory too, a disk would add noise."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm", "/dev/shm (tmpfs)"
    return None, f"{tempfile.gettempdir()} (no writable /dev/shm)"


def _write(out_dir: str, report: Report) -> tuple[str, str]:
    import json

    md_path = os.path.join(out_dir, "BENCHMARKS.md")
    json_path = os.path.join(out_dir, "benchmarks.json")
    with open(md_path, "w", encoding="utf-8") as fh:
        fh.write(render_markdown(report))
    with open(json_path, "w", encoding="utf-8") as fh:
        json.dump(report_json(report), fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    return md_path, json_path


def run_bench(out_dir: str, quick: bool) -> int:
    """Run every measurement, write BENCHMARKS.md and benchmarks.json to ``out_dir``.

    Returns 0 when every figure was measured (targets missed are reported, not errors),
    1 when some measurement failed, 2 when ``out_dir`` is unusable.
    """
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
        print(f"rdma-hca bench: --out-dir {out_dir!r} is not a writable directory; create it "
              "or pass another", file=sys.stderr)
        return EXIT_USAGE
    plan = QUICK if quick else FULL
    base, where = _pick_tree_base()

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    machine = machine_info(where)
    workdir = Path(tempfile.mkdtemp(prefix="rdma-hca-bench-", dir=base))
    started = time.perf_counter()
    figures: dict[str, Figure] = {}
    details: dict[str, Any] = {}
    stopped = "the run stopped before this step"
    try:
        say(f"building a simulated GPU node under {workdir}")
        bench = Bench(plan, workdir, say)
        figures, details = bench.figures, bench.details
        asyncio.run(bench.run())
    except KeyboardInterrupt:
        print("rdma-hca bench: interrupted; nothing written", file=sys.stderr)
        return 130
    except Exception as exc:  # e.g. no room for the trees, or the emulator cannot listen
        stopped = f"the run stopped: {type(exc).__name__}: {exc}"
        print(f"rdma-hca bench: {stopped}", file=sys.stderr)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
    report = Report(ordered(figures, plan.discovery_sizes, stopped), machine, quick,
                    time.perf_counter() - started, details)
    md_path, json_path = _write(out_dir, report)
    print(render_console(report.figures))
    print(f"\nwrote {md_path} and {json_path}")
    failed = report.failures()
    if failed:
        print(f"rdma-hca bench: {len(failed)} figure(s) not measured: "
              + ", ".join(f.key for f in failed), file=sys.stderr)
        return EXIT_FAILED
    return 0
