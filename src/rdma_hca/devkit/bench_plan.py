"""What one ``rdma-hca bench`` run measures: how many times (the plan), each figure's
spec (label, unit, target, baseline), and their order in the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rdma_hca.devkit.bench_attacks import ATTACK_SPECS
from rdma_hca.devkit.bench_footprint import FOOTPRINT_SPECS
from rdma_hca.devkit.bench_lldp import LLDP_SPECS
from rdma_hca.devkit.bench_report import Figure, Spec, Target
from rdma_hca.devkit.bench_trees import tree_specs
from rdma_hca.devkit.dra.bench import DRA_SPECS
from rdma_hca.settings.model import Settings


@dataclass(frozen=True)
class Plan:
    """How many times each thing is measured; --quick trades precision for time."""

    start_runs: int
    allocate_calls: int
    allocate_warmup: int
    allocate_blocks: int
    flaps: int
    restarts: int
    settle_seconds: float
    idle_seconds: float
    discovery_runs: int
    discovery_sizes: tuple[int, ...] = (8, 64, 256)


FULL = Plan(start_runs=5, allocate_calls=2000, allocate_warmup=200, allocate_blocks=4,
            flaps=10, restarts=10, settle_seconds=3.0, idle_seconds=20.0, discovery_runs=5)
QUICK = Plan(start_runs=3, allocate_calls=500, allocate_warmup=100, allocate_blocks=2,
             flaps=4, restarts=4, settle_seconds=1.0, idle_seconds=5.0, discovery_runs=3)


_ONE_SECOND = Target(1000.0)
START_SERVE = Spec("start_serve_ms", "start → registered, `rdma-hca serve` process (median)",
                   "ms", baseline_label="bare grpc.aio process start → serving")
START_INPROC = Spec("start_inprocess_ms", "start → registered, in-process `Daemon.start` (median)",
                    "ms")
ALLOC_P50 = Spec("allocate_p50_ms", "Allocate p50", "ms", Target(1.2, on_ratio=True), "bare")
ALLOC_P99 = Spec("allocate_p99_ms", "Allocate p99", "ms", baseline_label="bare")
# The daemon's own default, so the figure follows it if the default changes.
DEFAULT_POLL = Settings().health_poll_seconds
DOWN_MED = Spec("port_down_median_ms",
                f"port down → Unhealthy, default poll {DEFAULT_POLL:g} s (median)", "ms",
                _ONE_SECOND)
DOWN_MAX = Spec("port_down_max_ms",
                f"port down → Unhealthy, default poll {DEFAULT_POLL:g} s (max)", "ms",
                _ONE_SECOND)
DOWN_MED_FAST = Spec("port_down_fast_median_ms", "port down → Unhealthy, poll 0.25 s (median)",
                     "ms", _ONE_SECOND)
DOWN_MAX_FAST = Spec("port_down_fast_max_ms", "port down → Unhealthy, poll 0.25 s (max)", "ms",
                     _ONE_SECOND)
RESTART_MED = Spec("kubelet_restart_median_ms", "kubelet restart → registered (median)", "ms",
                   _ONE_SECOND)
RESTART_MAX = Spec("kubelet_restart_max_ms", "kubelet restart → registered (max)", "ms",
                   _ONE_SECOND)
IDLE_RSS = Spec("idle_rss_mib", "idle RSS", "MiB", Target(1.3, on_ratio=True), "bare")
IDLE_CPU = Spec("idle_cpu_percent", "idle CPU (% of one core)", "%", Target(0.5), "bare")


ORDER = [START_SERVE, START_INPROC, ALLOC_P50, ALLOC_P99, DOWN_MED, DOWN_MAX, DOWN_MED_FAST,
         DOWN_MAX_FAST, RESTART_MED, RESTART_MAX]


def ordered(figures: dict[str, Figure], sizes: Sequence[int], missing: str) -> list[Figure]:
    specs = [*FOOTPRINT_SPECS, *ORDER, *(s for n in sizes for s in tree_specs(n)), IDLE_RSS,
             IDLE_CPU, *ATTACK_SPECS, *DRA_SPECS, *LLDP_SPECS]
    return [figures.get(s.key) or s.failed(missing) for s in specs]
