"""Blocking calls of the daemon's own, run off the event loop with a deadline.

Reads of the machine and writes of the files the daemon owns can block without end
(a sysfs attribute stuck in a driver or in HCA firmware, a hung filesystem). Calls run
on the process's daemon threads (``kit.workers``), so that a thread that never returns
neither holds up the event loop nor keeps the process from exiting; a thread given up on
is replaced. At most one
call per key is in flight: while one is stuck, the next call with that key fails at
once instead of starting a second stuck thread, so stuck threads stay bounded by the
number of keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

from rdma_hca.kit.workers import WORKERS

log = logging.getLogger(__name__)

T = TypeVar("T")


class Stalled(Exception):
    """A blocking call passed its deadline (or an earlier one with its key still runs)."""

    def __init__(self, key: str, deadline: float) -> None:
        super().__init__(f"{key} did not answer within {deadline:g} s")
        self.key = key


class OffLoop:
    """Runs blocking calls on daemon threads; counts and logs the ones that stall."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.stalls_total = 0
        self._stuck: set[str] = set()

    @property
    def stuck(self) -> frozenset[str]:
        return frozenset(self._stuck)

    async def run(self, key: str, fn: Callable[[], T]) -> T:
        """``fn()`` on a thread; raises :class:`Stalled` past the deadline."""
        return (await self.each([key], lambda _: fn()))[key]

    async def each(self, keys: Iterable[str], fn: Callable[[str], T], *,
                   partial: bool = False) -> dict[str, T]:
        """``fn(key)`` for each key in turn, on one thread.

        A key whose call passes the deadline becomes stuck: it is skipped until that
        call returns, and the keys after it go on on a new thread. With ``partial``
        the answers of the other keys come back (a stuck key is just absent);
        otherwise a stuck key raises :class:`Stalled`.
        """
        loop = asyncio.get_running_loop()
        results: dict[str, T] = {}
        todo = list(dict.fromkeys(keys))
        stalled = [k for k in todo if k in self._stuck]
        todo = [k for k in todo if k not in self._stuck]
        while todo:
            batch = todo
            at = [0]
            done: asyncio.Future[None] = loop.create_future()

            def work(batch: list[str] = batch, at: list[int] = at,
                     done: asyncio.Future[None] = done) -> None:
                try:
                    for i, key in enumerate(batch):
                        at[0] = i
                        value = fn(key)
                        if key in self._stuck:  # late: tell the loop, then stop here
                            _call_soon(loop, self._answered, key)
                            return
                        results[key] = value
                except BaseException as exc:  # handed to the awaiting task
                    _call_soon(loop, _settle, done, exc)
                else:
                    _call_soon(loop, _settle, done, None)

            WORKERS.submit(work, "rdma-hca-offloop")
            # asyncio.wait, not wait_for(shield(...)): on Python 3.11 wait_for returns the
            # answer instead of raising a cancel that lands while the answer is handed
            # over, and a caller looping over calls then outlives the stop that cancelled it.
            finished, _ = await asyncio.wait({done}, timeout=self.deadline)
            if finished:
                done.result()  # the call's own error is the caller's
                break
            key = batch[at[0]]
            self._stuck.add(key)
            self.stalls_total += 1
            stalled.append(key)
            log.warning("%s did not answer within %g s; treated as unknown until it "
                        "does", key, self.deadline)
            todo = batch[at[0] + 1:]
        if stalled and not partial:
            raise Stalled(stalled[0], self.deadline)
        return {k: results[k] for k in list(results)}

    def _answered(self, key: str) -> None:
        if key in self._stuck:
            self._stuck.discard(key)
            log.warning("%s answered again", key)


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(None)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: object) -> None:
    # The loop may have closed while the call was stuck: nobody waits for it any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)
