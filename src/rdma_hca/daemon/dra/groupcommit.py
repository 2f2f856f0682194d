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

A change may bring files of its own (a Prepare's CDI spec and device metadata), written
on the same thread under the file lock, after the read and just before the change is
applied, so that a Prepare hands work to a thread once: a change whose files fail fails
alone, files are never written for a caller that gave up before its batch took the lock,
and files whose entry is not written (the checkpoint write failed or timed out) are
undone there too. A change may also be skipped for what the file already holds
(``unless``: another instance prepared the claim before this one took its lock): its
caller gets that, and neither its files nor its entry are written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from rdma_hca.contract.checkpoint import Claims, PreparedClaim
from rdma_hca.daemon.dra.checkpoint import Checkpoint

log = logging.getLogger(__name__)

T = TypeVar("T")
Change = Callable[[Claims], Any]
Run = Callable[[str, Callable[[], Claims]], Awaitable[Claims]]
# A change's own files: (write, undo), both blocking; written before the checkpoint.
Files = tuple[Callable[[], None], Callable[[], None]]
Pending = tuple[Change, "asyncio.Future[Any]", Files | None, Change | None]


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
                    unless: Callable[[Claims], T | None] | None = None) -> T:
        """``change``'s result, once the claims it changed are durable (and ``files``
        written before them); or what ``unless`` found in the claims on disk (not None),
        read under the lock, and then nothing is written for this change."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append((change, future, files, unless))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_all(), name="dra-checkpoint-write")
        # Shielded: a caller that stops waiting leaves the batch (and the others) alone;
        # its change is dropped unless the write has already taken it.
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    async def _write_all(self) -> None:
        try:
            while self._pending:
                # One turn of the loop: claims whose files were written in the same turn
                # join this batch rather than the next.
                await asyncio.sleep(0)
                batch, self._pending = self._pending, []
                await self._write(batch)
        finally:
            self._writer = None
            for _, future, _, _ in self._pending:  # only when cancelled (the driver stops)
                future.cancel()
            self._pending = []

    async def _write(self, batch: list[Pending]) -> None:
        batch = [pending for pending in batch if not pending[1].done()]
        if not batch:
            self.skipped += 1
            return
        results: list[Any] = [None] * len(batch)
        failed: dict[int, Exception] = {}  # changes whose own files could not be written
        written: list[int] = []  # changes whose own files were written

        def change_all(claims: Claims) -> None:
            # On the writing thread, under the file lock, just before the write: a caller
            # that gave up meanwhile (its future is done) has its change left out, and no
            # file of it is written.
            for i, (change, future, files, unless) in enumerate(batch):
                if future.done():
                    continue
                if unless is not None:
                    found = unless(claims)
                    if found is not None:
                        results[i] = found
                        continue
                if files is not None:
                    try:
                        files[0]()
                    except Exception as exc:  # that change alone fails
                        failed[i] = exc
                        continue
                    written.append(i)
                results[i] = change(claims)

        fallback = dict(self._known())
        deadline = time.monotonic() + self.checkpoint.deadline

        def commit() -> Claims:
            try:
                return self.checkpoint.update(change_all, fallback, deadline=deadline)
            except BaseException:
                _undo(batch, written)
                raise

        self.batches += 1
        self.largest = max(self.largest, len(batch))
        self.in_flight = len(batch)
        try:
            await self._run(f"writing the checkpoint {self.checkpoint.path}", commit)
        except asyncio.CancelledError:
            for _, future, _, _ in batch:
                future.cancel()
            raise
        except Exception as exc:
            for _, future, _, _ in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            self.in_flight = 0
        for i, (_, future, _, _) in enumerate(batch):
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
