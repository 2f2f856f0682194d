"""Allocate outcomes, counted for /metrics."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from rdma_hca.kit.histogram import Histogram, HistogramCounts

BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0)


class AllocationStats:
    """Allocate counts per result, and the latency histogram (latencies exist nowhere else).

    Kept as plain counts that the status snapshot copies: /metrics renders them with the
    rest, and the Prometheus client is loaded only when a scrape first renders.
    """

    def __init__(self, resources: Iterable[str] = ()) -> None:
        self.total: dict[tuple[str, bool], int] = {}
        self._latency: dict[str, Histogram] = {}
        self.created: dict[str, float] = {}  # unix time each resource's series began
        # Every series at 0 from the start: increase() over a series that appears with its
        # first error sees nothing, so an alert would miss the first failures. (The counts
        # of every pool start at 0 where /metrics renders them, from the status snapshot.)
        for resource in resources:
            self._series(resource)

    def _series(self, resource: str) -> Histogram:
        h = self._latency.get(resource)
        if h is None:
            h = self._latency[resource] = Histogram(BUCKETS)
            self.created[resource] = time.time()
        return h

    def observe(self, resource: str, seconds: float, ok: bool) -> None:
        self.total[(resource, ok)] = self.total.get((resource, ok), 0) + 1
        self._series(resource).observe(seconds)

    def latency(self) -> Mapping[str, HistogramCounts]:
        """Each resource's Allocate latencies so far, as counts a snapshot may keep."""
        return {resource: h.counts() for resource, h in self._latency.items()}
