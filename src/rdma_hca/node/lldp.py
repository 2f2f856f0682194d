"""LLDP frames (IEEE 802.1AB) as a switch sends them: a strict, bounded parser.

What a frame from the wire may hold is anything, so every length is checked against the
frame before it is used, the frame is capped (:data:`MAX_FRAME`) before parsing starts,
and each TLV is visited once: the work per frame is linear in its size and the size is
bounded. A frame the standard's receiver would discard (mandatory TLVs missing or out
of order, lengths past the frame, a mandatory TLV of the wrong size) raises
:class:`LldpError` with a reason from :data:`REASONS`, which the daemon counts; nothing
else is ever raised.

Only what the daemon publishes is kept: chassis ID, port ID, TTL, port description and
system name. IDs are rendered by their subtype (a MAC as ``aa:bb:..``, an address as
text, names as text); bytes that are not printable ASCII are escaped (``\\xNN``), so the
result is safe in a label, a log line or JSON, and bounded (:data:`MAX_TEXT`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

LLDP_MULTICAST = bytes.fromhex("0180c200000e")  # the nearest bridge: never forwarded
ETH_P_LLDP = 0x88CC
ETH_P_8021Q = 0x8100
# An untagged frame's 1500 bytes of LLDPDU and 14 of header, and a VLAN tag's 4: what an
# 802.1AB agent sends fits (an LLDPDU fills at most one frame); the FCS never reaches us.
MAX_FRAME = 1518
MAX_TEXT = 255  # a rendered ID or name, in characters (a string TLV holds 255 bytes)

TLV_END, TLV_CHASSIS_ID, TLV_PORT_ID, TLV_TTL = 0, 1, 2, 3
TLV_PORT_DESCRIPTION, TLV_SYSTEM_NAME = 4, 5

# Why a frame was dropped: a small fixed set, so counters keyed by it stay bounded.
OVERSIZED = "oversized"  # longer than MAX_FRAME
TRUNCATED = "truncated"  # a header or a TLV runs past the frame's end
NOT_LLDP = "not-lldp"  # not to the LLDP address, or not of LLDP's EtherType
MISSING_TLV = "missing-tlv"  # chassis ID, port ID, TTL not first and in this order
MALFORMED = "malformed"  # a TLV of the wrong size or subtype, or one repeated
REASONS = (OVERSIZED, TRUNCATED, NOT_LLDP, MISSING_TLV, MALFORMED)

# Subtypes (802.1AB-2016 tables 8-2 and 8-3).
CHASSIS_MAC, CHASSIS_ADDRESS = 4, 5
PORT_MAC, PORT_ADDRESS, PORT_CIRCUIT_ID = 3, 4, 6
_IANA_IPV4, _IANA_IPV6 = 1, 2


class LldpError(ValueError):
    """The frame is dropped; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"LLDP frame dropped ({reason}): {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class LldpFrame:
    """What one frame says of the sender's port."""

    chassis_id: str
    port_id: str
    ttl: int  # seconds the information stays valid; 0: forget it now
    port_description: str = ""
    system_name: str = ""


def escaped(data: bytes) -> str:
    """Printable ASCII as is, every other byte (and the backslash) as ``\\xNN``; at most
    :data:`MAX_TEXT` characters."""
    out = []
    size = 0
    for b in data:
        piece = chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}"
        size += len(piece)
        if size > MAX_TEXT:
            break
        out.append(piece)
    return "".join(out)


def _mac(data: bytes) -> str:
    return ":".join(f"{b:02x}" for b in data)


def _address(data: bytes) -> str:
    """A network address subtype: an IANA family byte, then the address."""
    family, raw = data[0], data[1:]
    if family == _IANA_IPV4 and len(raw) == 4:
        return str(ipaddress.IPv4Address(raw))
    if family == _IANA_IPV6 and len(raw) == 16:
        return str(ipaddress.IPv6Address(raw))
    return data.hex()


def _id(value: bytes, mac: int, address: int, binary: tuple[int, ...], what: str) -> str:
    """A chassis or port ID TLV's value: a subtype byte (1 to 7), then 1 to 255 bytes."""
    if not 2 <= len(value) <= 256:
        raise LldpError(MALFORMED, f"{what} TLV of {len(value)} bytes (2 to 256)")
    subtype, data = value[0], value[1:]
    if not 1 <= subtype <= 7:
        raise LldpError(MALFORMED, f"{what} subtype {subtype} is reserved")
    if subtype == mac:
        return _mac(data) if len(data) == 6 else data.hex()
    if subtype == address:
        return _address(data)
    if subtype in binary:
        return data.hex()
    return escaped(data)


def parse_frame(frame: bytes | bytearray | memoryview) -> LldpFrame:
    """The frame as received on an AF_PACKET socket (Ethernet header first, no FCS)."""
    data = bytes(frame[: MAX_FRAME + 1])
    if len(data) > MAX_FRAME:
        raise LldpError(OVERSIZED, f"{len(frame)} bytes, more than {MAX_FRAME}")
    if len(data) < 14:
        raise LldpError(TRUNCATED, f"{len(data)} bytes, less than an Ethernet header")
    if data[:6] != LLDP_MULTICAST:
        raise LldpError(NOT_LLDP, f"sent to {_mac(data[:6])}, not {_mac(LLDP_MULTICAST)}")
    at = 12
    ethertype = int.from_bytes(data[at:at + 2], "big")
    if ethertype == ETH_P_8021Q:
        at += 4
        if len(data) < at + 2:
            raise LldpError(TRUNCATED, "a VLAN tag with no EtherType after it")
        ethertype = int.from_bytes(data[at:at + 2], "big")
    if ethertype != ETH_P_LLDP:
        raise LldpError(NOT_LLDP, f"EtherType 0x{ethertype:04x}, not 0x{ETH_P_LLDP:04x}")
    return _tlvs(data, at + 2)


def _tlvs(data: bytes, at: int) -> LldpFrame:
    chassis = port = ""
    ttl = 0
    texts: dict[int, str] = {}
    index = 0
    end = len(data)
    while at < end:
        if at + 2 > end:
            raise LldpError(TRUNCATED, f"a TLV header at byte {at} runs past the frame")
        header = int.from_bytes(data[at:at + 2], "big")
        kind, length = header >> 9, header & 0x1FF
        at += 2
        if at + length > end:
            raise LldpError(TRUNCATED, f"TLV type {kind} of {length} bytes at byte {at - 2} "
                                       f"runs past the frame's {end}")
        value = data[at:at + length]
        at += length
        if index < 3 and kind != index + 1:
            name = ("chassis ID", "port ID", "TTL")[index]
            raise LldpError(MISSING_TLV, f"TLV {index + 1} is type {kind}, not the {name}")
        index += 1
        if kind == TLV_END:
            if length:
                raise LldpError(MALFORMED, f"End TLV of {length} bytes, not 0")
            break
        if kind == TLV_CHASSIS_ID and index == 1:
            chassis = _id(value, CHASSIS_MAC, CHASSIS_ADDRESS, (), "chassis ID")
        elif kind == TLV_PORT_ID and index == 2:
            port = _id(value, PORT_MAC, PORT_ADDRESS, (PORT_CIRCUIT_ID,), "port ID")
        elif kind == TLV_TTL and index == 3:
            if length != 2:
                raise LldpError(MALFORMED, f"TTL TLV of {length} bytes, not 2")
            ttl = int.from_bytes(value, "big")
        elif kind in (TLV_CHASSIS_ID, TLV_PORT_ID, TLV_TTL) or kind in texts:
            raise LldpError(MALFORMED, f"TLV type {kind} repeated")
        elif kind in (TLV_PORT_DESCRIPTION, TLV_SYSTEM_NAME):
            texts[kind] = escaped(value)
        # Other TLVs (descriptions, capabilities, addresses, organizational) are skipped.
    if index < 3:
        raise LldpError(MISSING_TLV, f"only {index} of the chassis ID, port ID and TTL TLVs")
    return LldpFrame(chassis_id=chassis, port_id=port, ttl=ttl,
                     port_description=texts.get(TLV_PORT_DESCRIPTION, ""),
                     system_name=texts.get(TLV_SYSTEM_NAME, ""))


def tlv(kind: int, value: bytes) -> bytes:
    """One TLV's bytes (for building frames: the tests, the benchmark, a replay)."""
    if not 0 <= kind < 128 or len(value) > 511:
        raise ValueError(f"TLV type {kind} with {len(value)} bytes does not fit a TLV header")
    return ((kind << 9) | len(value)).to_bytes(2, "big") + value


def build_frame(chassis_mac: bytes, port_name: str, *, ttl: int = 120,
                system_name: str = "", port_description: str = "",
                source: bytes = bytes.fromhex("020000000001")) -> bytes:
    """A well-formed frame as a switch sends it: chassis ID a MAC, port ID its name."""
    body = (tlv(TLV_CHASSIS_ID, bytes([CHASSIS_MAC]) + chassis_mac)
            + tlv(TLV_PORT_ID, bytes([5]) + port_name.encode())
            + tlv(TLV_TTL, ttl.to_bytes(2, "big")))
    if port_description:
        body += tlv(TLV_PORT_DESCRIPTION, port_description.encode())
    if system_name:
        body += tlv(TLV_SYSTEM_NAME, system_name.encode())
    body += tlv(TLV_END, b"")
    frame = LLDP_MULTICAST + source + ETH_P_LLDP.to_bytes(2, "big") + body
    return frame.ljust(60, b"\0")  # the Ethernet minimum, padded as the wire does
