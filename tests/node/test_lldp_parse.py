"""The LLDP parser on frames as switches send them, on every way a frame can be wrong,
and on garbage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdma_hca.node import lldp
from rdma_hca.node.lldp import LldpError, LldpFrame, build_frame, parse_frame, tlv

MAC = bytes.fromhex("0c42a1b2c3d4")
HEADER = lldp.LLDP_MULTICAST + bytes.fromhex("020000000001") + b"\x88\xcc"


def mandatory(ttl: int = 120) -> bytes:
    return (tlv(1, b"\x04" + MAC) + tlv(2, b"\x05swp1") + tlv(3, ttl.to_bytes(2, "big")))


def frame(body: bytes, header: bytes = HEADER) -> bytes:
    return header + body


def reason(data: bytes) -> str:
    with pytest.raises(LldpError) as caught:
        parse_frame(data)
    return caught.value.reason


def test_a_switch_frame_gives_chassis_port_ttl_and_names() -> None:
    data = build_frame(MAC, "Ethernet1/7", ttl=120, system_name="leaf-3.pod1",
                       port_description="to gpu-17 nic 3")
    assert parse_frame(data) == LldpFrame("0c:42:a1:b2:c3:d4", "Ethernet1/7", 120,
                                          "to gpu-17 nic 3", "leaf-3.pod1")


def test_other_tlvs_are_skipped_and_padding_after_end_is_ignored() -> None:
    body = (mandatory() + tlv(6, b"SONiC 202405") + tlv(7, b"\x00\x14\x00\x14")
            + tlv(127, b"\x00\x80\xc2\x01\x00\x01") + tlv(5, b"leaf-1") + tlv(0, b""))
    assert parse_frame(frame(body + b"\0" * 20)).system_name == "leaf-1"


def test_a_frame_without_end_tlv_is_taken() -> None:
    # 802.1AB-2016 made the End TLV optional.
    assert parse_frame(frame(mandatory())).port_id == "swp1"


def test_a_vlan_tagged_frame_is_taken() -> None:
    tagged = lldp.LLDP_MULTICAST + bytes(6) + b"\x81\x00\x00\x64\x88\xcc"
    assert parse_frame(frame(mandatory(), tagged)).chassis_id == "0c:42:a1:b2:c3:d4"


@pytest.mark.parametrize(("subtype", "value", "shown"), [
    (4, MAC, "0c:42:a1:b2:c3:d4"),
    (4, b"\x01\x02\x03", "010203"),  # a "MAC" of the wrong size: hex, not a guess
    (5, b"\x01\x0a\x00\x00\x01", "10.0.0.1"),
    (5, b"\x02" + bytes(15) + b"\x01", "::1"),
    (5, b"\x09\x01\x02", "090102"),
    (7, b"leaf-7", "leaf-7"),
    (7, b"bad\x00\xffname\\", "bad\\x00\\xffname\\x5c"),
])
def test_chassis_ids_are_rendered_by_subtype(subtype: int, value: bytes, shown: str) -> None:
    body = tlv(1, bytes([subtype]) + value) + tlv(2, b"\x05p") + tlv(3, b"\x00\x78")
    assert parse_frame(frame(body)).chassis_id == shown


@pytest.mark.parametrize(("subtype", "value", "shown"), [
    (3, MAC, "0c:42:a1:b2:c3:d4"),
    (5, b"Ethernet48", "Ethernet48"),
    (7, b"48", "48"),
    (6, b"\x01\x02", "0102"),  # an agent circuit ID is binary
    (4, b"\x01\xc0\xa8\x00\x01", "192.168.0.1"),
])
def test_port_ids_are_rendered_by_subtype(subtype: int, value: bytes, shown: str) -> None:
    body = tlv(1, b"\x07sw") + tlv(2, bytes([subtype]) + value) + tlv(3, b"\x00\x78")
    assert parse_frame(frame(body)).port_id == shown


def test_text_is_bounded_whatever_it_holds() -> None:
    body = tlv(1, b"\x07" + b"\x01" * 255) + tlv(2, b"\x05p") + tlv(3, b"\x00\x78")
    rendered = parse_frame(frame(body)).chassis_id
    assert len(rendered) <= lldp.MAX_TEXT and rendered.startswith("\\x01\\x01")


@pytest.mark.parametrize(("data", "why"), [
    (b"", lldp.TRUNCATED),
    (HEADER[:13], lldp.TRUNCATED),
    (HEADER + b"\x02", lldp.TRUNCATED),
    (HEADER + mandatory() + b"\x0a\x10abc", lldp.TRUNCATED),  # length 16, 3 bytes left
    (bytes(6) + HEADER[6:] + mandatory(), lldp.NOT_LLDP),  # not to the LLDP address
    (HEADER[:12] + b"\x08\x00" + mandatory(), lldp.NOT_LLDP),
    (lldp.LLDP_MULTICAST + bytes(6) + b"\x81\x00\x00", lldp.TRUNCATED),
    (HEADER + tlv(2, b"\x05p") + tlv(1, b"\x04" + MAC) + tlv(3, b"\x00\x78"), lldp.MISSING_TLV),
    (HEADER + tlv(1, b"\x04" + MAC) + tlv(3, b"\x00\x78"), lldp.MISSING_TLV),
    (HEADER + tlv(1, b"\x04" + MAC) + tlv(2, b"\x05p"), lldp.MISSING_TLV),
    (HEADER + tlv(1, b"\x04" + MAC) + tlv(2, b"\x05p") + tlv(0, b""), lldp.MISSING_TLV),
    (HEADER + tlv(0, b""), lldp.MISSING_TLV),
    (HEADER + tlv(1, b"\x04") + tlv(2, b"\x05p") + tlv(3, b"\x00\x78"), lldp.MALFORMED),
    (HEADER + tlv(1, b"\x00ab") + tlv(2, b"\x05p") + tlv(3, b"\x00\x78"), lldp.MALFORMED),
    (HEADER + tlv(1, b"\x04" + MAC) + tlv(2, b"\x08p") + tlv(3, b"\x00\x78"), lldp.MALFORMED),
    (HEADER + tlv(1, b"\x04" + MAC) + tlv(2, b"\x05p") + tlv(3, b"\x78"), lldp.MALFORMED),
    (HEADER + mandatory() + tlv(1, b"\x04" + MAC), lldp.MALFORMED),
    (HEADER + mandatory() + tlv(5, b"a") + tlv(5, b"b"), lldp.MALFORMED),
    (HEADER + mandatory() + tlv(0, b"x"), lldp.MALFORMED),
    (build_frame(MAC, "p").ljust(lldp.MAX_FRAME + 1, b"\0"), lldp.OVERSIZED),
])
def test_a_bad_frame_is_dropped_with_its_reason(data: bytes, why: str) -> None:
    assert reason(data) == why


def test_the_largest_frame_is_taken() -> None:
    body = mandatory() + tlv(0, b"")
    data = frame(body).ljust(lldp.MAX_FRAME, b"\0")
    assert len(data) == lldp.MAX_FRAME and parse_frame(data).ttl == 120


def test_ttl_zero_is_a_frame_like_any_other() -> None:
    assert parse_frame(frame(mandatory(ttl=0))).ttl == 0


@given(st.binary(max_size=2 * lldp.MAX_FRAME))
def test_garbage_raises_only_the_typed_error(data: bytes) -> None:
    try:
        parsed = parse_frame(data)
    except LldpError as exc:
        assert exc.reason in lldp.REASONS
    else:
        assert len(parsed.chassis_id) <= lldp.MAX_TEXT


_tlvs = st.lists(st.tuples(st.integers(0, 127), st.binary(max_size=300)), max_size=12)


@given(_tlvs, st.booleans())
def test_frames_of_random_tlvs_raise_only_the_typed_error(
        tlvs: list[tuple[int, bytes]], with_mandatory: bool) -> None:
    body = (mandatory() if with_mandatory else b"") + b"".join(tlv(k, v) for k, v in tlvs)
    try:
        parsed = parse_frame(frame(body))
    except LldpError as exc:
        assert exc.reason in lldp.REASONS
    else:
        texts = (parsed.chassis_id, parsed.port_id, parsed.system_name,
                 parsed.port_description)
        assert all(len(t) <= lldp.MAX_TEXT and t.isprintable() for t in texts)
        assert 0 <= parsed.ttl <= 0xFFFF


@given(st.binary(min_size=1, max_size=400), st.integers(0, 400))
def test_cutting_a_good_frame_anywhere_never_raises_another_error(tail: bytes,
                                                                  cut: int) -> None:
    data = (frame(mandatory() + tlv(5, tail[:255])))[: 14 + cut]
    try:
        parse_frame(data)
    except LldpError as exc:
        assert exc.reason in (lldp.TRUNCATED, lldp.MISSING_TLV)
