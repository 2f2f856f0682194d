"""What the daemon reads of the machine: the surface of the node wing's reader.

``node.deadline_reader.NodeReader`` runs every read off the event loop with a deadline; the
health watcher takes anything with this surface, so tests can hand it a reader that
holds or fails on purpose.
"""

from __future__ import annotations

import errno
from typing import Protocol

from rdma_hca.node.deadline_reader import Glance, PortCounters
from rdma_hca.node.file_reads import DiscoveryFailed
from rdma_hca.node.model import NodeInventory
from rdma_hca.node.port_polls import PortStates


class MachineReader(Protocol):
    @property
    def stalls_total(self) -> int: ...

    @property
    def stuck(self) -> frozenset[str]: ...

    async def discover(self) -> NodeInventory: ...

    async def port_states(self) -> PortStates: ...

    async def glance(self) -> Glance: ...

    async def port_counters(self) -> PortCounters: ...


_REASONS = {errno.EMFILE: "fd", errno.ENFILE: "fd", errno.ENOMEM: "memory"}


def failure_reason(exc: BaseException) -> str | None:
    """Why discovery could not run ("fd", "memory", "threads"), or None for other errors.

    Such a failure says nothing about the node (the last known state stands); anything
    else is a bug and is raised.
    """
    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, OSError) and exc.errno in _REASONS:
        return _REASONS[exc.errno]
    if isinstance(exc, DiscoveryFailed):
        cause = exc.__cause__
        if cause is not None and cause is not exc:
            found = failure_reason(cause)
            if found is not None:
                return found
        text = str(exc)
        for word, reason in (("memory", "memory"), ("thread", "threads"),
                             ("file descriptor", "fd")):
            if word in text:
                return reason
        return "other"
    return None
