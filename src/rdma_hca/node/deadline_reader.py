"""Reading the machine off the event loop, each call within a deadline.

A sysfs read can hang in a driver (mlx5 waiting on stuck firmware) and nothing can
interrupt it. So every call here runs its reads in a thread of its own, and whoever waits
for the answer watches that thread (``node.file_reads.Watch``): the event loop itself for the
daemon's calls, which costs one thread hand-off a call, the calling thread for the
tools'.

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

Reads run on the process's one pool of daemon threads (``kit.workers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rdma_hca.kit.workers import WORKERS, NoThread
from rdma_hca.node.file_reads import (
    Abandoned,
    DiscoveryFailed,
    GuardedReads,
    ReadStalled,
    StuckFiles,
    Watch,
)
from rdma_hca.node.inventory import Discovery
from rdma_hca.node.model import NodeInventory
from rdma_hca.node.port_polls import (
    PortStates,
    listed_hcas,
    port_counters_of,
    port_states_of,
)
from rdma_hca.node.sysfs_values import printable
from rdma_hca.node.sysfs_walk import StrPath

T = TypeVar("T")
PortCounters = dict[tuple[str, int], dict[str, int]]
log = logging.getLogger(__name__)

DEFAULT_DEADLINE = 5.0
"""Seconds one call may take before the read it waits on is given up."""


@dataclass(frozen=True, slots=True)
class Glance:
    """What the daemon's health poll compares from one pass to the next, read in one call:
    the entries of ``class/infiniband``, ``class/infiniband_verbs``,
    ``class/infiniband_mad`` and ``/dev/infiniband`` (sorted), and every port's state."""

    listings: tuple[tuple[str, ...], ...]
    states: PortStates


class _Attempt:
    """One thread running ``job`` with its own Watch; the result or error lands here."""

    def __init__(self, job: Callable[[GuardedReads], T], stuck: StuckFiles,
                 on_done: Callable[[], None] | None = None) -> None:
        self.reads = GuardedReads(stuck)
        self.done = threading.Event()
        self.result: object = None
        self.error: BaseException | None = None
        self.abandoned = False
        self._job = job
        self._on_done = on_done

    def run(self) -> None:
        try:
            self.result = self._job(self.reads)
        except Abandoned:
            self.abandoned = True  # given up on: nobody waits for this result any more
        except MemoryError as err:
            self.error = DiscoveryFailed("discovery ran out of memory")
            self.error.__cause__ = err
        except BaseException as err:  # handed to the supervisor, which re-raises it
            self.error = err

    def start(self, name: str) -> None:
        try:
            WORKERS.submit(self.run, name, then=self._finish)
        except NoThread as err:
            raise DiscoveryFailed(f"discovery ran out of threads ({err})") from err

    def _finish(self) -> None:
        if self.abandoned:
            return
        self.done.set()
        if self._on_done is not None:
            self._on_done()

    def outcome(self) -> tuple[T, list[str]]:
        if self.error is not None:
            raise self.error
        return self.result, self.reads.stalled  # type: ignore[return-value]


class _Overseer:
    """Watches the attempts of one call and says when the read one is in has hung.

    Whoever waits for the call asks :meth:`hung` every :attr:`poll` seconds; a read that
    has not moved on for the deadline (or, once the call itself is past its deadline,
    for a short grace) is given up.
    """

    def __init__(self, stuck: StuckFiles, deadline: float, log_stalls: bool) -> None:
        self.stuck = stuck
        self.deadline = deadline
        self.log_stalls = log_stalls
        self.grace = min(deadline, max(0.25, deadline / 10))
        self.poll = max(0.005, min(deadline / 8, 0.1))
        self.started = time.monotonic()
        self._watch = Watch()
        self._seen = (0, "", "")
        self._since = self.started

    def follow(self, attempt: _Attempt) -> None:
        self._watch = attempt.reads.watch
        self._seen = (self._watch.seq, self._watch.base, self._watch.entry)
        self._since = time.monotonic()

    def hung(self) -> bool:
        """True when the current read was given up (start a fresh attempt then)."""
        watch, seen = self._watch, self._seen
        now = time.monotonic()
        if watch.seq != seen[0] or watch.base is not seen[1] or watch.entry is not seen[2]:
            self._seen, self._since = (watch.seq, watch.base, watch.entry), now
            return False
        waited = now - self._since
        limit = self.grace if now - self.started >= self.deadline else self.deadline
        if waited < limit:
            return False
        path = self.stuck.give_up(watch, seen)
        if path is None:  # it moved on meanwhile
            self._seen, self._since = (watch.seq, watch.base, watch.entry), now
            return False
        # Once per stall: no second read of the path starts while this hangs.
        if self.log_stalls:
            log.warning("sysfs: %s did not answer in %.1f s (read deadline %g s); its HCA's "
                        "state is unknown until it does (reads of it answer 'unknown' at "
                        "once meanwhile)", printable(path), waited, self.deadline)
        return True


def _supervise(
    job: Callable[[GuardedReads], T], stuck: StuckFiles, deadline: float, name: str,
    *, log_stalls: bool = True,
) -> tuple[T, list[str]]:
    """Run ``job`` until an attempt finishes, waiting in this thread; returns its result
    and the paths it was refused because they were stuck (its ``reads.stalled``)."""
    overseer = _Overseer(stuck, deadline, log_stalls)
    while True:
        attempt = _Attempt(job, stuck)
        attempt.start(name)
        overseer.follow(attempt)
        while not attempt.done.wait(overseer.poll):
            if overseer.hung():
                break
        else:
            return attempt.outcome()


async def _supervise_async(
    job: Callable[[GuardedReads], T], stuck: StuckFiles, deadline: float, name: str,
) -> tuple[T, list[str]]:
    """``_supervise`` with the event loop as the one that waits: one thread per call
    instead of two, and a call that answers at once costs the loop one wake-up."""
    loop = asyncio.get_running_loop()
    overseer = _Overseer(stuck, deadline, True)
    while True:
        answered: asyncio.Future[None] = loop.create_future()

        def settle(answered: asyncio.Future[None] = answered) -> None:
            if not answered.done():  # (cancelled along with the caller)
                answered.set_result(None)

        def wake(settle: Callable[[], None] = settle) -> None:
            # RuntimeError: the loop closed while we read, so nobody is waiting.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle)

        attempt = _Attempt(job, stuck, on_done=wake)
        attempt.start(name)
        overseer.follow(attempt)
        while not answered.done():
            await asyncio.wait((answered,), timeout=overseer.poll)
            if not answered.done() and overseer.hung():
                break
        else:
            return attempt.outcome()


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

    # -- the jobs, each run in an attempt's thread --------------------------------------

    def _discovery_job(self, reads: GuardedReads) -> NodeInventory:
        return Discovery(self.sysfs_root, self.dev_root, reads).run()

    def _port_states_job(self, reads: GuardedReads) -> PortStates:
        return port_states_of(self.sysfs_root, listed_hcas(self.sysfs_root), reads,
                              self._stuck.owners())

    def _glance_job(self, reads: GuardedReads) -> Glance:
        def names(path: str) -> tuple[str, ...]:
            try:
                return tuple(sorted(reads.listdir(path)))
            except ReadStalled:
                raise
            except OSError:
                return ()

        classes = os.path.join(self.sysfs_root, "class")
        listings = (names(os.path.join(classes, "infiniband")),
                    names(os.path.join(classes, "infiniband_verbs")),
                    names(os.path.join(classes, "infiniband_mad")),
                    names(os.path.join(self.dev_root, "infiniband")))
        return Glance(listings, self._port_states_job(reads))

    def _port_counters_job(self) -> Callable[[GuardedReads], PortCounters]:
        inventory = self.inventory
        wanted = ([] if inventory is None
                  else [(h.name, p.number) for h in inventory.hcas for p in h.ports])

        def job(reads: GuardedReads) -> PortCounters:
            if not wanted:
                return {}
            dirs = {shown: raw for shown, raw in listed_hcas(self.sysfs_root)}
            found: PortCounters = {}
            for hca, port in wanted:
                dirname = dirs.get(hca)
                if dirname is None:
                    continue
                reads.working_on(hca)
                found[(hca, port)] = port_counters_of(self.sysfs_root, dirname, port, reads)
            reads.working_on(None)
            return found

        return job

    def _netns_job(self, reads: GuardedReads) -> str | None:
        return Discovery(self.sysfs_root, os.devnull, reads).netns_mode()

    # -- sync forms, for callers without an event loop (the tools) ----------------------

    def discover_sync(self) -> NodeInventory:
        inventory, _ = _supervise(self._discovery_job, self._stuck, self.deadline,
                                  "rdma-hca-discover", log_stalls=self._log_stalls)
        self.inventory = inventory
        return inventory

    def port_states_sync(self) -> PortStates:
        states, _ = _supervise(self._port_states_job, self._stuck, self.deadline,
                               "rdma-hca-ports")
        return states

    def port_counters_sync(self) -> PortCounters:
        counters, _ = _supervise(self._port_counters_job(), self._stuck, self.deadline,
                                 "rdma-hca-counters")
        return counters

    def netns_mode_sync(self) -> str | None:
        mode, _ = _supervise(self._netns_job, self._stuck, self.deadline, "rdma-hca-netns")
        return mode

    # -- what the event loop awaits -----------------------------------------------------

    async def discover(self) -> NodeInventory:
        """Full discovery; never raises for a stuck file (its HCA's ports read UNKNOWN and
        ``stalled`` names it); raises DiscoveryFailed only when a resource ran out."""
        inventory, _ = await _supervise_async(self._discovery_job, self._stuck,
                                              self.deadline, "rdma-hca-discover")
        self.inventory = inventory
        return inventory

    async def port_states(self) -> PortStates:
        """``(hca, port) -> (state, phys_state)`` of every HCA in ``class/infiniband``; a
        port whose file is stuck, or whose HCA has a stuck file, reads UNKNOWN."""
        states, _ = await _supervise_async(self._port_states_job, self._stuck,
                                           self.deadline, "rdma-hca-ports")
        return states

    async def glance(self) -> Glance:
        """The listings and port states the health poll compares, in one call; raises
        ReadStalled while one of the listings hangs."""
        glance, _ = await _supervise_async(self._glance_job, self._stuck, self.deadline,
                                           "rdma-hca-glance")
        return glance

    async def port_counters(self) -> PortCounters:
        """Counters of every port of the last inventory (empty before the first)."""
        counters, _ = await _supervise_async(self._port_counters_job(), self._stuck,
                                             self.deadline, "rdma-hca-counters")
        return counters

    async def netns_mode(self) -> str | None:
        """ib_core's network-namespace mode: "shared", "exclusive" or None."""
        mode, _ = await _supervise_async(self._netns_job, self._stuck, self.deadline,
                                         "rdma-hca-netns")
        return mode


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
