"""Small asyncio helpers shared by the daemon's cooperating tasks, and its one bounded stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


async def cancel_all(tasks: Iterable[asyncio.Future[Any]], *, within: float | None = None,
                     what: str = "tasks") -> list[str]:
    """Cancel the tasks and wait until each has really finished.

    Without ``within`` the wait has no bound, and a task that ended with an error raises
    it here. With ``within`` it is a bounded stop (:func:`settle`): what is still running
    after ``within`` seconds is named in the log and left, and its descriptions returned.
    """
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    if within is not None:
        return await settle(tasks, within=within, what=what)
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t
    return []


async def settle(work: Iterable[Awaitable[Any]], *, within: float, what: str) -> list[str]:
    """Wait up to ``within`` seconds for ``work`` to end; the ones still running then are
    left running, named in the log (with where each one waits), and their descriptions
    returned.

    The one bounded stop of the project: a step of a stop that does not finish (a gRPC
    shutdown that hangs, a task that swallows its cancel) must neither keep the steps
    after it from closing their servers nor keep SIGTERM from ending the process. Errors
    of the work that did end are logged, not raised: the stop goes on either way.
    """
    futures = [asyncio.ensure_future(w) for w in work]
    if not futures:
        return []
    _, pending = await asyncio.wait(set(futures), timeout=within)
    for f in futures:
        if f.done() and not f.cancelled() and f.exception() is not None:
            log.debug("while stopping %s: %r", what, f.exception())
    left = [describe(f) for f in futures if f in pending]
    if left:
        log.error("stopping %s took over %g s; left running: %s", what, within,
                  "; ".join(left))
    return left


def describe(future: asyncio.Future[Any]) -> str:
    """A task's name and where it waits (innermost last): what a stuck stop reports."""
    if not isinstance(future, asyncio.Task):
        return repr(future)
    frames = future.get_stack(limit=3)
    where = " < ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(frames))
    return f"{future.get_name()} at {where or '?'}"


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
