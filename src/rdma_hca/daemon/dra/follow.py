"""Following the checkpoint that another instance of the driver writes.

During a rolling update two instances share one checkpoint, and the kubelet calls the
newer one: without following the file, the older would keep the prepared set it loaded
at start, and so the bandwidth it reports held, the claims whose status it keeps
written and what its group commit writes when the file cannot be read. Every new
version of the file is handed on (ours too: a write of ours carries what the other
instance wrote before it, read under the lock) to the prepared claims' owner
(``prepared.PreparedClaims.followed``), told whether another instance wrote since the
last look, so that it stops trusting what it remembers.

The file's directory is watched through inotify for names moved in or out and removals
(every writer replaces the file by a rename; an edit in place is left to the backstop),
with a slow backstop look in case an event was lost. Reads run off the loop. A read
during which a write of this instance landed is done again: a Prepare that has just
written its entry must not see its claim taken away by the older version the read found.

The rename of a write of this instance is not looked at: its version holds nothing this
instance does not know, unless it carried another instance's write, whose own rename
wakes the follower. Every write of ours is counted before it renames the file
(``Checkpoint.renames``), so as many of the file's events are skipped; which events
are skipped does not matter, only that each event past those skipped is looked at,
after the renames before it. A write that fails (it may not have renamed) wakes the
follower, and a watch started again forgets what it owed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable

from rdma_hca.contract.checkpoint import Claims
from rdma_hca.daemon.dra.checkpoint import Checkpoint, FileId
from rdma_hca.kit.aio import cancel_all, wait_event
from rdma_hca.kit.dirwatch import DirEvent, follow_dir
from rdma_hca.kit.sayonce import Latch

log = logging.getLogger(__name__)

# (the version read, its claims, whether another instance wrote), or None: nothing new
Look = tuple[FileId, Claims, bool] | None
Run = Callable[[str, Callable[[], Look]], Awaitable[Look]]  # off the loop, with a deadline
# Claims of a version (None: the file cannot be read, trust nothing remembered), and
# whether another instance wrote it (or a version carried into it).
OnClaims = Callable[[Claims | None, bool], None]
TRIES = 5  # reads in a row that may each race with a write of ours


class CheckpointFollower:
    """``await run()`` until cancelled; ``await look()`` once (tests, the backstop)."""

    def __init__(self, checkpoint: Checkpoint, run: Run, on_claims: OnClaims, *,
                 backstop: float) -> None:
        self.checkpoint = checkpoint
        self._run = run
        self._on_claims = on_claims
        self._backstop = backstop
        self._wake = asyncio.Event()
        self._seen: FileId | None = None  # the version handed on last
        self._failing = Latch()
        self._skipped_to = checkpoint.renames  # writes of ours whose event was skipped
        self.handed = 0  # versions handed on
        self.foreign = 0  # of which another instance had written
        self.own_skipped = 0  # events of our own writes not looked at

    async def run(self) -> None:
        loop = asyncio.get_running_loop()

        def unsure() -> None:  # on a writing thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody follows
                loop.call_soon_threadsafe(self._unsure)

        self.checkpoint.on_unsure = unsure
        watcher = asyncio.create_task(self._watch(), name="dra-checkpoint-watch-dir")
        try:
            while True:
                await wait_event(self._wake, self._backstop)
                self._wake.clear()
                await self.look()
        finally:
            self.checkpoint.on_unsure = None
            await cancel_all([watcher])

    def _unsure(self) -> None:
        self._skipped_to = min(self._skipped_to, self.checkpoint.renames)
        self._wake.set()

    async def _watch(self) -> None:
        path = self.checkpoint.path
        name = os.path.basename(path)

        def on_event(event: DirEvent) -> None:
            # On the loop, as the watch reads the event: our own rename costs no task a
            # turn while its thread waits for the GIL to fsync the directory.
            if event.name == name and not event.removed:
                if self.checkpoint.renames > self._skipped_to:
                    self._skipped_to += 1  # a rename of ours, begun before this event
                    self.own_skipped += 1
                    return
                self._wake.set()
            elif event.watching or event.gone or event.name is None or event.name == name:
                # Events may have been lost: none is owed, look now.
                self._skipped_to = self.checkpoint.renames
                self._wake.set()

        # Every writer replaces the file by a rename (this driver's instances): the
        # creation and closing of their temp files, here and beside the kubelet socket,
        # would only wake the loop while a Prepare's thread writes. An edit in place is
        # seen by the backstop.
        await follow_dir(os.path.dirname(path) or ".", on_event, creations=False,
                         writes=False)

    async def look(self) -> bool:
        """Hand on the version there now if it is new; True when one was handed on."""
        path = self.checkpoint.path
        carried = False  # another instance's write seen in a read that raced with ours
        for _ in range(TRIES):
            writes = self.checkpoint.writes
            try:
                seen = await self._run(f"following the checkpoint {path}", self._read)
            except Exception as exc:  # a stuck disk: trust nothing from memory
                if self._failing.set(str(exc)):
                    log.warning("cannot follow the checkpoint %s: %s", path, exc)
                self._seen = None
                self._on_claims(None, True)
                return False
            if seen is not None:
                carried = carried or seen[2]
            if self.checkpoint.writes != writes:
                continue  # a write of ours ran meanwhile: its version is the one to hand on
            if self._failing.clear():
                log.info("the checkpoint %s can be followed again", path)
            if seen is None:
                return False
            ident, claims, _ = seen
            self._seen = ident
            self.handed += 1
            self.foreign += carried
            self._on_claims(claims, carried)
            return True
        return False

    def _read(self) -> Look:
        """On a thread: the version there, unless it is the one handed on last."""
        checkpoint = self.checkpoint
        ident = checkpoint.version()
        merged = checkpoint.take_merged_foreign()
        if ident is None or (ident == self._seen and not merged):
            return None
        claims, _ = checkpoint.read()  # CheckpointError: the caller trusts nothing
        return ident, claims, merged or ident != checkpoint.written
