"""Watching a directory for files appearing and disappearing, through inotify.

Both front ends follow the kubelet's directories this way: the kubelet wipes them when
it starts, and a socket of ours that is gone must be served again at once, not at the
next poll. The watch survives its directory going away (it waits for it to come back)
and inotify failing (it retries after ``retry`` seconds); callers keep a slow backstop
check of their own in case an event was lost.

A follower is a handler called on the loop as the events are read (``follow_dir``), which
must not wait. The followers of one directory on one loop share a single inotify watch:
one descriptor, always registered, read by one callback that hands each event to the
handlers that asked for its kind. The DRA driver's checkpoint lives beside its
socket, so at every rename of the checkpoint its two followers of that directory would
otherwise each wake a task (and register and drop their descriptor with epoll), on the
loop, while the writing thread waits for the GIL to fsync the directory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DirEvent:
    name: str | None  # the entry's name; None for events of the directory itself
    created: bool = False  # created in, or moved into, the directory
    removed: bool = False  # deleted, or moved out
    watching: bool = False  # a watch (re)started: anything may have changed meanwhile
    gone: bool = False  # the directory itself was removed or moved away


def load() -> None:
    """Load the inotify bindings ahead of the first watch (blocking: an import and a
    dlopen of libc, some 8 ms), for a caller that can do it off the loop."""
    import asyncinotify  # noqa: F401


def _mask(creations: bool, writes: bool) -> Any:
    from asyncinotify import Mask  # on first use: not every process watches a directory

    mask = (Mask.DELETE | Mask.MOVED_TO | Mask.MOVED_FROM | Mask.DELETE_SELF
            | Mask.MOVE_SELF)
    if creations:
        mask |= Mask.CREATE
    if writes:
        mask |= Mask.CLOSE_WRITE
    return mask


DirHandler = Callable[[DirEvent], None]
# inotify's bits (inotify(7)): the directory itself gone (DELETE_SELF, MOVE_SELF, IGNORED),
# an entry created or moved in (CREATE, MOVED_TO), removed or moved out (DELETE,
# MOVED_FROM).
_GONE = 0x400 | 0x800 | 0x8000
_CREATED = 0x100 | 0x80
_REMOVED = 0x200 | 0x40
# The kinds a follower may leave out (CREATE, CLOSE_WRITE), and IN_ISDIR, which only
# qualifies them: any other event (a queue overflow too) goes to every follower.
_OPTIONAL = 0x100 | 0x8 | 0x40000000


@dataclass(eq=False, slots=True)
class _Follower:
    handler: DirHandler
    mask: int  # the kinds of event it asked for (inotify's bits)
    # Set when its watch ends: None (the directory went away), the OSError that stopped
    # the watch, or the exception its handler raised.
    ended: asyncio.Future[OSError | None]


class _SharedWatch:
    """One inotify watch of a directory for every follower of it on one loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, directory: str, mask: int) -> None:
        from asyncinotify import Inotify, Mask

        self._loop = loop
        self.directory = directory
        self.mask = mask
        self.followers: list[_Follower] = []
        self.closed = False
        self._inotify = Inotify()
        try:
            # Read until it has nothing left: never a read that waits on the loop (the
            # library asks for O_NONBLOCK, and its descriptors come out blocking).
            os.set_blocking(self._inotify.fd, False)
            self._inotify.add_watch(directory, Mask(mask))
            loop.add_reader(self._inotify.fd, self._ready)
        except BaseException:
            self._inotify.close()
            raise

    def widen(self, mask: int) -> None:
        """Watch for ``mask`` too (a follower that asks for more joined)."""
        from asyncinotify import Mask

        if mask & ~self.mask:
            self._inotify.add_watch(self.directory, Mask(self.mask | mask))  # replaces it
            self.mask |= mask

    def leave(self, follower: _Follower) -> None:
        if follower in self.followers:
            self.followers.remove(follower)
        if not self.followers:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if _SHARED.get(self._loop, {}).get(self.directory) is self:
            del _SHARED[self._loop][self.directory]
        self._loop.remove_reader(self._inotify.fd)
        self._inotify.close()

    def _end(self, why: OSError | None) -> None:
        self.close()
        for f in self.followers:
            if not f.ended.done():
                f.ended.set_result(why)

    def _ready(self) -> None:
        # Plain ints, not the library's IntFlag: every operation on one builds a flag,
        # and this runs while a writing thread may be waiting for the GIL.
        while not self.closed:
            try:
                event = self._inotify.sync_get()  # non-blocking: every event read, then this
            except BlockingIOError:
                return
            except OSError as exc:
                self._end(exc)
                return
            if event is None:
                return
            mask = int(event.mask)
            if mask & _GONE:
                self._hand(None, DirEvent(None, gone=True))
                self._end(None)
                return
            self._hand(mask, DirEvent(event.name.name if event.name is not None else None,
                                      created=bool(mask & _CREATED),
                                      removed=bool(mask & _REMOVED)))

    def _hand(self, mask: int | None, event: DirEvent) -> None:
        for f in list(self.followers):
            if f.ended.done() or (mask is not None and not mask & ~_OPTIONAL
                                  and not mask & f.mask):
                continue
            try:
                f.handler(event)
            except Exception as exc:  # ends that follower alone, raised from follow_dir
                self.followers.remove(f)
                f.ended.set_exception(exc)
        if not self.followers:
            self.close()


_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _SharedWatch]] = \
    weakref.WeakKeyDictionary()


async def follow_dir(directory: str, handler: DirHandler, *, missing_poll: float = 1.0,
                     retry: float = 5.0, creations: bool = True, writes: bool = True) -> None:
    """``handler`` called with the events of ``directory`` until cancelled; waits while
    it does not exist (a :class:`DirEvent` with ``watching`` each time a watch starts,
    one with ``gone`` when the directory goes). Names moved in or out and removals are
    always handed on; ``creations`` (an entry created in place) and ``writes`` (a file
    closed after a write) may be left out by a follower that needs neither: each file
    written by a rename (a temp file created, written, closed, renamed) would otherwise
    reach it three times, not once.

    The handler runs on the loop inside the watch's read of its events, so it must not
    wait (wake a task of its own for anything slow); what it raises ends the follow,
    raised from here. Followers of one directory on one loop share one watch."""
    loop = asyncio.get_running_loop()
    key = os.path.abspath(directory)
    mask = int(_mask(creations, writes))
    while True:
        if not os.path.isdir(directory):
            await asyncio.sleep(missing_poll)
            continue
        watches = _SHARED.setdefault(loop, {})
        try:
            shared = watches.get(key)
            if shared is None:
                shared = watches[key] = _SharedWatch(loop, key, mask)
            else:
                shared.widen(mask)
        except OSError as exc:
            log.warning("cannot watch %s (%s); polling it instead", directory, exc)
            await asyncio.sleep(retry)
            continue
        follower = _Follower(handler, mask, loop.create_future())
        shared.followers.append(follower)
        try:
            handler(DirEvent(None, watching=True))
            failed = await follower.ended
        finally:
            shared.leave(follower)
        if failed is not None:
            log.warning("cannot watch %s (%s); polling it instead", directory, failed)
            await asyncio.sleep(retry)
