"""Listening for LLDP on every RoCE HCA port: the neighbours, live, for whoever follows.

One raw socket per netdev a RoCE port carries (on a bond, per member: the frames come in
there), read by the event loop when it is readable. What the wire sends is bounded before
it costs anything: at most :data:`READS_PER_WAKEUP` frames per wakeup (a flood never
keeps the loop), at most :data:`FRAMES_PER_SECOND` frames a second per netdev are parsed
(a token bucket of :data:`BURST`; the rest are read and counted, not parsed), each read
is capped at the largest LLDP frame, and the socket's receive buffer is small (the kernel
drops what does not fit). A switch sends one frame per 30 s.

The neighbours (``neighbours``, a :class:`~rdma_hca.kit.broadcast.Broadcast` of
``PortNeighbour`` tuples, sorted by HCA and port) change only when a port's neighbour
does (``fabric.table``): the DRA driver and /metrics follow it. ``every_port`` is the
same with an entry of empty chassis ID for each port listened on that heard nothing
(``contract.fabric.with_silent``): the Node writer follows that one, for ``doctor``.

InfiniBand ports have no LLDP and are left out. Without CAP_NET_RAW the first socket
is refused: one line says LLDP is off and why, and nothing else changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rdma_hca.contract.fabric import PortNeighbour, with_silent
from rdma_hca.daemon.fabric.rawsocket import open_lldp_socket
from rdma_hca.daemon.fabric.table import NeighbourTable, PortKey
from rdma_hca.kit.aio import wait_event
from rdma_hca.kit.broadcast import Broadcast
from rdma_hca.kit.offloop import OffLoop, Stalled
from rdma_hca.kit.sayonce import Once
from rdma_hca.node import bonds
from rdma_hca.node.lldp import MAX_FRAME, OVERSIZED, REASONS, LldpError, parse_frame
from rdma_hca.node.model import LinkLayer, NodeInventory

log = logging.getLogger(__name__)

FRAMES_PER_SECOND = 10.0  # parsed per netdev, after the burst: a switch sends 1 per 30 s
BURST = 20.0  # a switch's fast start, or several agents on one link
READS_PER_WAKEUP = 64
RATE = "rate"  # the drop reason of a frame beyond the token bucket
DROP_REASONS = (RATE, *REASONS)
NO_CAPABILITY = ("LLDP is off: the daemon may not open a raw socket ({error}); it needs the "
                 "CAP_NET_RAW capability (the chart adds it with fabric.lldp: true). "
                 "Everything else works without it")

Opener = Callable[[str], socket.socket]


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float

    def take(self, now: float, rate: float, burst: float) -> bool:
        self.tokens = min(burst, self.tokens + (now - self.at) * rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(frozen=True, slots=True)
class LldpStats:
    """What /metrics and the status show of the listener."""

    off: str | None  # why it does not listen (no CAP_NET_RAW), or None
    netdevs: tuple[str, ...]  # listened on now
    ports: Mapping[str, PortKey]  # netdev -> the HCA port it carries
    frames: Mapping[str, int]  # per netdev, every frame read
    dropped: Mapping[str, int]  # per reason (DROP_REASONS)
    neighbours: tuple[PortNeighbour, ...]
    last_frame: Mapping[PortKey, float]  # on the listener's clock
    holds: int
    now: float  # the listener's clock when the record was taken


@dataclass(slots=True)
class _Counts:
    frames: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))


class LldpListener:
    """``follow(inventory)`` sets the netdevs listened on; ``run()`` keeps the TTLs and
    the holds; ``receive(netdev, frame)`` is the per-frame path (the sockets' and a
    replay's)."""

    def __init__(self, sysfs_root: str, *, hold_seconds: float, files: OffLoop,
                 opener: Opener = open_lldp_socket,
                 clock: Callable[[], float] = time.monotonic,
                 rate: float = FRAMES_PER_SECOND, burst: float = BURST) -> None:
        self.sysfs_root = sysfs_root
        self.files = files
        self.opener = opener
        self.clock = clock
        self.rate = rate
        self.burst = burst
        self.table = NeighbourTable(hold_seconds, clock=clock)
        self.neighbours: Broadcast[tuple[PortNeighbour, ...]] = Broadcast(())
        # The neighbours and the ports listened on that heard nothing (no switch: never
        # for the DRA attributes nor the fabric block).
        self.every_port: Broadcast[tuple[PortNeighbour, ...]] = Broadcast(())
        self.off: str | None = None
        self._ports: dict[str, PortKey] = {}
        self._wanted: tuple[tuple[str, int, str], ...] | None = None
        self._sockets: dict[str, socket.socket] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._counts = _Counts()
        self._buffer = bytearray(MAX_FRAME)
        self._wake = asyncio.Event()
        self._said = Once(limit=256)

    # --- the netdevs ------------------------------------------------------------------

    async def follow(self, inventory: NodeInventory) -> None:
        """Listen on the netdevs of the inventory's RoCE ports (a bond's members)."""
        wanted = tuple((h.name, p.number, n) for h in inventory.hcas for p in h.ports
                       if p.link_layer is LinkLayer.ETHERNET for n in p.netdevs)
        if wanted != self._wanted:
            # Keyed by path: the stuck-call bookkeeping is shared with the daemon's files.
            paths = {os.path.join(self.sysfs_root, "class", "net", n): n
                     for _, _, n in wanted}
            try:
                found = await self.files.each(
                    paths, lambda path: bonds.members(self.sysfs_root, paths[path]))
            except Stalled as exc:
                log.warning("LLDP: cannot tell the bonds' members (%s); listening where "
                            "it did until sysfs answers", exc)
                return
            lower = {paths[path]: names for path, names in found.items()}
            ports: dict[str, PortKey] = {}
            for hca, port, netdev in wanted:
                for member in lower[netdev] or (netdev,):
                    ports.setdefault(member, (hca, port))
            self._wanted = wanted
            self._ports = ports
            self.table.set_ports(ports)
            for gone in [n for n in self._sockets if n not in ports]:
                self._close(gone)
            for gone in [n for n in self._counts.frames if n not in ports]:
                del self._counts.frames[gone]
        self._open_missing()
        self.settle()
        self._wake.set()

    def _open_missing(self) -> None:
        if self.off is not None:
            return
        loop = asyncio.get_running_loop()
        for netdev in self._ports:
            if netdev in self._sockets:
                continue
            try:
                sock = self.opener(netdev)
            except PermissionError as exc:
                self.off = NO_CAPABILITY.format(error=exc.strerror or exc)
                log.warning("%s", self.off)
                self.close()
                return
            except OSError as exc:
                why = ("it is not in this network namespace" if exc.errno == errno.ENODEV
                       else exc.strerror or str(exc))
                if self._said.first(f"open {netdev} {exc.errno}"):
                    log.warning("LLDP: not listening on %s: %s", netdev, why)
                continue
            self._sockets[netdev] = sock
            self._counts.frames.setdefault(netdev, 0)
            loop.add_reader(sock.fileno(), self._readable, netdev)
            log.info("LLDP: listening on %s (%s port %d)", netdev, *self._ports[netdev])

    def _close(self, netdev: str) -> None:
        sock = self._sockets.pop(netdev)
        self._buckets.pop(netdev, None)
        with contextlib.suppress(RuntimeError):  # no loop any more: nothing reads it
            asyncio.get_running_loop().remove_reader(sock.fileno())
        sock.close()

    def close(self) -> None:
        for netdev in list(self._sockets):
            self._close(netdev)

    # --- frames -----------------------------------------------------------------------

    def _readable(self, netdev: str) -> None:
        sock = self._sockets.get(netdev)
        if sock is None:
            return
        for _ in range(READS_PER_WAKEUP):
            try:
                size = sock.recv_into(self._buffer, 0, socket.MSG_TRUNC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # ENETDOWN: the link went down, or the netdev went away (a driver reload)
                # and the socket is bound to nothing now. Opened again at the next
                # inventory (a port's state change is one), on the netdev of that name.
                if self._said.first(f"read {netdev} {exc.errno}"):
                    log.info("LLDP: reading %s: %s; listening again when the port changes",
                             netdev, exc.strerror or exc)
                self._close(netdev)
                self.settle()
                return
            self.receive(netdev, memoryview(self._buffer)[:size], size)

    def receive(self, netdev: str, frame: bytes | memoryview, size: int | None = None) -> None:
        """One frame read on ``netdev``; ``size`` its length on the wire when the read was
        cut (a frame larger than the buffer)."""
        counts = self._counts
        counts.frames[netdev] = counts.frames.get(netdev, 0) + 1
        now = self.clock()
        bucket = self._buckets.get(netdev)
        if bucket is None:
            bucket = self._buckets[netdev] = _Bucket(self.burst, now)
        if not bucket.take(now, self.rate, self.burst):
            counts.dropped[RATE] += 1
            return
        if size is not None and size > MAX_FRAME:
            counts.dropped[OVERSIZED] += 1
            return
        try:
            parsed = parse_frame(frame)
        except LldpError as exc:
            counts.dropped[exc.reason] += 1
            if self._said.first(f"drop {netdev} {exc.reason}"):
                log.info("LLDP on %s: %s (counted from now on, not logged)", netdev, exc)
            return
        self.table.heard(netdev, parsed)
        self.settle()
        self._wake.set()  # the next deadline may have moved

    # --- the table's clock ------------------------------------------------------------

    def settle(self) -> None:
        """Publish what the table says now (what the clock and the frames have changed)."""
        if self.neighbours.publish(self.table.settle()):
            log.info("LLDP neighbours: %s", "; ".join(
                f"{n.hca} port {n.port}: {n.switch} {n.switch_port}"
                for n in self.neighbours.value) or "none")
        self.every_port.publish(with_silent(self.neighbours.value, self.listened()))

    def listened(self) -> tuple[tuple[str, int, str], ...]:
        """The ports listened on now, ``(hca, port, netdev)``: on a bond its first member
        with a socket. A port whose socket could not be opened is not one of them."""
        out: dict[PortKey, str] = {}
        for netdev, key in self._ports.items():
            if netdev in self._sockets:
                out.setdefault(key, netdev)
        return tuple((hca, port, netdev) for (hca, port), netdev in sorted(out.items()))

    async def run(self) -> None:
        """Expire neighbours and end holds on time, until cancelled."""
        try:
            while True:
                deadline = self.table.next_deadline()
                timeout = None if deadline is None else max(deadline - self.clock(), 0.01)
                self._wake.clear()
                await wait_event(self._wake, timeout)
                self.settle()
        finally:
            self.close()

    def stats(self) -> LldpStats:
        return LldpStats(
            off=self.off, netdevs=tuple(self._sockets), ports=dict(self._ports),
            frames=dict(self._counts.frames), dropped=dict(self._counts.dropped),
            neighbours=self.neighbours.value, last_frame=self.table.last_frames(),
            holds=self.table.holds_total, now=self.clock())
