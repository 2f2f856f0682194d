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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from rdma_hca.contract.checkpoint import Claims, PreparedClaim
from rdma_hca.daemon.dra.checkpoint import Checkpoint

T = TypeVar("T")
Change = Callable[[Claims], Any]
Run = Callable[[str, Callable[[], Claims]], Awaitable[Claims]]


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
        self._pending: list[tuple[Change, asyncio.Future[Any]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.batches = 0  # read-modify-writes run (each writes at most once)
        self.largest = 0  # most changes one of them carried
        self.in_flight = 0  # changes in the batch being written now
        self.skipped = 0  # batches not written: every caller in them had given up

    @property
    def waiting(self) -> int:
        """Changes waiting for the next batch."""
        return len(self._pending)

    async def apply(self, change: Callable[[Claims], T]) -> T:
        """``change``'s result, once the claims it changed are durable."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append((change, future))
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
            for _, future in self._pending:  # only when cancelled (the driver stops)
                future.cancel()
            self._pending = []

    async def _write(self, batch: list[tuple[Change, asyncio.Future[Any]]]) -> None:
        batch = [(change, future) for change, future in batch if not future.done()]
        if not batch:
            self.skipped += 1
            return
        results: list[Any] = []

        def change_all(claims: Claims) -> None:
            # On the writing thread, under the file lock, just before the write: a caller
            # that gave up meanwhile (its future is done) has its change left out.
            results[:] = [None if future.done() else change(claims)
                          for change, future in batch]

        fallback = dict(self._known())
        deadline = time.monotonic() + self.checkpoint.deadline
        self.batches += 1
        self.largest = max(self.largest, len(batch))
        self.in_flight = len(batch)
        try:
            await self._run(f"writing the checkpoint {self.checkpoint.path}",
                            lambda: self.checkpoint.update(change_all, fallback,
                                                           deadline=deadline))
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            self.in_flight = 0
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
