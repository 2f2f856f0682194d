"""When the slice publisher writes: the pool's queue and the spacing of writes.

The queue is upstream's workqueue for one key (the pool): at most one pass pending, with
or without a check of the server's copy; updates arriving meanwhile join it. The damper
spaces writes while changes keep coming; the publisher's loop uses both.
"""

from __future__ import annotations

import asyncio

DEFAULT_SPACING = 2.5  # seconds between writes while changes keep coming

class PoolQueue:
    """The pool's pending work: a pass is due (``wake``), with a check or not."""

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.running = False  # a pass is under way
        self._check = True  # read the server's copy first (it may have changed)
        self._poked = asyncio.Event()

    def add(self, *, check: bool = False) -> None:
        self._check = self._check or check
        self.wake.set()
        self._poked.set()

    async def next_add(self) -> None:
        """Return at the next :meth:`add` (the loop's one waiter, while it spaces writes)."""
        self._poked.clear()
        await self._poked.wait()

    def take(self) -> bool:
        """The loop starts a pass: clears the wake-up; whether a check was asked for."""
        self.wake.clear()
        check, self._check = self._check, False
        return check

    @property
    def idle(self) -> bool:
        return not self.running and not self.wake.is_set()


class Damper:
    """Spacing of slice writes: none for the first change of a quiet node, at least
    ``spacing`` seconds between writes while changes keep coming."""

    def __init__(self, spacing: float = DEFAULT_SPACING) -> None:
        self.spacing = spacing
        self.last: float | None = None

    def hold(self, now: float) -> float:
        """Seconds to wait before the next write."""
        if self.last is None:
            return 0.0
        return max(0.0, self.last + self.spacing - now)

    def wrote(self, now: float) -> None:
        self.last = now
