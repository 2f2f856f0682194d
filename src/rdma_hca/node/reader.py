"""Reading the machine off the event loop, each call within a deadline.

A sysfs read can hang in a driver (mlx5 waiting on stuck firmware) and nothing can
interrupt it. So every call here runs its reads in a thread of its own and a supervisor
watches that thread (``node.reads.Watch``):

- A read that passes the deadline is given up: its path is remembered as stuck, its
  thread is left to hang (a daemon thread, so it never holds up interpreter exit) and
  the call starts over in a fresh thread in which the stuck path answers "unknown" at
  once. A repeat costs one more pass over sysfs (a fraction of a second at 64 HCAs)
  and happens once per newly stuck file.
- No second read of a stuck path starts until the hung one returns, so hung threads are
  bounded by the number of stuck files. When it returns, the path is read again.
- Once the call itself is past its deadline, further reads get only a short grace
  before being given up, so a call returns in about the deadline however many files
  hang.
- An HCA one of whose files is stuck reads with its ports UNKNOWN (not up, so
  unhealthy); it stays in the inventory.

Threads are ours, not ``asyncio.to_thread``'s: the loop's default executor is joined when
``asyncio.run`` ends, and a thread hung in a read would then hold up the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rdma_hca.node.discovery import Discovery
from rdma_hca.node.model import NodeInventory
from rdma_hca.node.parse import printable
from rdma_hca.node.reads import (
    Abandoned,
    DiscoveryFailed,
    GuardedReads,
    StuckFiles,
    Watch,
)
from rdma_hca.node.sysfs import (
    PortStates,
    listed_hcas,
    port_counters_of,
    port_states_of,
)
from rdma_hca.node.walk import StrPath

__all__ = ["DEFAULT_DEADLINE", "DiscoveryFailed", "NodeReader", "discover_bounded"]

T = TypeVar("T")
log = logging.getLogger("rdma_hca.node.reader")

DEFAULT_DEADLINE = 5.0
"""Seconds one call may take before the read it waits on is given up."""


class _Workers:
    """Daemon threads that are kept for the next call once they have answered.

    A poll every half second would otherwise start two threads each time, which is most
    of an idle daemon's CPU. A thread stuck in a read never comes back to the pool, so
    the next call starts a fresh one: a stuck file costs one thread, as before.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[tuple[Callable[[], None], str]]] = []

    def submit(self, target: Callable[[], None], name: str) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            box = inbox
            try:
                threading.Thread(target=lambda: self._serve(box), name=IDLE_NAME,
                                 daemon=True).start()
            except RuntimeError as err:  # "can't start new thread": out of threads or memory
                raise DiscoveryFailed(f"discovery ran out of threads ({err})") from err
        inbox.put((target, name))

    def _serve(self, inbox: queue.SimpleQueue[tuple[Callable[[], None], str]]) -> None:
        me = threading.current_thread()
        while True:
            target, me.name = inbox.get()
            target()
            me.name = IDLE_NAME  # named after its job only while it works on it
            with self._lock:
                self._idle.append(inbox)


IDLE_NAME = "rdma-hca-reader-idle"
_WORKERS = _Workers()


def _start_thread(target: Callable[[], None], name: str) -> None:
    _WORKERS.submit(target, name)


class _Attempt:
    """One thread running ``job`` with its own Watch; the result or error lands here."""

    def __init__(self, job: Callable[[GuardedReads], T], stuck: StuckFiles) -> None:
        self.reads = GuardedReads(stuck)
        self.done = threading.Event()
        self.result: object = None
        self.error: BaseException | None = None
        self._job = job

    def run(self) -> None:
        try:
            self.result = self._job(self.reads)
        except Abandoned:
            return  # given up on: nobody waits for this result any more
        except MemoryError as err:
            self.error = DiscoveryFailed("discovery ran out of memory")
            self.error.__cause__ = err
        except BaseException as err:  # handed to the supervisor, which re-raises it
            self.error = err
        self.done.set()


def _supervise(
    job: Callable[[GuardedReads], T], stuck: StuckFiles, deadline: float, name: str,
    *, log_stalls: bool = True,
) -> tuple[T, list[str]]:
    """Run ``job`` until an attempt finishes; returns its result and the paths it was
    refused because they were stuck (its ``reads.stalled``)."""
    grace = min(deadline, max(0.25, deadline / 10))
    poll = max(0.005, min(deadline / 8, 0.1))
    started = time.monotonic()
    while True:
        attempt = _Attempt(job, stuck)
        _start_thread(attempt.run, name)
        watch: Watch = attempt.reads.watch
        seen = (watch.seq, watch.base, watch.entry)
        since = time.monotonic()
        gave_up = False
        while not attempt.done.wait(poll):
            now = time.monotonic()
            current = (watch.seq, watch.base, watch.entry)
            if current[0] != seen[0] or current[1] is not seen[1] or current[2] is not seen[2]:
                seen, since = current, now
                continue
            waited = now - since
            limit = grace if now - started >= deadline else deadline
            if waited >= limit:
                path = stuck.give_up(watch, seen)
                if path is not None:
                    # Once per stall: no second read of the path starts while this hangs.
                    if log_stalls:
                        log.warning("sysfs: %s did not answer in %.1f s (read deadline %g s); "
                                    "its HCA's state is unknown until it does (reads of it "
                                    "answer 'unknown' at once meanwhile)",
                                    printable(path), waited, deadline)
                    gave_up = True
                    break
                seen, since = (watch.seq, watch.base, watch.entry), now
        if gave_up:
            continue
        if attempt.error is not None:
            raise attempt.error
        return attempt.result, attempt.reads.stalled  # type: ignore[return-value]


async def _off_loop(fn: Callable[[], T], name: str) -> T:
    """``fn()`` in a daemon thread of its own; the loop only waits for the answer."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: object) -> None:
        if future.done():
            return  # the caller was cancelled
        if ok:
            future.set_result(value)  # type: ignore[arg-type]
        else:
            assert isinstance(value, BaseException)
            future.set_exception(value)

    def run() -> None:
        try:
            outcome: tuple[bool, object] = (True, fn())
        except BaseException as err:  # delivered to the awaiting task
            outcome = (False, err)
        # RuntimeError: the loop closed while we worked, so nobody is waiting.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *outcome)

    _start_thread(run, name)
    return await future


class NodeReader:
    """The daemon's way to read the node: discovery, port states and counters, each off
    the event loop and within ``deadline`` seconds, remembering stuck files across calls.
    """

    def __init__(self, sysfs_root: Path, dev_root: Path, *, deadline: float = DEFAULT_DEADLINE
                 ) -> None:
        if not deadline > 0:
            raise ValueError(f"deadline must be above 0 seconds, not {deadline}")
        self.sysfs_root = os.path.abspath(os.fspath(sysfs_root))
        self.dev_root = os.path.abspath(os.fspath(dev_root))
        self.deadline = deadline
        self.inventory: NodeInventory | None = None
        self._stuck = StuckFiles()
        # The tools name stalled files in their own output; the daemon logs them.
        self._log_stalls = True

    @property
    def stalls_total(self) -> int:
        """Reads that passed their deadline, ever."""
        return self._stuck.stalls_total

    @property
    def stuck(self) -> frozenset[str]:
        """Paths whose read is still hanging."""
        with self._stuck.lock:
            return frozenset(self._stuck.paths)

    # -- sync forms, each run in a worker thread by the async ones ------------------------

    def discover_sync(self) -> NodeInventory:
        def job(reads: GuardedReads) -> NodeInventory:
            return Discovery(self.sysfs_root, self.dev_root, reads).run()

        inventory, _ = _supervise(job, self._stuck, self.deadline, "rdma-hca-discover",
                                  log_stalls=self._log_stalls)
        self.inventory = inventory
        return inventory

    def port_states_sync(self) -> PortStates:
        def job(reads: GuardedReads) -> PortStates:
            return port_states_of(
                self.sysfs_root, listed_hcas(self.sysfs_root), reads, self._stuck.owners()
            )

        states, _ = _supervise(job, self._stuck, self.deadline, "rdma-hca-ports")
        return states

    def port_counters_sync(self) -> dict[tuple[str, int], dict[str, int]]:
        inventory = self.inventory
        if inventory is None:
            return {}
        wanted = [(h.name, p.number) for h in inventory.hcas for p in h.ports]
        dirs = {shown: raw for shown, raw in listed_hcas(self.sysfs_root)}

        def job(reads: GuardedReads) -> dict[tuple[str, int], dict[str, int]]:
            found: dict[tuple[str, int], dict[str, int]] = {}
            for hca, port in wanted:
                dirname = dirs.get(hca)
                if dirname is None:
                    continue
                reads.working_on(hca)
                found[(hca, port)] = port_counters_of(self.sysfs_root, dirname, port, reads)
            reads.working_on(None)
            return found

        counters, _ = _supervise(job, self._stuck, self.deadline, "rdma-hca-counters")
        return counters

    def netns_mode_sync(self) -> str | None:
        def job(reads: GuardedReads) -> str | None:
            return Discovery(self.sysfs_root, os.devnull, reads).netns_mode()

        mode, _ = _supervise(job, self._stuck, self.deadline, "rdma-hca-netns")
        return mode

    # -- what the event loop awaits -----------------------------------------------------

    async def discover(self) -> NodeInventory:
        """Full discovery; never raises for a stuck file (its HCA's ports read UNKNOWN and
        ``stalled`` names it); raises DiscoveryFailed only when a resource ran out."""
        return await _off_loop(self.discover_sync, "rdma-hca-discover-call")

    async def port_states(self) -> PortStates:
        """``(hca, port) -> (state, phys_state)`` of every HCA in ``class/infiniband``; a
        port whose file is stuck, or whose HCA has a stuck file, reads UNKNOWN."""
        return await _off_loop(self.port_states_sync, "rdma-hca-ports-call")

    async def port_counters(self) -> dict[tuple[str, int], dict[str, int]]:
        """Counters of every port of the last inventory (empty before the first)."""
        return await _off_loop(self.port_counters_sync, "rdma-hca-counters-call")

    async def netns_mode(self) -> str | None:
        """ib_core's network-namespace mode: "shared", "exclusive" or None."""
        return await _off_loop(self.netns_mode_sync, "rdma-hca-netns-call")


def discover_bounded(
    sysfs_root: StrPath, dev_root: StrPath, *, deadline: float = DEFAULT_DEADLINE
) -> NodeInventory:
    """Discovery for the tools: returns in about ``deadline`` seconds even when a file
    never answers, naming such files in ``stalled``; raises DiscoveryFailed only when a
    resource ran out."""
    reader = NodeReader(Path(os.fspath(sysfs_root)), Path(os.fspath(dev_root)),
                        deadline=deadline)
    reader._log_stalls = False
    return reader.discover_sync()
