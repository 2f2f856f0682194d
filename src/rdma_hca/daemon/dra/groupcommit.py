"""Claims ready at the same moment share one checkpoint write.

Every change of the checkpoint is a read-modify-write of the whole file under its lock,
with an fsync: done once per claim, a burst of N claims would write N files of up to N
entries. Here a change waits for the write in flight (if any) to end, and all the
changes that came meanwhile go out together: one read under the lock, one write, one
fsync for the lot. The file is still read again under the lock before each write, so
what another instance wrote since is kept. A change's caller hears back only once its
entry is on disk, and a write that fails fails every change it carried. A change whose
caller gave up (cancelled, or failed at its deadline) before the write is left out of it,
and a batch left with no change is not written: nothing lands on disk for a caller that
has already undone its side (a Prepare that removed its CDI spec).

A change may bring files of its own (a Prepare's CDI spec and device metadata), put in
place on the writing thread under the file lock, once the new version of the checkpoint
is durable in its temp file and just before its rename, so that a Prepare hands work
to a thread once. Their content may be staged (``staging``: written to temp files and
fsynced) on another thread meanwhile, so that their fsync and the checkpoint's run at
once rather than one after the other. A change whose files fail fails alone (the
checkpoint is then written without it), files are never put in place for a caller that
gave up before its batch took the lock, and files whose entry is not written (the
checkpoint write failed or timed out) are undone there too. A change may also be skipped
for what the file already holds (``unless``: another instance prepared the claim before
this one took its lock): its caller gets that, and neither its files nor its entry are
written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from rdma_hca.contract.checkpoint import Claims, PreparedClaim
from rdma_hca.daemon.dra.checkpoint import Checkpoint, CheckpointBusy
from rdma_hca.kit.workers import WORKERS, NoThread

log = logging.getLogger(__name__)

T = TypeVar("T")
Change = Callable[[Claims], Any]
Run = Callable[[str, Callable[[], Claims]], Awaitable[Claims]]
# A change's own files: (write, undo), both blocking; written before the checkpoint's rename.
Files = tuple[Callable[[], None], Callable[[], None]]
# Their content staged ahead: (flush, discard), both blocking; flush on another thread
# while the checkpoint is written, discard when the files were not put in place.
Staging = tuple[Callable[[], None], Callable[[], None]]
Pending = tuple[Change, "asyncio.Future[Any]", Files | None, Change | None, Staging | None]


class _Again(Exception):
    """The files of a change failed after the checkpoint's new version was flushed: it is
    written again without that change."""


class _Staged:
    """The batch's staged files, flushed on another thread while the checkpoint is read,
    changed and flushed; joined before the checkpoint's rename."""

    def __init__(self, batch: list[Pending]) -> None:
        self._jobs = [(i, p[4]) for i, p in enumerate(batch)
                      if p[4] is not None and not p[1].done()]
        self.errors: dict[int, Exception] = {}
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._abandoned = False

    def start(self) -> None:
        if not self._jobs:
            self._done.set()
            return
        try:
            WORKERS.submit(self._flush_all, "rdma-hca-stage-files")
        except NoThread:  # no thread to spare: flushed here, in turn
            self._flush_all()

    def _flush_all(self) -> None:
        for i, (flush, _) in self._jobs:
            try:
                flush()
            except Exception as exc:  # that change alone fails
                self.errors[i] = exc
        with self._lock:
            abandoned = self._abandoned
            self._done.set()
        if abandoned:  # the batch ended without waiting for these: nothing may stay
            self._discard()

    def join(self, deadline: float) -> None:
        if not self._done.wait(max(0.0, deadline - time.monotonic())):
            raise CheckpointBusy("the claims' files were not written in time")

    def discard(self) -> None:
        """Drop the temp files not put in place (now, or when the flushing ends)."""
        with self._lock:
            if not self._done.is_set():
                self._abandoned = True
                return
        self._discard()

    def _discard(self) -> None:
        for _, (_, discard) in self._jobs:
            try:
                discard()
            except OSError as exc:
                log.warning("cannot remove a staged file of a claim: %s", exc)


class GroupCommit:
    """``await apply(change)``: ``change`` is applied to the claims on disk and written.

    ``run`` runs a blocking call off the loop within its deadline; ``known`` is what this
    instance knows, written when the file cannot be read.
    """

    def __init__(self, checkpoint: Checkpoint, run: Run,
                 known: Callable[[], Mapping[str, PreparedClaim]]) -> None:
        self.checkpoint = checkpoint
        self._run = run
        self._known = known
        self._pending: list[Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self.batches = 0  # read-modify-writes run (each writes at most once)
        self.largest = 0  # most changes one of them carried
        self.in_flight = 0  # changes in the batch being written now
        self.skipped = 0  # batches not written: every caller in them had given up

    @property
    def waiting(self) -> int:
        """Changes waiting for the next batch."""
        return len(self._pending)

    async def apply(self, change: Callable[[Claims], T], files: Files | None = None, *,
                    unless: Callable[[Claims], T | None] | None = None,
                    staging: Staging | None = None) -> T:
        """``change``'s result, once the claims it changed are durable (and ``files``
        written before them, ``staging`` flushed first); or what ``unless`` found in the
        claims on disk (not None), read under the lock, and then nothing is written for
        this change."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append((change, future, files, unless, staging))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_all(), name="dra-checkpoint-write")
        # A caller that stops waiting cancels its own future only (no shield, which would
        # cost its answer a turn of the loop): the batch and the others go on, and its
        # change is dropped unless the write has already taken it.
        try:
            return await future
        except asyncio.CancelledError:
            future.cancel()
            raise

    async def _write_all(self) -> None:
        try:
            while self._pending:
                # No turn of the loop waited for: this task begins a turn after the change
                # that started it, so the changes of that same turn are in its batch, and
                # those that come while it writes go in the next; a lone Prepare waits for
                # no batch window.
                batch, self._pending = self._pending, []
                await self._write(batch)
        finally:
            self._writer = None
            for _, future, _, _, _ in self._pending:  # only when cancelled (the driver stops)
                future.cancel()
            self._pending = []

    async def _write(self, batch: list[Pending]) -> None:
        batch = [pending for pending in batch if not pending[1].done()]
        if not batch:
            self.skipped += 1
            return
        results: list[Any] = [None] * len(batch)
        failed: dict[int, Exception] = {}  # changes whose own files could not be written
        written: list[int] = []  # changes whose own files were put in place
        applied: list[int] = []  # changes applied to the version being written
        staged = _Staged(batch)

        def change_all(claims: Claims) -> None:
            # On the writing thread, under the file lock, after the read: a caller that
            # gave up meanwhile (its future is done) has its change left out.
            applied.clear()
            for i, (change, future, _, unless, _) in enumerate(batch):
                if i in failed or future.done():
                    continue
                if unless is not None:
                    found = unless(claims)
                    if found is not None:
                        results[i] = found
                        continue
                results[i] = change(claims)
                applied.append(i)

        def place_files() -> None:
            # The new version is durable, not yet renamed: the files of its changes now.
            staged.join(deadline)
            again = False
            for i in applied:
                files = batch[i][2]
                if files is None or i in written:
                    continue
                error = staged.errors.get(i)
                if error is None:
                    try:
                        files[0]()
                    except Exception as exc:
                        error = exc
                if error is not None:  # that change alone fails
                    failed[i] = error
                    again = True
                else:
                    written.append(i)
            if again:
                raise _Again

        fallback = dict(self._known())
        deadline = time.monotonic() + self.checkpoint.deadline

        def commit() -> Claims:
            staged.start()
            try:
                while True:  # each time again, one change fewer at least
                    with contextlib.suppress(_Again):
                        return self.checkpoint.update(change_all, fallback, deadline=deadline,
                                                      before_rename=place_files)
            except BaseException:
                _undo(batch, written)
                raise
            finally:
                # Nothing staged is left once the caller hears back (unless stuck).
                with contextlib.suppress(CheckpointBusy):
                    staged.join(deadline)
                staged.discard()

        self.batches += 1
        self.largest = max(self.largest, len(batch))
        self.in_flight = len(batch)
        try:
            await self._run(f"writing the checkpoint {self.checkpoint.path}", commit)
        except asyncio.CancelledError:
            for _, future, _, _, _ in batch:
                future.cancel()
            raise
        except Exception as exc:
            for _, future, _, _, _ in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            self.in_flight = 0
        for i, (_, future, _, _, _) in enumerate(batch):
            if future.done():
                continue
            if i in failed:
                future.set_exception(failed[i])
            else:
                future.set_result(results[i])


def _undo(batch: list[Pending], which: list[int]) -> None:
    """The files of changes whose entries were not written: removed, as best it can."""
    for i in which:
        files = batch[i][2]
        if files is None:
            continue
        try:
            files[1]()
        except OSError as exc:
            log.warning("cannot remove the files of a change the checkpoint did not take: %s",
                        exc)
