"""How sysfs text is understood: the rules of the kernel and rdma-core, with no I/O.

Everything here is a pure function of bytes or text, so discovery, the port-state poll
and the reports agree on what a file means.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re

from rdma_hca.node.model import GidKind, LinkLayer

DEV_DIR = "/dev/infiniband"
"""Where RDMA device nodes live on the host and inside containers."""

UNKNOWN = "UNKNOWN"
"""Port state or physical state whose sysfs text could not be understood (or read)."""

MAX_READ = 4096  # a sysfs attribute never exceeds one page
ZERO_GID = b"0000:0000:0000:0000:0000:0000:0000:0000"
ZERO_GID_LINE = ZERO_GID + b"\n"
GID_TYPES = frozenset({"IB/RoCE v1", "RoCE v2"})
NETNS_MODES = {"Y": "shared", "1": "shared", "N": "exclusive", "0": "exclusive"}

# The names the kernel prints after the number (drivers/infiniband/core/sysfs.c); the
# number is what the driver reported, so it decides when the text disagrees.
PORT_STATE_NAMES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATE_NAMES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}

# Bounds past which a number cannot describe real hardware: such content is junk and is
# reported as unknown rather than carried into JSON (where a huge float is Infinity).
MAX_RATE_GBPS = 100_000.0
MAX_LID = 0xFFFF
MAX_NUMA_NODE = 1 << 16
MAX_PORT = 1 << 16
MAX_GID_INDEX = 1 << 16
MAX_COUNTER = (1 << 64) - 1

PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
# resource.kubernetes.io/pciBusID and pcieRoot accept only this form (domain of 4 digits,
# lower case), as k8s.io/dynamic-resource-allocation/deviceattribute checks it.
PCI_BUS_ID = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")
GUID = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){3}")
GID_TEXT = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7}")
HEX_ID = re.compile(r"0x[0-9a-fA-F]{1,8}")
_STATE = re.compile(r"([0-9]{1,9}):\s*([A-Za-z][A-Za-z_ ]*)")
RATE = re.compile(r"([0-9]+(?:\.[0-9]+)?) Gb/sec\b.*")
NETDEV = re.compile(r"[^\s/:]{1,15}")  # IFNAMSIZ - 1; no slash, colon or blank
UVERBS = re.compile(r"uverbs[0-9]+")
MAD = re.compile(r"(umad|issm)[0-9]+")
DIGITS = re.compile(r"([0-9]+)")


def unusable_warning(hca: str, problem: str) -> str:
    """The warning discovery gives for an entry of ``Hca.problems`` (reports skip these
    because they list the problems already)."""
    return f"{hca} cannot be offered: {problem}"


def printable(text: str) -> str:
    """Text that encodes as UTF-8 and shows on one line, whatever bytes it came from.

    Names from ``os.listdir`` carry undecodable bytes as lone surrogates; they come back
    as ``\\xff``. Other unprintable characters come back as their escape (``\\x00``).
    """
    if text.isprintable():
        return text
    raw = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in raw)


def display_name(name: str) -> str:
    """The name an entry of ``class/infiniband`` is known by in the inventory and outputs."""
    return printable(name)


def attribute_text(raw: bytes) -> str | None:
    """Attribute text without the trailing newline, or None if it is not printable text."""
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def shown(raw: bytes) -> str:
    """Bad content quoted safely for a log line: bytes repr, cut short."""
    return repr(raw[:24]) + ("..." if len(raw) > 24 else "")


def why(err: OSError) -> str:
    return err.strerror or type(err).__name__


def is_number(name: str) -> bool:
    return name.isascii() and name.isdecimal()


def safe_name(name: str) -> bool:
    """A name that stays one path component: callers pass HCA names we did not list."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def parse_state(raw: bytes, names: dict[int, str]) -> tuple[str, str | None] | None:
    """``(state, text the file gave)`` of a ``state``/``phys_state`` file, or None.

    The number decides: ``5: Polling`` is LinkUp. The text is returned when it does not
    match the number, so discovery can say so; a number the kernel has no name for is
    UNKNOWN.
    """
    text = attribute_text(raw)
    m = _STATE.fullmatch(text) if text is not None else None
    if m is None:
        return None
    said = m.group(2).strip()
    name = names.get(int(m.group(1)))
    if name is None:
        return UNKNOWN, said
    return name, (None if said == name else said)


def port_state(raw: bytes) -> str:
    """The quiet form the port-state poll uses: a state name or UNKNOWN."""
    parsed = parse_state(raw, PORT_STATE_NAMES)
    return UNKNOWN if parsed is None else parsed[0]


def phys_state(raw: bytes) -> str:
    parsed = parse_state(raw, PHYS_STATE_NAMES)
    return UNKNOWN if parsed is None else parsed[0]


def rate_gbps(text: str) -> float | None:
    """Gb/s of a rate like ``400 Gb/sec (4X NDR)``; None when not a possible rate."""
    m = RATE.fullmatch(text)
    if m is None:
        return None
    value = float(m.group(1))
    return value if math.isfinite(value) and value <= MAX_RATE_GBPS else None


def unused_gid(packed: bytes) -> bool:
    """An entry not in use: rdma-core and the kernel's GID cache take a GID whose
    interface ID (bytes 8-15) is zero as empty; mlx4 fills unused InfiniBand entries
    with the subnet prefix and a zero interface ID."""
    return packed[8:] == bytes(8)


def classify(addr: ipaddress.IPv6Address, link_layer: LinkLayer) -> tuple[GidKind, str | None]:
    """What a GID carries and, for RoCE, the IP address in normal text form."""
    mapped = addr.ipv4_mapped
    if mapped is not None:
        kind, ip = GidKind.IPV4_MAPPED, str(mapped)
    elif addr.is_link_local:
        kind, ip = GidKind.LINK_LOCAL, str(addr)
    elif (
        link_layer is LinkLayer.INFINIBAND
        or addr.is_multicast
        or addr.is_unspecified
        or addr.is_loopback
    ):
        # An InfiniBand GID is subnet prefix + port GUID, not an IP address a pod could use.
        kind, ip = GidKind.OTHER, None
    else:
        kind, ip = GidKind.GLOBAL_IPV6, str(addr)
    if link_layer is not LinkLayer.ETHERNET:
        ip = None
    return kind, ip


def pcie_root(real_sysfs_root: str, device_dir: str) -> str | None:
    """``resource.kubernetes.io/pcieRoot`` of a PCI function, e.g. ``pci0000:3a``.

    As Kubernetes defines it: the first component of the function's path under
    ``<sysfs>/devices`` when that component is a PCI root (``pci...``) and the path ends
    in a bus ID of the canonical form. ``device_dir`` is the resolved ``device`` link and
    ``real_sysfs_root`` the resolved sysfs root.
    """
    devices = os.path.join(real_sysfs_root, "devices") + os.sep
    if not device_dir.startswith(devices):
        return None
    parts = device_dir[len(devices):].split(os.sep)
    if len(parts) < 2 or not parts[0].startswith("pci"):
        return None
    if PCI_BUS_ID.fullmatch(parts[-1]) is None:
        return None
    return parts[0]
