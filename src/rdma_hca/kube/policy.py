"""How the client paces itself, as client-go does: token buckets (QPS and burst), waits
that grow exponentially with jitter (``kit.backoff``), and the server's ``Retry-After``
when it gives one.

A client may hold several budgets, each a bucket of its own (the DRA driver: the claim
reads a pod's start waits for, and what the driver sends on its own); inside one bucket,
a ``LOW`` request never takes a token a ``HIGH`` one is waiting for.

Clock, sleep and randomness are injected, so tests step through waits without waiting.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from enum import IntEnum

from rdma_hca.kit.backoff import BACKOFF_FIRST, BACKOFF_MAX, Clock, Sleep

# client-go's rest.Config defaults (DefaultQPS, DefaultBurst in k8s.io/client-go/rest).
DEFAULT_QPS = 5.0
DEFAULT_BURST = 10
# client-go retries a request the server asked to be retried (Retry-After) up to 10 times.
DEFAULT_MAX_RETRIES = 10
# Whatever the server asks, one wait is never longer than this: a deadline bounds the call.
RETRY_AFTER_MAX = 60.0


class Priority(IntEnum):
    HIGH = 0  # goes in the order asked, ahead of every LOW request of its bucket
    LOW = 1  # takes only a token no HIGH request has reserved


@dataclass(frozen=True, slots=True)
class Rate:
    """A budget of its own: ``burst`` requests at once, then ``qps`` a second."""

    name: str
    qps: float
    burst: int


DEFAULT_RATE = "default"


@dataclass(frozen=True, slots=True)
class ClientPolicy:
    qps: float = DEFAULT_QPS
    burst: int = DEFAULT_BURST
    rate_name: str = DEFAULT_RATE
    """The name of the budget ``qps``/``burst`` set: what a request without one takes from."""
    rates: tuple[Rate, ...] = ()
    """Further budgets, each a bucket of its own, that a request names to take from."""
    timeout: float = 10.0
    """Deadline of one HTTP exchange, seconds."""
    budget: float | None = None
    """Deadline of a call with all its retries; None: three times ``timeout``."""
    max_retries: int = DEFAULT_MAX_RETRIES
    backoff_first: float = BACKOFF_FIRST
    backoff_max: float = BACKOFF_MAX

    @property
    def call_deadline(self) -> float:
        return self.budget if self.budget is not None else 3 * self.timeout


class TokenBucket:
    """``burst`` requests at once, then ``qps`` a second: client-go's token bucket limiter,
    with two priorities.

    A ``HIGH`` request reserves the next token (the bucket may go below zero: it waits its
    turn, in the order asked, as client-go's limiter does). A ``LOW`` one takes a token only
    when one is there unreserved, so however many ``LOW`` requests wait, a ``HIGH`` one
    never waits behind them; ``LOW`` requests go one at a time, in the order asked.
    """

    def __init__(self, qps: float, burst: int, *, clock: Clock = time.monotonic,
                 sleep: Sleep = asyncio.sleep) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs qps > 0 and burst >= 1, not {qps}/{burst}")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._at = clock()
        self._low = asyncio.Lock()
        self.throttled = 0  # requests that had to wait
        self.waited = 0.0  # seconds requests spent waiting for a token, all together

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now

    def reserve(self) -> float:
        """Take a token; the seconds to wait before using it (0: go now)."""
        self._refill()
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def take(self, priority: Priority = Priority.HIGH) -> float:
        """Wait for a token; the seconds waited."""
        if priority is Priority.HIGH:
            wait = self.reserve()
            if wait > 0:
                self.throttled += 1
                self.waited += wait
                await self._sleep(wait)
            return wait
        started = self._clock()
        async with self._low:
            self._refill()
            if self._tokens < 1:
                self.throttled += 1
            while self._tokens < 1:
                # Reserved HIGH tokens push this further each time round.
                await self._sleep((1.0 - self._tokens) / self.qps)
                self._refill()
            self._tokens -= 1.0
        waited = max(0.0, self._clock() - started)
        self.waited += waited
        return waited


def retry_after(value: str | None, most: float = RETRY_AFTER_MAX) -> float | None:
    """Seconds of a ``Retry-After`` header (delta-seconds; an HTTP date counts as 1 s, as
    client-go does with anything it cannot read as seconds), at most ``most``; None when
    absent."""
    if value is None or not value.strip():
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return 1.0
    return min(max(seconds, 0.0), most)
