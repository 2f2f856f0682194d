"""The socket LLDP frames come in on: AF_PACKET, one netdev, LLDP's EtherType only.

Joined to the LLDP multicast group (PACKET_ADD_MEMBERSHIP) so the frames arrive without
promiscuous mode, non-blocking (the event loop reads it), with a small receive buffer: a
flood fills it and the kernel drops the rest before it costs us anything. Opening it
needs CAP_NET_RAW (EPERM without).
"""

from __future__ import annotations

import socket
import struct

from rdma_hca.node.lldp import ETH_P_LLDP, LLDP_MULTICAST

SOL_PACKET = 263  # linux/socket.h (Python's socket module does not name it)
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_MULTICAST = 0
# Some 40 frames of the largest size: far beyond what LLDP needs between two reads.
RECEIVE_BUFFER = 64 * 1024


def open_lldp_socket(netdev: str) -> socket.socket:
    """A non-blocking socket that receives the LLDP frames of ``netdev`` (OSError: why
    not; ENODEV for a netdev that is not in this network namespace)."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_LLDP))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind((netdev, ETH_P_LLDP))
        index = socket.if_nametoindex(netdev)
        # struct packet_mreq: ifindex, type, address length, address (8 bytes).
        mreq = struct.pack("iHH8s", index, PACKET_MR_MULTICAST, len(LLDP_MULTICAST),
                           LLDP_MULTICAST)
        sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
