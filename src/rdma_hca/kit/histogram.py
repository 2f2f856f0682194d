"""A latency histogram kept as plain counts, for a frozen status record to carry.

``/metrics`` renders the daemon's snapshot and nothing else: a histogram whose counts
live in a registry of their own could not be frozen with the rest. Here the owner
observes into :class:`Histogram` and the snapshot takes :meth:`Histogram.counts`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HistogramCounts:
    """Observations at or below each bound (cumulative, as Prometheus's ``le``)."""

    bounds: tuple[float, ...] = ()
    cumulative: tuple[int, ...] = ()
    count: int = 0
    total: float = 0.0  # the sum of the observations


class Histogram:
    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram bounds {list(bounds)} are not strictly increasing")
        self.bounds = tuple(float(b) for b in bounds)
        self._in_bucket = [0] * len(self.bounds)  # observations above the bound before
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)  # le: a value on a bound counts in it
        if i < len(self.bounds):
            self._in_bucket[i] += 1
        self.count += 1
        self.total += value

    def counts(self) -> HistogramCounts:
        cumulative, running = [], 0
        for n in self._in_bucket:
            running += n
            cumulative.append(running)
        return HistogramCounts(self.bounds, tuple(cumulative), self.count, self.total)
