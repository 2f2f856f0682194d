"""Claims ready at the same moment share one checkpoint write.

Every change of the checkpoint is a read-modify-write of the whole file under its lock,
with an fsync: done once per claim, a burst of N claims would write N files of up to N
entries. Here a change waits for the write in flight (if any) to end, and all the
changes that came meanwhile go out together: one read under the lock, one write, one
fsync for the lot. The file is still read again under the lock before each write, so
what another instance wrote since is kept. A change's caller hears back only once its
entry is on disk, and a write that fails fails every change it carried.
"""

from __future__ import annotations

import asyncio
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
        # Shielded: a caller that stops waiting leaves the batch (and the others) alone.
        return await asyncio.shield(future)

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
        results: list[Any] = []

        def change_all(claims: Claims) -> None:
            results[:] = [change(claims) for change, _ in batch]

        fallback = dict(self._known())
        self.batches += 1
        self.largest = max(self.largest, len(batch))
        self.in_flight = len(batch)
        try:
            await self._run(f"writing the checkpoint {self.checkpoint.path}",
                            lambda: self.checkpoint.update(change_all, fallback))
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
