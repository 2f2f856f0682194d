"""What a simulated node is built from: specs of its HCAs and ports, and the writers.

Writing uses bare ``os.open``/``os.write`` because benchmark nodes have hundreds of
thousands of small files and ``open()`` costs twice as much per file.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

ZERO_GID_LINE = b"0000:0000:0000:0000:0000:0000:0000:0000\n"
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
ROCE_V1 = "IB/RoCE v1"
ROCE_V2 = "RoCE v2"
# ports/N/counters, as the kernel's sysfs ABI lists them (drivers/infiniband/core/sysfs.c).
COUNTERS = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
)
# ports/N/hw_counters of mlx5 (drivers/infiniband/hw/mlx5/counters.c): these on every
# port, the congestion (RoCE ECN/CNP) and adaptive-retransmission ones on Ethernet ports.
MLX5_HW_COUNTERS = (
    "duplicate_request",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "rx_atomic_requests",
    "rx_read_requests",
    "rx_write_requests",
)
MLX5_ROCE_HW_COUNTERS = (
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rx_icrc_encapsulated",
)
# Not a counter: how many milliseconds the driver keeps the values it read.
HW_LIFESPAN = "lifespan"
UVERBS_ABI_VERSION = "6"
MAD_ABI_VERSION = "5"


@dataclass(frozen=True)
class PortSpec:
    """One port of a simulated HCA.

    ``netdev`` is the netdev the RoCE GIDs belong to (for InfiniBand: the IPoIB netdev
    listed under the PCI device). ``ipv4``/``ipv6`` add RoCE v1 and v2 GIDs for that
    address (``ipv6_first``: the IPv6 address was configured first, so its GIDs come
    before the IPv4 ones); ``gid_table_size`` counts every entry, the zero ones too.
    ``unused_gid`` is what unused entries hold instead of zeros (mlx4 on InfiniBand
    writes the subnet prefix with a zero interface ID there).
    """

    link_layer: str = "Ethernet"
    up: bool = True
    rate: str = "400 Gb/sec (4X NDR)"
    netdev: str | None = None
    ipv4: str | None = None
    ipv6: str | None = None
    gid_table_size: int = 256
    counters: bool = True
    lid: int = 0
    sm_lid: int = 0
    unused_gid: str | None = None
    ipv6_first: bool = False


@dataclass(frozen=True)
class HcaSpec:
    """One simulated HCA.

    ``pci_address`` None makes a device without a PCI parent (Soft RoCE, siw). Then
    ``soft_parent`` writes rxe's ``parent`` file and ``parent_device`` (a path under
    ``devices/``) gives the HCA a ``device`` link that is not a PCI function.
    ``bond_slaves`` are the enslaved netdevs of a bonded HCA (one per PCI function).
    ``has_uverbs`` False leaves the HCA without an ``infiniband_verbs`` entry.
    """

    name: str
    driver: str | None = "mlx5_core"
    pci_address: str | None = None
    vendor: str = "0x15b3"
    device: str = "0x101d"
    numa_node: int | None = None
    board_id: str | None = "MT_0000000359"
    hca_type: str | None = "MT4125"
    fw_ver: str | None = "22.39.1002"
    node_guid: str = "b859:9f03:00d4:3c22"
    ports: tuple[PortSpec, ...] = (PortSpec(),)
    uverbs_index: int = 0
    node_type: str = "1: CA"
    bond_slaves: tuple[str, ...] = ()
    soft_parent: str | None = None
    parent_device: str | None = None
    has_uverbs: bool = True
    pcie_root: str | None = None
    bridges: tuple[str, ...] | None = None


def write(path: str, data: bytes) -> None:
    fd = os.open(path, WRITE_FLAGS, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def write_line(path: str, text: str) -> None:
    # Names may carry bytes that are not UTF-8 (as surrogate escapes): write them back raw.
    write(path, (text + "\n").encode("utf-8", "surrogateescape"))


def replace_line(path: str, text: str) -> None:
    """Change a file of a live tree in one step: a sysfs read never sees half an update
    (the kernel makes an attribute's text when it is read), so neither may the daemon."""
    replace_lines({path: text})


def replace_lines(texts: dict[str, str]) -> None:
    """Change several files of a live tree, each in one step, and as close together in
    time as renames go: every new text is written aside first. A port's state and
    physical state change together in the kernel; writing the second file only after
    the first is in place would leave a daemon's poll a wide window to see a mix."""
    aside = []
    for path, text in texts.items():
        head, tail = os.path.split(path)
        tmp = os.path.join(head, f".{tail}.new")
        write_line(tmp, text)
        aside.append((tmp, path))
    for tmp, path in aside:
        os.replace(tmp, path)


def symlink(target: str, link: str) -> None:
    """Relative link, as sysfs has them, so a moved or copied tree stays valid."""
    os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


def guid_bytes(guid: str) -> bytes:
    return bytes.fromhex(guid.replace(":", ""))


def guid_text(raw: bytes) -> str:
    h = raw.hex()
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


def gid_line(addr: ipaddress.IPv6Address) -> bytes:
    return (addr.exploded + "\n").encode()


def link_local(guid: str, port: int) -> ipaddress.IPv6Address:
    """The default RoCE GID: fe80:: plus the modified EUI-64 of the port's MAC.

    mlx5 derives node GUID and MAC from the same base (GUID = MAC[0:3] 03:00 MAC[3:6]),
    so the sim does the same to keep GUIDs and GIDs consistent.
    """
    g = bytearray(guid_bytes(guid))
    mac = bytearray(g[0:3] + g[5:8])
    mac[5] = (mac[5] + port - 1) & 0xFF
    eui = bytes([mac[0] ^ 0x02, mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]])
    return ipaddress.IPv6Address(b"\xfe\x80" + b"\x00" * 6 + eui)


def port_guid(guid: str, port: int) -> bytes:
    value = int.from_bytes(guid_bytes(guid), "big") + port - 1
    return value.to_bytes(8, "big")


def pci_parts(address: str) -> tuple[str, int, str]:
    domain, bus, devfn = address.split(":")
    return domain, int(bus, 16), devfn
