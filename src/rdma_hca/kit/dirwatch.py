"""Watching a directory for files appearing and disappearing, through inotify.

Both front ends follow the kubelet's directories this way: the kubelet wipes them when
it starts, and a socket of ours that is gone must be served again at once, not at the
next poll. The watch survives its directory going away (it waits for it to come back)
and inotify failing (it retries after ``retry`` seconds); callers keep a slow backstop
check of their own in case an event was lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DirEvent:
    name: str | None  # the entry's name; None for events of the directory itself
    created: bool = False  # created in, or moved into, the directory
    removed: bool = False  # deleted, or moved out
    watching: bool = False  # a watch (re)started: anything may have changed meanwhile
    gone: bool = False  # the directory itself was removed or moved away


async def watch_dir(directory: str, *, missing_poll: float = 1.0, retry: float = 5.0,
                    creations: bool = True, writes: bool = True) -> AsyncIterator[DirEvent]:
    """Events of ``directory`` until cancelled; waits while it does not exist.

    Names moved in or out and removals are always reported; ``creations`` (an entry
    created in place) and ``writes`` (a file closed after a write) may be left out by a
    watcher that needs neither: each file written by a rename (a temp file created,
    written, closed, renamed) would otherwise wake it three times, not once.
    """
    from asyncinotify import Inotify, Mask

    mask = (Mask.DELETE | Mask.MOVED_TO | Mask.MOVED_FROM | Mask.DELETE_SELF
            | Mask.MOVE_SELF)
    if creations:
        mask |= Mask.CREATE
    if writes:
        mask |= Mask.CLOSE_WRITE
    while True:
        if not os.path.isdir(directory):
            await asyncio.sleep(missing_poll)
            continue
        try:
            with Inotify() as inotify:
                inotify.add_watch(directory, mask)
                yield DirEvent(None, watching=True)
                async for event in inotify:
                    if event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED):
                        yield DirEvent(None, gone=True)
                        break
                    yield DirEvent(
                        event.name.name if event.name is not None else None,
                        created=bool(event.mask & (Mask.CREATE | Mask.MOVED_TO)),
                        removed=bool(event.mask & (Mask.DELETE | Mask.MOVED_FROM)))
        except OSError as exc:
            log.warning("cannot watch %s (%s); polling it instead", directory, exc)
            await asyncio.sleep(retry)
