"""Allocate outcomes, counted for /metrics."""

from __future__ import annotations

from collections.abc import Callable


class AllocationStats:
    """Allocate counts per result; each latency goes to the observers (the histogram)."""

    def __init__(self) -> None:
        self.total: dict[tuple[str, bool], int] = {}
        self.observers: list[Callable[[str, float, bool], None]] = []

    def observe(self, resource: str, seconds: float, ok: bool) -> None:
        self.total[(resource, ok)] = self.total.get((resource, ok), 0) + 1
        for obs in self.observers:
            obs(resource, seconds, ok)
