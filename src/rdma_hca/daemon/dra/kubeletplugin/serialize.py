"""Each claim's calls one at a time: in this process and across instances of the driver.

An asyncio lock per claim in this process, and a record lock in ``claims.lock`` (the
file every instance on the node shares) against another instance during a rolling
update. Claims are independent, so nothing here is global: a call holds the locks of its
own claims (:meth:`ClaimLocks.held_all`), taken in one order everywhere, so two calls
sharing claims cannot wait for each other in a circle.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

from rdma_hca.daemon.dra.claims import ClaimError
from rdma_hca.kit.backoff import Backoff
from rdma_hca.kit.offloop import OffLoop

LOCK_RETRY_FIRST = 0.005
LOCK_RETRY_MAX = 0.1


class ClaimBusy(ClaimError):
    fix = ("a rolling update of the driver is under way; the kubelet tries again, nothing "
           "to do unless it lasts")


class RecordLocks(Protocol):
    """The claims' record locks in the shared lock file: tried, never waited for.

    Off the loop, unless ``locks_now``: then trying a lock and dropping one are each a
    syscall that cannot wait (on a descriptor already open, of a filesystem whose locks
    the kernel keeps itself), run on the event loop to spare two thread hand-offs.
    """

    locks_now: bool

    def try_lock_claim(self, uid: str) -> bool: ...
    def unlock_claim(self, uid: str) -> None: ...


class ClaimLocks:
    """``async with locks.held(uid)``: the claim's lock here and across instances."""

    def __init__(self, records: RecordLocks, io: OffLoop, *, wait: float, lock_path: str) -> None:
        self._records = records
        self._io = io
        self._wait = wait
        self._lock_path = lock_path
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}
        self.lock_waits = 0  # times a claim's lock was held by another instance

    @contextlib.asynccontextmanager
    async def held(self, uid: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(uid, asyncio.Lock())
        self._users[uid] = self._users.get(uid, 0) + 1
        try:
            async with lock:
                await self._lock_across_instances(uid)
                try:
                    yield
                finally:
                    await self._unlock_across_instances(uid)
        finally:
            self._users[uid] -= 1
            if not self._users[uid]:
                del self._users[uid]
                del self._locks[uid]

    @contextlib.asynccontextmanager
    async def held_all(self, uids: Iterable[str]) -> AsyncIterator[dict[str, Exception]]:
        """The locks of every claim named, taken one by one in UID order. Yields the
        claims whose lock could not be had (held by another instance past the wait, or
        the lock file stalled) with why, by UID: those are left alone; the others are
        held until the block ends."""
        busy: dict[str, Exception] = {}
        async with contextlib.AsyncExitStack() as stack:
            for uid in sorted(set(uids)):
                try:
                    await stack.enter_async_context(self.held(uid))
                except Exception as exc:  # that claim alone fails; its answer says why
                    busy[uid] = exc
            yield busy

    async def _lock_across_instances(self, uid: str) -> None:
        """The claim's record lock, waited for at most one read deadline.

        Tried without blocking, again and again: a thread blocked in ``lockf`` could not
        be given up on, and would take the lock after we had stopped waiting for it.
        """
        if await self._try_lock(uid):
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait
        backoff = Backoff(LOCK_RETRY_FIRST, LOCK_RETRY_MAX)  # made only when it is needed
        while True:
            self.lock_waits += 1
            if loop.time() >= deadline:
                raise ClaimBusy(f"another instance of the driver has been working on this "
                                 f"claim for {self._wait:g} s (its lock in {self._lock_path})")
            await asyncio.sleep(backoff.next())
            if await self._try_lock(uid):
                return

    async def _try_lock(self, uid: str) -> bool:
        if self._records.locks_now:
            return self._records.try_lock_claim(uid)  # cannot wait: see RecordLocks
        return await self._io.run(f"locking claim {uid}",
                                  lambda: self._records.try_lock_claim(uid))

    async def _unlock_across_instances(self, uid: str) -> None:
        if self._records.locks_now:
            self._records.unlock_claim(uid)  # dropping a lock held never waits
            return
        await self._io.run(f"unlocking claim {uid}", lambda: self._records.unlock_claim(uid))
