"""The rtnetlink parser on crafted datagrams and on garbage."""

from __future__ import annotations

import socket
import struct

from hypothesis import given
from hypothesis import strategies as st

from rdma_hca.node import netlink


def rtattr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * ((-length) % 4)


def message(kind: int, body: bytes) -> bytes:
    length = 16 + len(body)
    return struct.pack("=IHHII", length, kind, 0, 0, 0) + body + b"\0" * ((-length) % 4)


def newlink(name: str) -> bytes:
    info = struct.pack("=BxHiII", 0, 1, 7, 0, 0)
    return message(netlink.RTM_NEWLINK, info + rtattr(4, b"\x00\x00\x00\x05")
                   + rtattr(netlink.IFLA_IFNAME, name.encode() + b"\0"))


def test_link_messages_name_their_netdev() -> None:
    data = newlink("eth3") + newlink("bond0")
    assert list(netlink.parse(data)) == [netlink.NetdevEvent("link", "eth3"),
                                         netlink.NetdevEvent("link", "bond0")]


def test_address_messages_are_resolved_by_index() -> None:
    index = socket.if_nametoindex("lo")
    body = struct.pack("=BBBBI", socket.AF_INET6, 128, 0, 0, index)
    (event,) = netlink.parse(message(netlink.RTM_NEWADDR, body))
    assert event == netlink.NetdevEvent("address", "lo")


def test_other_messages_are_ignored_and_truncation_stops_the_parse() -> None:
    route = message(24, b"\0" * 12)  # RTM_NEWROUTE
    data = route + newlink("eth0")
    assert [e.ifname for e in netlink.parse(data)] == ["eth0"]
    assert list(netlink.parse(newlink("eth0")[:-6])) == []
    assert list(netlink.parse(struct.pack("=IHHII", 3, 16, 0, 0, 0))) == []


@given(st.binary(max_size=512))
def test_garbage_never_raises(data: bytes) -> None:
    for event in netlink.parse(data):
        assert event.kind in {"link", "address"}
