"""``python -m rdma_hca.devkit.bench_footprint_alone [--quick]``: the footprint section of
``make bench`` alone (``bench_footprint``), its figures and their split printed as JSON, for
comparing two trees in one sitting without the rest of the run."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys

from rdma_hca.devkit.bench_footprint import footprint_figures, footprint_tmp
from rdma_hca.devkit.bench_plan import FULL, QUICK
from rdma_hca.devkit.bench_report import Figure
from rdma_hca.devkit.bench_steps import Bench


def _alone(quick: bool) -> int:
    """This section alone, on a node and kubelet emulator of its own; JSON on stdout."""
    workdir = footprint_tmp()

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    bench = Bench(QUICK if quick else FULL, workdir, say)

    async def run() -> list[Figure]:
        await bench.kubelet.start()
        try:
            return await footprint_figures(bench, quick)
        finally:
            await bench.stop_all()
            await bench.kubelet.stop()

    try:
        got = asyncio.run(run())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"figures": [{"key": f.key, "label": f.label, "unit": f.unit,
                                   "ours": f.ours, "baseline": f.baseline,
                                   "ratio": f.ratio, "met": f.met, "note": f.note}
                                  for f in got],
                      "details": bench.details["footprint"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(_alone("--quick" in sys.argv[1:]))
