"""Link and address events from rtnetlink, read with the standard library.

The health watcher only needs to hear "something happened to netdev X": a link
change means re-read port state now; an address change means the GID table changed
(RoCE GIDs follow the netdev's addresses). That is a few dozen lines of parsing;
a full netlink library costs about 10 MiB of resident memory and 200 modules in a
daemon that otherwise idles at a few dozen MiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

NETLINK_ROUTE = 0
RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100
RTM_NEWLINK, RTM_DELLINK = 16, 17
RTM_NEWADDR, RTM_DELADDR = 20, 21
IFLA_IFNAME = 3
NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
RTATTR = struct.Struct("=HH")  # len, type


@dataclass(frozen=True, slots=True)
class NetdevEvent:
    kind: str  # "link" or "address"
    ifname: str | None  # None when the name cannot be known (e.g. the netdev is gone)


def _align(n: int) -> int:
    return (n + 3) & ~3


def _ifname(attrs: bytes) -> str | None:
    off = 0
    while off + RTATTR.size <= len(attrs):
        length, kind = RTATTR.unpack_from(attrs, off)
        if length < RTATTR.size:
            return None
        if kind == IFLA_IFNAME:
            raw = attrs[off + RTATTR.size: off + length]
            return raw.split(b"\0", 1)[0].decode("utf-8", "replace") or None
        off += _align(length)
    return None


def _name_of_index(index: int) -> str | None:
    try:
        return socket.if_indextoname(index)
    except (OSError, OverflowError):
        return None


def parse(data: bytes) -> Iterator[NetdevEvent]:
    """Events in one datagram; malformed input ends the parse instead of raising."""
    off = 0
    while off + NLMSG_HDR.size <= len(data):
        length, kind, _flags, _seq, _pid = NLMSG_HDR.unpack_from(data, off)
        if length < NLMSG_HDR.size or off + length > len(data):
            return
        body = data[off + NLMSG_HDR.size: off + length]
        if kind in (RTM_NEWLINK, RTM_DELLINK) and len(body) >= IFINFOMSG.size:
            yield NetdevEvent("link", _ifname(body[IFINFOMSG.size:]))
        elif kind in (RTM_NEWADDR, RTM_DELADDR) and len(body) >= IFADDRMSG.size:
            index = IFADDRMSG.unpack_from(body)[4]
            yield NetdevEvent("address", _name_of_index(index))
        off += _align(length)


def open_socket() -> socket.socket:
    """A non-blocking rtnetlink socket subscribed to link and address changes."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK,
                         NETLINK_ROUTE)
    try:
        sock.bind((0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
    except OSError:
        sock.close()
        raise
    return sock


async def events(sock: socket.socket) -> AsyncIterator[NetdevEvent]:
    """Events as they come. An overflowed socket (ENOBUFS) lost some: yield a wildcard."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                data = await loop.sock_recv(sock, 65536)
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # events were dropped: anything may have changed
                    yield NetdevEvent("address", None)
                    continue
                raise
            for event in parse(data):
                yield event
    finally:
        with contextlib.suppress(OSError):
            sock.close()
