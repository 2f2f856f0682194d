"""Waits between tries: the one backoff of the project, and the time it is measured in.

Every retry loop (the API client, the kubelet registration, the DRA sockets, the claim
locks) waits with :class:`Backoff`: exponential, capped, with jitter, so that retries of
many callers (or of a fleet of nodes) spread out instead of arriving together.

Clock and sleep are injected wherever a wait is, so tests step through waits without
waiting.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

# client-go's defaults for a request retried after a 429 or a 5xx.
BACKOFF_FIRST = 0.2
BACKOFF_MAX = 30.0

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class Backoff:
    """Exponential waits with full jitter: attempt n waits uniformly in [d/2, d], d = first·2ⁿ."""

    def __init__(self, first: float = BACKOFF_FIRST, most: float = BACKOFF_MAX, *,
                 rng: random.Random | None = None) -> None:
        if first <= 0 or most < first:
            raise ValueError(f"a backoff needs 0 < first <= most, not {first}/{most}")
        self.first = first
        self.most = most
        self._rng = rng or random.Random()
        self.attempt = 0

    def next(self) -> float:
        step = min(self.most, self.first * (2 ** self.attempt))
        self.attempt += 1
        return float(step / 2 + self._rng.random() * step / 2)

    def reset(self) -> None:
        self.attempt = 0


def jittered(seconds: float, fraction: float, rng: random.Random | None = None) -> float:
    """``seconds`` moved by up to ``fraction`` of itself either way (a fleet spreads out)."""
    if seconds <= 0 or fraction <= 0:
        return max(seconds, 0.0)
    r = (rng or random).random()
    return seconds * (1 - fraction + 2 * fraction * r)
