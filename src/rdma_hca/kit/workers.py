"""The daemon threads every off-loop call runs on: one pool for reads and writes alike.

Threads are ours, not ``asyncio.to_thread``'s: the loop's default executor is joined when
``asyncio.run`` ends, and a thread hung in a read or a write would then hold up the
exit. A thread that answered is kept for the next call (a poll every half second would
otherwise start a thread each time, which is most of an idle daemon's CPU, and starting
one waits until it runs). A thread stuck in a call never comes back, so the next call
starts a fresh one: a stuck call costs one thread. When the stuck call returns at last,
its thread rejoins the pool, or ends when enough others wait idle.

Every thread of the daemon is one of these: calls that can hang on the machine or a
filesystem go through ``kit.offloop`` (a deadline, one stuck call per key), work that
always ends (rendering a scrape, judging GIDs) or that its caller gives no deadline through
:meth:`Workers.run`. Nothing in the daemon calls ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from functools import partial
from typing import TypeVar

T = TypeVar("T")

IDLE_NAME = "rdma-hca-idle"
# Idle threads kept for the next calls: the health poll's, a scrape's and a file write's
# may overlap. A thread that finishes when as many wait already ends, so the pool is no
# larger than the work of the moment (a burst of calls at start no longer leaves its
# threads, each a stack and a malloc arena, behind for the life of the process).
KEEP_IDLE = 2

_Job = tuple[Callable[[], None], str, "Callable[[], None] | None"]


class NoThread(RuntimeError):
    """No thread could be started (out of threads or memory)."""


class Workers:
    def __init__(self, keep_idle: int = KEEP_IDLE) -> None:
        self.keep_idle = keep_idle
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_Job]] = []

    def submit(self, target: Callable[[], None], name: str,
               then: Callable[[], None] | None = None) -> None:
        """Run ``target`` on a pooled thread named ``name`` while it works; ``then`` runs
        once the thread is back in the pool, so whoever it wakes finds it free."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            box = inbox
            try:
                threading.Thread(target=lambda: self._serve(box), name=IDLE_NAME,
                                 daemon=True).start()
            except RuntimeError as err:  # "can't start new thread"
                raise NoThread(str(err)) from err
        inbox.put((target, name, then))

    async def run(self, fn: Callable[[], T], name: str) -> T:
        """``fn()`` on a pooled thread named ``name``, awaited: ``asyncio.to_thread`` on the
        project's own threads, with no deadline. A caller cancelled meanwhile stops
        waiting; the thread finishes the call and rejoins the pool."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()

        def work() -> None:
            try:
                value = fn()
            except BaseException as exc:  # handed to the awaiting task
                _answer(loop, answer, partial(answer.set_exception, exc))
            else:
                _answer(loop, answer, partial(answer.set_result, value))

        self.submit(work, name)
        return await answer

    def _serve(self, inbox: queue.SimpleQueue[_Job]) -> None:
        me = threading.current_thread()
        while True:
            target, me.name, then = inbox.get()
            target()
            me.name = IDLE_NAME  # named after its job only while it works on it
            with self._lock:
                keep = len(self._idle) < self.keep_idle
                if keep:
                    self._idle.append(inbox)
            if then is not None:
                then()
            if not keep:
                return


def _answer(loop: asyncio.AbstractEventLoop, answer: asyncio.Future[T],
            give: Callable[[], None]) -> None:
    def hand_over() -> None:
        if not answer.done():  # a caller that was cancelled takes nothing
            give()

    # The loop may have closed while the call ran: nobody waits for it any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(hand_over)


WORKERS = Workers()
"""The process's one pool."""
