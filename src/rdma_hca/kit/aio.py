"""Small asyncio helpers shared by the daemon's cooperating tasks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


async def cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel the tasks and wait until each has really finished."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t


async def unless(work: Awaitable[T], stop: Awaitable[object]) -> asyncio.Future[T] | None:
    """Await ``work`` unless ``stop`` finishes first.

    Returns ``work``'s finished future (its result or error is the caller's to take),
    or None when ``stop`` came first. The loser is cancelled but not awaited: a caller
    that has moved on, or is being cancelled itself, must not wait for it to unwind.
    """
    w = asyncio.ensure_future(work)
    s = asyncio.ensure_future(stop)
    try:
        await asyncio.wait({w, s}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        _drop(w)
        _drop(s)
        raise
    _drop(s)
    if w.done():
        return w
    _drop(w)
    return None


def _drop(future: asyncio.Future[Any]) -> None:
    future.cancel()  # a no-op once it is done
    future.add_done_callback(_collect)


def _collect(future: asyncio.Future[Any]) -> None:
    """Take the outcome of a future nobody awaits, so asyncio does not report it as lost."""
    if not future.cancelled():
        future.exception()



async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds; True when it was set.

    Unlike ``asyncio.wait_for(event.wait(), timeout)``, a cancellation is never lost: on
    Python 3.11 wait_for can swallow a cancel that arrives just as the event is set, and
    a loop waiting that way then outlives the stop that cancelled it.
    """
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return bool(done)
