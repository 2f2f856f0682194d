"""A value many followers watch, each at its own pace: the one broadcast mechanism.

Each follower remembers the last generation it saw and waits for a newer one, so one
follower can never consume an update meant for another (a queue shared by followers
would hand each update to only one of them), and a slow follower delays no other: it
simply skips to the newest value when it looks again.

Waiting uses one ``asyncio.Event`` per generation, set when the next one is published
and then replaced. Unlike a Condition it holds no lock, so a follower cancelled or timed
out while waiting can never leave the publisher blocked, and publishing never awaits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from rdma_hca.kit.aio import wait_event

T = TypeVar("T")


def _equal(a: object, b: object) -> bool:
    return a == b


class Broadcast(Generic[T]):
    """``same`` decides whether a published value is news (equality by default)."""

    def __init__(self, value: T, *, same: Callable[[T, T], bool] = _equal) -> None:
        self._value = value
        self._same = same
        self._generation = 0
        self._next = asyncio.Event()

    @property
    def value(self) -> T:
        return self._value

    @property
    def generation(self) -> int:
        return self._generation

    def publish(self, value: T) -> bool:
        """Store ``value``; wake the followers only when it is news. True when it was."""
        if self._same(value, self._value):
            return False
        self._value = value
        self._generation += 1
        done, self._next = self._next, asyncio.Event()
        done.set()
        return True

    async def wait_newer(self, seen: int, timeout: float | None = None) -> int:
        """The current generation once it is newer than ``seen`` (or when ``timeout`` ends)."""
        if self._generation == seen:
            await wait_event(self._next, timeout)
        return self._generation

    async def follow(self, seen: int = 0) -> AsyncIterator[T]:
        """Every value newer than generation ``seen``, the newest one each time, until
        cancelled; values published while the follower was busy are skipped, not queued."""
        while True:
            seen = await self.wait_newer(seen)
            yield self._value
