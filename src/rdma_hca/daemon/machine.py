"""What the daemon reads of the machine, every read off the event loop with a deadline.

``MachineReader`` is the surface the health watcher uses. ``SysfsReader`` provides it
over the node wing's sysfs functions, each call on a thread of :class:`OffLoop`, keyed
by HCA so that one HCA stuck in its driver leaves the others readable.
"""

from __future__ import annotations

import errno
import os
from typing import Protocol

from rdma_hca.daemon.offloop import OffLoop
from rdma_hca.node.model import NodeInventory
from rdma_hca.node.sysfs import discover_node, read_port_counters, read_port_states

PortStates = dict[tuple[str, int], tuple[str, str]]
PortCounters = dict[tuple[str, int], dict[str, int]]

DISCOVERY_KEY = "discovery of the node"


class MachineReader(Protocol):
    @property
    def stalls_total(self) -> int: ...

    @property
    def stuck(self) -> frozenset[str]: ...

    async def discover(self) -> NodeInventory: ...

    async def port_states(self) -> PortStates: ...

    async def port_counters(self) -> PortCounters: ...


class DiscoveryFailed(Exception):
    """Discovery could not read the machine for want of file descriptors or memory."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def failure_reason(exc: BaseException) -> str | None:
    """"fd" or "memory" when ``exc`` says the process ran out of them, else None."""
    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, OSError):
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return "fd"
        if exc.errno == errno.ENOMEM:
            return "memory"
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) else None


class SysfsReader:
    """The machine read through ``node.sysfs``, off the loop, with deadlines."""

    def __init__(self, sysfs_root: str, dev_root: str, *, deadline: float) -> None:
        self.sysfs_root = sysfs_root
        self.dev_root = dev_root
        self.offloop = OffLoop(deadline)

    @property
    def stalls_total(self) -> int:
        return self.offloop.stalls_total

    @property
    def stuck(self) -> frozenset[str]:
        return self.offloop.stuck - {DISCOVERY_KEY}

    def _probe_fds(self) -> None:
        # Discovery reads a missing directory as "no HCAs"; an fd shortage would read
        # the same way, so find out first whether one more file can be opened at all.
        try:
            os.close(os.open(self.sysfs_root, os.O_RDONLY | os.O_DIRECTORY))
        except OSError as exc:
            reason = failure_reason(exc)
            if reason is not None:
                raise DiscoveryFailed(reason, f"cannot open {self.sysfs_root}: {exc}") from exc

    async def discover(self) -> NodeInventory:
        def work() -> NodeInventory:
            self._probe_fds()
            inventory = discover_node(self.sysfs_root, self.dev_root)
            # Discovery reports unreadable files as warnings; running out of fds or
            # memory half-way is no fact about the node, so the whole pass is void.
            for w in inventory.warnings:
                for code, reason in ((errno.EMFILE, "fd"), (errno.ENFILE, "fd"),
                                     (errno.ENOMEM, "memory")):
                    if f"({os.strerror(code)})" in w:
                        raise DiscoveryFailed(reason, w)
            return inventory

        return await self.offloop.run(DISCOVERY_KEY, work)

    def _hca_names(self) -> list[str]:
        try:
            return sorted(os.listdir(os.path.join(self.sysfs_root, "class", "infiniband")))
        except OSError:
            return []

    async def port_states(self) -> PortStates:
        names = await self.offloop.run("class/infiniband", self._hca_names)
        per_hca = await self.offloop.each(
            names, lambda n: read_port_states(self.sysfs_root, [n]), partial=True)
        return {k: v for states in per_hca.values() for k, v in states.items()}

    async def port_counters(self) -> PortCounters:
        names = await self.offloop.run("class/infiniband", self._hca_names)

        def counters(name: str) -> PortCounters:
            ports_dir = os.path.join(self.sysfs_root, "class", "infiniband", name, "ports")
            try:
                ports = [int(p) for p in os.listdir(ports_dir) if p.isdigit()]
            except OSError:
                return {}
            return {(name, p): read_port_counters(self.sysfs_root, name, p) for p in ports}

        per_hca = await self.offloop.each(names, counters, partial=True)
        return {k: v for c in per_hca.values() for k, v in c.items()}
