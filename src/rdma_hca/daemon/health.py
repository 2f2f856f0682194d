"""Keeping the pools' view of the node current: port state, HCAs and device nodes.

A full discovery reads thousands of small files (GID tables), so it runs only when
something changed. What runs every poll is a cheap fingerprint: the HCA names, each
port's state and physical state, and the names of the verbs and /dev entries. A link
event on one of the HCAs' netdevs (rtnetlink) wakes the poll at once, so a port
that goes down is noticed in milliseconds where netlink is available and within one
poll interval where it is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from rdma_hca.daemon.runtime import PoolRuntime
from rdma_hca.node import netlink
from rdma_hca.node.model import NodeInventory
from rdma_hca.node.sysfs import discover_node, read_port_states

log = logging.getLogger("rdma_hca.health")

Fingerprint = tuple[object, ...]


def _names(path: str) -> tuple[str, ...]:
    try:
        return tuple(sorted(os.listdir(path)))
    except OSError:
        return ()


class HealthWatcher:
    def __init__(
        self,
        runtimes: Sequence[PoolRuntime],
        sysfs_root: str,
        dev_root: str,
        *,
        poll_seconds: float = 1.0,
        full_seconds: float = 300.0,
        netlink: bool = True,
        on_inventory: Callable[[NodeInventory], Awaitable[None]] | None = None,
    ) -> None:
        self.runtimes = list(runtimes)
        self.sysfs_root = sysfs_root
        self.dev_root = dev_root
        self.poll_seconds = poll_seconds
        self.full_seconds = full_seconds
        self.netlink = netlink
        self.on_inventory = on_inventory
        self.inventory: NodeInventory | None = None
        self._poke = asyncio.Event()
        self._full_requested = False
        self._fingerprint: Fingerprint = ()
        self._warned: set[str] = set()

    def poke(self, full: bool = False) -> None:
        """Re-read port state now instead of at the next poll (everything, with ``full``)."""
        self._full_requested = self._full_requested or full
        self._poke.set()

    def fingerprint(self) -> Fingerprint:
        names = _names(os.path.join(self.sysfs_root, "class", "infiniband"))
        states = read_port_states(self.sysfs_root, names)
        return (
            names,
            tuple(sorted(states.items())),
            _names(os.path.join(self.sysfs_root, "class", "infiniband_verbs")),
            _names(os.path.join(self.sysfs_root, "class", "infiniband_mad")),
            _names(os.path.join(self.dev_root, "infiniband")),
        )

    async def refresh(self) -> NodeInventory:
        """Discover the node and hand the result to every pool."""
        before = self.fingerprint()
        inventory = await asyncio.to_thread(discover_node, self.sysfs_root, self.dev_root)
        # The node may change while discovery reads it; then the inventory may hold the
        # old or the new state. Storing no fingerprint makes the next poll look again,
        # where storing the older one could match the file and hide a stale inventory.
        self._fingerprint = before if self.fingerprint() == before else ()
        for w in inventory.warnings:
            if w not in self._warned:
                self._warned.add(w)
                log.warning("sysfs: %s", w)
        await self._publish(inventory)
        return inventory

    async def _publish(self, inventory: NodeInventory) -> None:
        """Hand an inventory to every pool, then to whoever else follows the node."""
        self.inventory = inventory
        for runtime in self.runtimes:
            await runtime.update(inventory)
        if self.on_inventory is not None:
            await self.on_inventory(inventory)

    def _only_states_differ(self, fingerprint: Fingerprint) -> bool:
        old = self._fingerprint
        return (self.inventory is not None and len(old) == len(fingerprint)
                and old[0] == fingerprint[0] and old[2:] == fingerprint[2:])

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
        netlink_task = (
            asyncio.create_task(self._watch_links(), name="netlink") if self.netlink else None
        )
        loop = asyncio.get_running_loop()
        last_full = loop.time()
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._poke.wait(), self.poll_seconds)
                self._poke.clear()
                due = self._full_requested or loop.time() - last_full >= self.full_seconds
                self._full_requested = False
                try:
                    if await self._check(due):
                        last_full = loop.time()
                except Exception:
                    # Whatever went wrong, the watcher must outlive it: a dead watcher
                    # would freeze the device list in whatever state it had.
                    log.exception("health check failed; trying again at the next poll")
        finally:
            if netlink_task is not None:
                netlink_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await netlink_task

    async def _check(self, due: bool) -> bool:
        """One poll; returns True when it ran a full discovery."""
        fingerprint = self.fingerprint()
        if fingerprint != self._fingerprint and self._only_states_differ(fingerprint):
            # Publish the new port states first: a dead port must reach the kubelet
            # now, not after a full pass over thousands of GID files.
            await self._apply_port_states(fingerprint)
            due = True  # then re-read the rest (rates, GIDs) at once
        if due or fingerprint != self._fingerprint:
            await self.refresh()
            return True
        return False

    def _netdevs(self) -> set[str]:
        if self.inventory is None:
            return set()
        return {n for h in self.inventory.hcas for n in h.netdevs}

    async def _watch_links(self) -> None:
        try:
            sock = netlink.open_socket()
        except OSError as exc:
            log.info("rtnetlink events unavailable (%s); port state is polled only", exc)
            return
        try:
            async for event in netlink.events(sock):
                if event.ifname is not None and event.ifname not in self._netdevs():
                    continue
                log.debug("%s event on %s", event.kind, event.ifname or "a netdev")
                # An address change changes the RoCE GIDs: only a full pass sees those.
                self.poke(full=event.kind == "address")
        except OSError as exc:
            log.info("rtnetlink events stopped (%s); port state is polled only", exc)
