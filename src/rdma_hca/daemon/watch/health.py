"""Keeping the pools' view of the node current: port state, HCAs and device nodes.

A full discovery reads thousands of small files (GID tables), so it runs only when
something changed. What runs every poll is a cheap fingerprint: the HCA names, each
port's state and physical state, and the names of the verbs and /dev entries. A link
event on one of the HCAs' netdevs (rtnetlink) wakes the poll at once, so a port
that goes down is noticed in milliseconds where netlink is available and within one
poll interval where it is not.

Every read runs off the event loop with a deadline (the machine reader's job). An HCA
whose read passes the deadline comes back with its ports UNKNOWN, so its devices count
as unhealthy under ``unhealthyWhen`` until it answers again. A discovery that
fails for want of file descriptors or memory keeps the last known state: "no HCAs"
would turn every device Unhealthy for a reason that has nothing to do with the HCAs.

Events are coalesced: a burst of link events costs one re-read at its start and one
at its end, and the full re-read that follows a port change waits until the port has
been quiet for a moment, so a flapping link costs little CPU and few stream updates.
An HCA whose ports flap is held down (``flaps.py``): every inventory handed out names
the HCAs held, and the hold's end is handed out as a new inventory, at once.

Who follows the node: the pools' views are updated in step (pure computation, and a
pool's devices must be current the moment a pass returns); everything else that does
I/O with an inventory (the CDI spec, the DRA driver's slices) follows
:attr:`HealthWatcher.inventories` in a task of its own (:meth:`HealthWatcher.follow`),
so a follower stuck on a hung filesystem or a slow API server delays no other
follower, and not the watcher either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Protocol

from rdma_hca.daemon.watch.flaps import FlapHold
from rdma_hca.daemon.watch.machine import MachineReader, failure_reason
from rdma_hca.kit.aio import wait_event
from rdma_hca.kit.broadcast import Broadcast
from rdma_hca.kit.sayonce import Latch, Once
from rdma_hca.node import netlink
from rdma_hca.node.deadline_reader import PortCounters
from rdma_hca.node.file_reads import ReadStalled
from rdma_hca.node.model import NodeInventory

log = logging.getLogger(__name__)

Fingerprint = tuple[object, ...]
EventSource = Callable[[], AsyncIterator[netlink.NetdevEvent]]
Follower = Callable[[NodeInventory], Awaitable[None]]

COALESCE_SECONDS = 0.3  # link events closer than this make one re-read
SETTLE_SECONDS = 0.5  # the full re-read after a port change waits for this much quiet
COUNTER_SECONDS = 5.0  # how often the counter cache is re-read while someone scrapes
SCRAPE_IDLE_SECONDS = 300.0  # after this long without a scrape, counters are not re-read


async def _netlink_events() -> AsyncIterator[netlink.NetdevEvent]:
    try:
        sock = netlink.open_socket()
    except OSError as exc:
        log.info("rtnetlink events unavailable (%s); port state is polled only", exc)
        return
    async for event in netlink.events(sock):
        yield event


def _report_end(task: asyncio.Task[None]) -> None:
    # Without events the polls still see every change, only later: say so, loudly.
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        assert exc is not None
        log.error("the rtnetlink watcher failed; port state is polled only",
                  exc_info=(type(exc), exc, exc.__traceback__))


class View(Protocol):
    """What follows the node in step with the watcher (a pool's view: computation only)."""

    async def update(self, inventory: NodeInventory) -> object: ...


class HealthWatcher:
    """``poll_seconds`` and ``flap_hold_seconds`` have no default here: the settings
    declare them. ``clock`` is the flap hold's (tests move it by hand)."""

    def __init__(
        self,
        runtimes: Sequence[View],
        reader: MachineReader,
        *,
        poll_seconds: float,
        flap_hold_seconds: float,
        full_seconds: float = 300.0,
        events: EventSource | None = _netlink_events,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runtimes = list(runtimes)
        self.reader = reader
        self.poll_seconds = poll_seconds
        self.flaps = FlapHold(flap_hold_seconds, clock=clock)
        self.full_seconds = full_seconds
        self.events = events
        # Every published inventory is news: each is a new object, and comparing two
        # deeply (thousands of GIDs) would cost more than what a follower does with it.
        self.inventories: Broadcast[NodeInventory | None] = Broadcast(
            None, same=lambda a, b: a is b)
        self.counters: PortCounters = {}
        # Awaited after each counter refresh (the metrics server makes its page of them
        # then, on the refresh's time, not on the next scrape's).
        self.on_counters: Callable[[], Awaitable[None]] | None = None
        self.state_changes: dict[tuple[str, int], int] = {}
        self.discovery_errors: dict[str, int] = {}
        self.last_pass: float | None = None  # unix time of the last completed pass
        self.events_seen = 0
        self.passes = 0
        self._poke = asyncio.Event()
        self._full_requested = False
        self._full_at: float | None = None
        self._fingerprint: Fingerprint = ()
        self._warned = Once()
        self._discovery_failing = Latch()
        self._scraped_at: float | None = None
        self._counters_at: float | None = None
        self._netdevs_of: NodeInventory | None = None
        self._netdev_names: frozenset[str] = frozenset()

    @property
    def inventory(self) -> NodeInventory | None:
        return self.inventories.value

    async def follow(self, follower: Follower, seen: int = 0) -> None:
        """Hand ``follower`` every inventory newer than generation ``seen``, the newest one
        each time, until cancelled.

        Run as a task of its own: while it works, newer inventories replace each other
        and it gets the newest one next; the watcher never waits for it.
        """
        async for inventory in self.inventories.follow(seen):
            assert inventory is not None
            await follower(inventory)

    def poke(self, full: bool = False) -> None:
        """Re-read port state now instead of at the next poll (everything, with ``full``)."""
        self._full_requested = self._full_requested or full
        self._poke.set()

    def want_counters(self) -> None:
        """Someone read the counters: keep the cache fresh (counters cost many reads)."""
        self._scraped_at = asyncio.get_running_loop().time()

    async def fingerprint(self) -> Fingerprint:
        glance = await self.reader.glance()
        names, verbs, mad, dev = glance.listings
        return (names, tuple(sorted(glance.states.items())), verbs, mad, dev,
                tuple(sorted(self.reader.stuck)))

    async def _fingerprint_or_none(self) -> Fingerprint:
        """The fingerprint, or () when it cannot be read now (stuck, or out of fds)."""
        try:
            return await self.fingerprint()
        except ReadStalled:
            return ()
        except Exception as exc:
            if failure_reason(exc) is None:
                raise
            return ()

    async def refresh(self) -> NodeInventory:
        """Discover the node and hand the result to every pool."""
        before = await self._fingerprint_or_none()
        inventory = await self._discover()
        # The node may change while discovery reads it; then the inventory may hold the
        # old or the new state. Storing no fingerprint makes the next pass look again
        # (at once: the next poll may be far), where storing the older one could match
        # the files and hide a stale inventory.
        after = await self._fingerprint_or_none()
        if after == before:
            self._fingerprint = before
        elif before and after and before[0] == after[0] and before[2:] == after[2:]:
            # Only port states moved (a flapping link): no states at all are remembered,
            # so the next pass applies the current ones at once, the quick way, and the
            # full re-read follows once they settle. A full re-read now could find them
            # moving again, and a flapping port's last state would wait for it.
            self._fingerprint = (after[0], (), *after[2:])
        else:
            self._fingerprint = ()
        if before and after and after != before:
            self._poke.set()  # (an unreadable fingerprint waits for the next poll instead)
        for w in inventory.warnings:
            if self._warned.first(w):
                log.warning("sysfs: %s", w)
        await self._publish(inventory)
        return self.inventory or inventory

    async def _discover(self) -> NodeInventory:
        last = self.inventory
        try:
            inventory = await self.reader.discover()
        except Exception as exc:
            reason = failure_reason(exc)
            if reason is None:
                raise
            # A new dict, never an edit: a scrape may be rendering the old one on a thread.
            self.discovery_errors = {**self.discovery_errors,
                                     reason: self.discovery_errors.get(reason, 0) + 1}
            if self._discovery_failing.set(reason):
                log.error("discovery failed (%s: %s); keeping the last known state of the "
                          "node until it works again", reason, exc)
            return last or NodeInventory((), None, None)
        if self._discovery_failing.clear():
            log.info("discovery works again")
        return inventory

    async def _publish(self, inventory: NodeInventory) -> None:
        """Hand an inventory to every pool, then to the followers (who do not hold us)."""
        self._count_changes(inventory)
        inventory = self._with_holds(inventory)
        # The loop gets a turn between the steps: at 256 HCAs each costs it a millisecond
        # or two, and an Allocate or a probe waiting behind all of them would wait for
        # their sum.
        for runtime in self.runtimes:
            await asyncio.sleep(0)
            await runtime.update(inventory)
        self.inventories.publish(inventory)

    def _with_holds(self, inventory: NodeInventory) -> NodeInventory:
        """The inventory naming the HCAs held for flapping from now on."""
        held = self.flaps.observe(inventory)
        before = self.inventory.held if self.inventory is not None else frozenset()
        for name in sorted(held - before):
            log.warning("%s: its ports changed state %d times within %g s; it counts as down "
                        "until a port stays up for %g s (flapHoldSeconds)", name,
                        self.flaps.flaps_seen(name), self.flaps.window,
                        self.flaps.hold_seconds, extra={"hca": name})
        for name in sorted(before - held):
            log.info("%s: no longer held for flapping", name, extra={"hca": name})
        return inventory if held == inventory.held else replace(inventory, held=held)

    async def release_holds(self) -> bool:
        """Hand out the current inventory again when a flap hold ended; True when one did.

        Nothing on the node changes when a hold ends, so no poll would notice it.
        """
        inventory = self.inventory
        if inventory is None or self.flaps.held() == inventory.held:
            return False
        await self._publish(inventory)
        return True

    def _count_changes(self, inventory: NodeInventory) -> None:
        if self.inventory is None:
            return
        before = {(h.name, p.number): p.is_up for h in self.inventory.hcas for p in h.ports}
        changed = [(h.name, p.number) for h in inventory.hcas for p in h.ports
                   if before.get((h.name, p.number), p.is_up) != p.is_up]
        moved = set(changed)
        for h in inventory.hcas if moved else ():
            for p in h.ports:
                if (h.name, p.number) in moved:
                    log.info("%s port %d is %s (%s/%s)", h.name, p.number,
                             "up" if p.is_up else "down", p.state, p.phys_state,
                             extra={"hca": h.name, "port": p.number})
        if changed:
            # A new dict, never an edit: a scrape may be rendering the old one on a thread.
            counts = dict(self.state_changes)
            for key in changed:
                counts[key] = counts.get(key, 0) + 1
            self.state_changes = counts

    def _only_states_differ(self, fingerprint: Fingerprint) -> bool:
        old = self._fingerprint
        return (self.inventory is not None and len(old) == len(fingerprint)
                and old[0] == fingerprint[0] and old[2:5] == fingerprint[2:5])

    async def _apply_port_states(self, fingerprint: Fingerprint) -> None:
        assert self.inventory is not None
        states = dict(fingerprint[1])  # type: ignore[call-overload]
        hcas = tuple(
            replace(h, ports=tuple(
                replace(p, state=states[(h.name, p.number)][0],
                        phys_state=states[(h.name, p.number)][1])
                if (h.name, p.number) in states else p
                for p in h.ports))
            for h in self.inventory.hcas
        )
        await self._publish(replace(self.inventory, hcas=hcas))

    async def run(self) -> None:
        if self.inventory is None:
            await self.refresh()
        watch = (asyncio.create_task(self._watch_links(), name="netlink")
                 if self.events is not None else None)
        if watch is not None:
            watch.add_done_callback(_report_end)
        loop = asyncio.get_running_loop()
        last_full = loop.time()
        try:
            while True:
                await wait_event(self._poke, self._next_wait(loop.time()))
                self._poke.clear()
                now = loop.time()
                due = (self._full_requested or now - last_full >= self.full_seconds
                       or (self._full_at is not None and now >= self._full_at))
                self._full_requested = False
                try:
                    if await self._check(due):
                        last_full = loop.time()
                        self._full_at = None
                    await self.release_holds()
                    await self._refresh_counters(loop.time())
                except Exception:
                    # Whatever went wrong, the watcher must outlive it: a dead watcher
                    # would freeze the device list in whatever state it had.
                    log.exception("health check failed; trying again at the next poll")
                else:
                    self.last_pass = time.time()
                    self.passes += 1
        finally:
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch

    def _next_wait(self, now: float) -> float:
        wait = self.poll_seconds
        if self._full_at is not None:
            wait = min(wait, self._full_at - now)
        release = self.flaps.next_release()
        if release is not None:
            wait = min(wait, release - self.flaps.clock())
        return max(0.0, wait)

    async def _check(self, due: bool) -> bool:
        """One poll; returns True when it ran a full discovery."""
        fingerprint = await self._fingerprint_or_none()
        if (fingerprint and fingerprint != self._fingerprint
                and self._only_states_differ(fingerprint)):
            # Publish the new port states first: a dead port must reach the kubelet
            # now, not after a full pass over thousands of GID files. The rest (rates,
            # GIDs) is re-read once the port has been quiet for a moment.
            await self._apply_port_states(fingerprint)
            self._fingerprint = fingerprint
            self._full_at = asyncio.get_running_loop().time() + SETTLE_SECONDS
            return False
        if due or fingerprint != self._fingerprint:
            await self.refresh()
            return True
        return False

    async def refresh_counters(self) -> None:
        """Re-read every port's counters into the cache the scrapes serve."""
        self._counters_at = asyncio.get_running_loop().time()
        self.counters = await self.reader.port_counters()
        if self.on_counters is not None:
            await self.on_counters()

    async def _refresh_counters(self, now: float) -> None:
        idle = self._scraped_at is None or now - self._scraped_at > SCRAPE_IDLE_SECONDS
        if self._counters_at is not None and (idle or now - self._counters_at < COUNTER_SECONDS):
            return
        await self.refresh_counters()

    def _netdevs(self) -> frozenset[str]:
        # Asked once per event, and a flood of events must stay cheap: computed once
        # per inventory.
        inv = self.inventory
        if inv is None:
            return frozenset()
        if self._netdevs_of is not inv:
            self._netdevs_of = inv
            self._netdev_names = frozenset(n for h in inv.hcas for n in h.netdevs)
        return self._netdev_names

    async def _watch_links(self) -> None:
        assert self.events is not None
        loop = asyncio.get_running_loop()
        quiet_until = 0.0
        pending: asyncio.TimerHandle | None = None
        full = False

        def fire() -> None:
            nonlocal pending, full
            pending = None
            self.poke(full=full)
            full = False

        try:
            async for event in self.events():
                if event.ifname is not None and event.ifname not in self._netdevs():
                    continue
                self.events_seen += 1
                log.debug("%s event on %s", event.kind, event.ifname or "a netdev")
                # An address change changes the RoCE GIDs: only a full pass sees those.
                full = full or event.kind == "address"
                now = loop.time()
                if pending is None and now >= quiet_until:
                    fire()  # the first event of a burst: look at once
                elif pending is None:
                    # Inside a burst: one more look when it has been quiet a moment,
                    # so the final state is always seen.
                    pending = loop.call_at(quiet_until, fire)
                quiet_until = now + COALESCE_SECONDS
        except OSError as exc:
            log.info("rtnetlink events stopped (%s); port state is polled only", exc)
        finally:
            if pending is not None:
                pending.cancel()
