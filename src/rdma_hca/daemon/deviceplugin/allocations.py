"""Allocate outcomes, counted for /metrics."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Histogram

BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0)


class AllocationStats:
    """Allocate counts per result, and the latency histogram (latencies exist nowhere else)."""

    def __init__(self, resources: Iterable[str] = ()) -> None:
        self.total: dict[tuple[str, bool], int] = {}
        # Registered with no registry here: the HTTP server adds it to what it serves.
        self.latency = Histogram(
            "rdma_hca_allocate_duration_seconds", "Time to answer Allocate", ["resource"],
            registry=None, buckets=BUCKETS)
        # Every series at 0 from the start: increase() over a series that appears with its
        # first error sees nothing, so an alert would miss the first failures. (The counts
        # of every pool start at 0 where /metrics renders them, from the status snapshot.)
        for resource in resources:
            self.latency.labels(resource)

    def observe(self, resource: str, seconds: float, ok: bool) -> None:
        self.total[(resource, ok)] = self.total.get((resource, ok), 0) + 1
        self.latency.labels(resource).observe(seconds)
