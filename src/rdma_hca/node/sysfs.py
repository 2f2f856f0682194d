"""Discovery of a node's RDMA HCAs from sysfs and the dev tree.

Every file the daemon reads about HCAs is read here, so the rules for trusting sysfs
live in one place:

- Nothing raises on bad content. The kernel, a driver or a half-finished hot unplug can
  leave a dangling symlink, an unreadable attribute or junk behind; one broken entry must
  not take the whole node's RDMA offer down. Each one is skipped (or its field set to
  None) with one warning naming the path, kept in ``NodeInventory.warnings`` and logged.
- Names are compared exactly, never by prefix: ``mlx5_1`` is not ``mlx5_10``.
- No vendor tables: any device under ``class/infiniband`` is an HCA (mlx5, erdma, irdma,
  bnxt_re, efa, rxe, siw ...).
- GID tables are read with bare ``os.open``/``os.read``: a node can have hundreds of
  ports with 256 entries each, almost all of them zero, and per-file cost dominates.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from rdma_hca.node.model import CharDevice, Gid, GidKind, Hca, LinkLayer, NodeInventory, Port

__all__ = [
    "DEV_DIR",
    "UNKNOWN",
    "discover",
    "discover_node",
    "natural_key",
    "read_netns_mode",
    "read_port_counters",
    "read_port_states",
    "unusable_warning",
]


StrPath = str | os.PathLike[str]

DEV_DIR = "/dev/infiniband"
"""Where RDMA device nodes live on the host and inside containers."""

UNKNOWN = "UNKNOWN"
"""Port state or physical state whose sysfs text could not be understood."""

_MAX_READ = 4096  # a sysfs attribute never exceeds one page
_ZERO_GID = b"0000:0000:0000:0000:0000:0000:0000:0000"
_ZERO_GID_LINE = _ZERO_GID + b"\n"
_GID_TYPES = frozenset({"IB/RoCE v1", "RoCE v2"})
_NETNS_MODES = {"Y": "shared", "1": "shared", "N": "exclusive", "0": "exclusive"}

_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_GUID = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){3}")
_GID_TEXT = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7}")
_HEX_ID = re.compile(r"0x[0-9a-fA-F]{1,8}")
_STATE = re.compile(r"[0-9]+:\s*([A-Z][A-Z_]*)")
_PHYS_STATE = re.compile(r"[0-9]+:\s*([A-Za-z][A-Za-z _]*)")
_RATE = re.compile(r"([0-9]+(?:\.[0-9]+)?) Gb/sec\b.*")
_NETDEV = re.compile(r"[^\s/:]{1,15}")  # IFNAMSIZ - 1; no slash, colon or blank
_UVERBS = re.compile(r"uverbs[0-9]+")
_MAD = re.compile(r"(umad|issm)[0-9]+")
_DIGITS = re.compile(r"([0-9]+)")


def natural_key(name: str) -> tuple[str | int, ...]:
    """Sort key putting ``mlx5_2`` before ``mlx5_10`` (digit runs compare as numbers).

    ``re.split`` with a capturing group alternates text and digits, so positions hold
    the same type in every key and tuples compare without mixing str and int.
    """
    parts = _DIGITS.split(name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def unusable_warning(hca: str, problem: str) -> str:
    """The warning discovery gives for an entry of ``Hca.problems`` (reports skip these
    because they list the problems already)."""
    return f"{hca} cannot be offered: {problem}"


def _read(path: str) -> bytes:
    """One attribute's raw bytes; raises OSError like the kernel does (EINVAL, ENOENT...)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, _MAX_READ)
    finally:
        os.close(fd)


def _decode(raw: bytes) -> str | None:
    """Attribute text without the trailing newline, or None if it is not printable text."""
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def _why(err: OSError) -> str:
    return err.strerror or type(err).__name__


def _shown(raw: bytes) -> str:
    """Bad content quoted safely for a log line: bytes repr, cut short."""
    return repr(raw[:24]) + ("..." if len(raw) > 24 else "")


def _is_number(name: str) -> bool:
    return name.isascii() and name.isdecimal()


def _safe_name(name: str) -> bool:
    """A name that stays one path component: callers pass HCA names we did not list."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _parse_state(raw: bytes) -> str | None:
    text = _decode(raw)
    m = _STATE.fullmatch(text) if text is not None else None
    return m.group(1) if m else None


def _parse_phys_state(raw: bytes) -> str | None:
    text = _decode(raw)
    m = _PHYS_STATE.fullmatch(text) if text is not None else None
    return m.group(1).strip() if m else None


def _classify(addr: ipaddress.IPv6Address, link_layer: LinkLayer) -> tuple[GidKind, str | None]:
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


def _nonzero_entries(dir_fd: int, entries: list[str]) -> list[tuple[int, str, bytes]] | None:
    """The hot loop of discovery: (index, name, content) of the GID entries in use.

    A real table has 255 or 256 entries and nearly all are zero, so each one costs an
    open, a read and a close with nothing else in the loop (functions bound to locals,
    no per-entry try). Returns None, having closed what it opened, if any name is not
    a plain number or any entry cannot be read; the caller then takes the careful path.
    """
    joined = "".join(entries)
    if not (joined.isascii() and joined.isdecimal()):
        return None
    opener, reader, closer = os.open, os.read, os.close
    flags = os.O_RDONLY
    zero_line, zero = _ZERO_GID_LINE, _ZERO_GID
    used: list[tuple[int, str, bytes]] = []
    fd = -1
    try:
        for entry in entries:
            fd = opener(entry, flags, dir_fd=dir_fd)
            raw = reader(fd, 128)
            closer(fd)
            fd = -1
            if raw != zero_line and raw != zero:
                used.append((int(entry), entry, raw))
    except OSError:
        if fd >= 0:
            closer(fd)
        return None
    return used


@dataclass
class _Parent:
    """What the HCA's parent device says: PCI identity, NUMA node, driver, netdevs."""

    pci_address: str | None = None
    vendor: str | None = None
    device: str | None = None
    numa_node: int | None = None
    driver: str | None = None
    netdevs: list[tuple[str, int | None]] = field(default_factory=list)  # (name, dev_port)


class _Discovery:
    """One pass over sysfs; collects warnings as it goes."""

    def __init__(self, sysfs_root: StrPath, dev_root: StrPath) -> None:
        self.sys = os.fspath(sysfs_root)
        self.dev = os.fspath(dev_root)
        self.warnings: list[str] = []
        self.uverbs: dict[str, str] = {}
        self.umad: dict[tuple[str, int], str] = {}
        self.issm: dict[tuple[str, int], str] = {}

    def warn(self, message: str) -> None:
        # Collected, not logged: the daemon rediscovers on every change and says each
        # warning once; `rdma-hca discover` prints them in its report.
        self.warnings.append(message)

    def path(self, *parts: str) -> str:
        return os.path.join(self.sys, *parts)

    # -- small readers ---------------------------------------------------------------

    def text(self, path: str) -> str | None:
        """Optional attribute: None when absent (quietly) or unreadable (with a warning)."""
        try:
            raw = _read(path)
        except FileNotFoundError:
            return None
        except OSError as err:
            self.warn(f"cannot read {path} ({_why(err)}); ignoring it")
            return None
        text = _decode(raw)
        if text is None:
            self.warn(f"{path} holds unreadable content {_shown(raw)}; ignoring it")
        return text

    def matching(self, path: str, pattern: re.Pattern[str], expected: str) -> str | None:
        text = self.text(path)
        if text is None:
            return None
        if pattern.fullmatch(text) is None:
            self.warn(f"{path} holds {text!r}, expected {expected}; ignoring it")
            return None
        return text

    def netdev_name(self, path: str, name: str) -> str | None:
        if _NETDEV.fullmatch(name) and name.isprintable():
            return name
        self.warn(f"{path} names {name!r}, which is not a valid netdev name; ignoring it")
        return None

    def link_target(self, path: str) -> str:
        try:
            return os.readlink(path)
        except OSError as err:
            return f"<unreadable: {_why(err)}>"

    def numbered(self, parent: str, entries: list[str], what: str) -> list[tuple[int, str]]:
        """Entries named by a number, sorted by it; others get a warning and are dropped."""
        numbered: list[tuple[int, str]] = []
        for entry in entries:
            if _is_number(entry):
                numbered.append((int(entry), entry))
            else:
                self.warn(f"ignoring {os.path.join(parent, entry)}: its name is not {what}")
        numbered.sort()
        return numbered

    def char_device(self, name: str) -> CharDevice:
        present = os.path.exists(os.path.join(self.dev, "infiniband", name))
        return CharDevice(name=name, path=f"{DEV_DIR}/{name}", present=present)

    # -- class directories -----------------------------------------------------------

    def class_dirs(self, kind: str) -> list[tuple[str, str]]:
        """Directory entries of ``class/<kind>`` (symlinks followed), naturally sorted.

        Plain files such as ``abi_version`` sit beside the device entries and are skipped;
        a dangling symlink is a device that is half gone and gets a warning.
        """
        cls = self.path("class", kind)
        try:
            names = os.listdir(cls)
        except FileNotFoundError:
            return []
        except OSError as err:
            self.warn(f"cannot list {cls} ({_why(err)}); treating it as empty")
            return []
        found: list[tuple[str, str]] = []
        for name in sorted(names, key=natural_key):
            entry = os.path.join(cls, name)
            if os.path.isdir(entry):
                found.append((name, entry))
            elif os.path.islink(entry):
                target = self.link_target(entry)
                self.warn(
                    f"{entry} is a dangling symlink (-> {target}): the device is gone or "
                    "half removed; skipping it"
                )
            elif kind == "infiniband":
                self.warn(f"{entry} is not a directory; skipping it")
        return found

    def load_char_maps(self) -> None:
        for name, entry in self.class_dirs("infiniband_verbs"):
            if not _UVERBS.fullmatch(name):
                continue
            ibdev = self.text(os.path.join(entry, "ibdev"))
            if ibdev is None:
                self.warn(f"{entry}/ibdev is missing or unreadable; cannot tell its HCA")
            elif ibdev in self.uverbs:
                self.warn(
                    f"{entry}/ibdev names {ibdev}, already served by {self.uverbs[ibdev]}; "
                    "ignoring the second one"
                )
            else:
                self.uverbs[ibdev] = name
        for name, entry in self.class_dirs("infiniband_mad"):
            m = _MAD.fullmatch(name)
            if m is None:
                continue
            ibdev = self.text(os.path.join(entry, "ibdev"))
            port = self.matching(os.path.join(entry, "port"), re.compile("[0-9]+"), "a number")
            if ibdev is None or port is None:
                self.warn(f"{entry} does not say which HCA port it serves; ignoring it")
                continue
            table = self.umad if m.group(1) == "umad" else self.issm
            table.setdefault((ibdev, int(port)), name)

    # -- one HCA -----------------------------------------------------------------------

    def parent(self, hca_dir: str) -> _Parent:
        result = _Parent()
        link = os.path.join(hca_dir, "device")
        if not os.path.lexists(link):
            return result  # Soft RoCE and friends have no parent device: normal
        real = os.path.realpath(link)
        if not os.path.isdir(real):
            self.warn(
                f"{link} points to {self.link_target(link)}, which does not exist; "
                "PCI address, NUMA node and driver are unknown"
            )
            return result
        driver = os.path.join(real, "driver")
        if os.path.lexists(driver):
            result.driver = os.path.basename(self.link_target(driver)) or None
        base = os.path.basename(real)
        if _PCI_ADDRESS.fullmatch(base):
            result.pci_address = base.lower()
            hex_id = "a hex id like 0x15b3"
            vendor = self.matching(os.path.join(real, "vendor"), _HEX_ID, hex_id)
            device = self.matching(os.path.join(real, "device"), _HEX_ID, hex_id)
            result.vendor = vendor.lower() if vendor else None
            result.device = device.lower() if device else None
            result.numa_node = self.numa_node(os.path.join(real, "numa_node"))
        result.netdevs = self.pci_netdevs(os.path.join(real, "net"))
        return result

    def numa_node(self, path: str) -> int | None:
        text = self.text(path)
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            value = -2
        if value == -1:
            return None  # the platform does not know: no NUMA preference
        if value < 0:
            self.warn(f"{path} holds {text!r}, not a NUMA node number; NUMA node unknown")
            return None
        return value

    def pci_netdevs(self, net_dir: str) -> list[tuple[str, int | None]]:
        """Netdevs of the parent device, minus enslaved ones.

        A bond slave carries no addresses of its own: a bonded HCA (``mlx5_bond_0``)
        is reached through the bond, which its GIDs name, so the slave is left out.
        """
        try:
            names = os.listdir(net_dir)
        except OSError:
            return []
        found: list[tuple[str, int | None]] = []
        for name in sorted(names, key=natural_key):
            entry = os.path.join(net_dir, name)
            if self.netdev_name(entry, name) is None:
                continue
            if os.path.lexists(os.path.join(entry, "master")):
                continue
            dev_port: int | None = None
            with_port = self.matching(os.path.join(entry, "dev_port"), _DIGITS, "a number")
            if with_port is not None:
                dev_port = int(with_port)
            found.append((name, dev_port))
        return found

    def hca(self, name: str, hca_dir: str) -> Hca:
        parent = self.parent(hca_dir)
        guid = self.matching(
            os.path.join(hca_dir, "node_guid"), _GUID, "a GUID like b859:9f03:00d4:3c22"
        )
        soft_parent = None
        parent_file = os.path.join(hca_dir, "parent")
        text = self.text(parent_file)
        if text is not None:
            soft_parent = self.netdev_name(parent_file, text)
        ports = self.ports(name, hca_dir, parent, soft_parent)
        problems: list[str] = []
        uverbs: CharDevice | None = None
        uverbs_name = self.uverbs.get(name)
        if uverbs_name is None:
            problems.append(
                f"no entry in {self.path('class', 'infiniband_verbs')} belongs to it "
                "(is the ib_uverbs module loaded?)"
            )
        else:
            uverbs = self.char_device(uverbs_name)
            if not uverbs.present:
                problems.append(
                    f"device node {uverbs.path} is missing under {self.dev} "
                    "(mount the host's /dev/infiniband there)"
                )
        for problem in problems:
            self.warn(unusable_warning(name, problem))
        return Hca(
            name=name,
            driver=parent.driver,
            node_guid=guid.lower() if guid else None,
            fw_ver=self.text(os.path.join(hca_dir, "fw_ver")),
            board_id=self.text(os.path.join(hca_dir, "board_id")),
            hca_type=self.text(os.path.join(hca_dir, "hca_type")),
            pci_address=parent.pci_address,
            pci_vendor=parent.vendor,
            pci_device=parent.device,
            numa_node=parent.numa_node,
            ports=ports,
            uverbs=uverbs,
            problems=tuple(problems),
        )

    def ports(
        self, hca: str, hca_dir: str, parent: _Parent, soft_parent: str | None
    ) -> tuple[Port, ...]:
        ports_dir = os.path.join(hca_dir, "ports")
        try:
            entries = os.listdir(ports_dir)
        except OSError as err:
            self.warn(f"cannot list {ports_dir} ({_why(err)}); {hca} shows no ports")
            return ()
        numbered = self.numbered(ports_dir, entries, "a port number")
        single = len(numbered) == 1
        ports: list[Port] = []
        for number, entry in numbered:
            # Which of the parent's netdevs belong to this port: all of them on a
            # single-port HCA; on a multi-port one, those whose dev_port says so.
            own = [n for n, dp in parent.netdevs if single or dp == number - 1]
            if soft_parent is not None and single:
                own.insert(0, soft_parent)
            port = self.port(hca, number, os.path.join(ports_dir, entry), own)
            if port is not None:
                ports.append(port)
        return tuple(ports)

    def port(self, hca: str, number: int, port_dir: str, netdevs: list[str]) -> Port | None:
        state_path = os.path.join(port_dir, "state")
        try:
            raw = _read(state_path)
        except OSError as err:
            self.warn(f"skipping port {port_dir}: its state file cannot be read ({_why(err)})")
            return None
        state = _parse_state(raw)
        if state is None:
            self.warn(
                f"{state_path} holds {_shown(raw)}, not a state like '4: ACTIVE'; "
                f"taking the port as {UNKNOWN} (down)"
            )
            state = UNKNOWN
        phys_state = self.phys_state(os.path.join(port_dir, "phys_state"))
        link_layer = self.link_layer(os.path.join(port_dir, "link_layer"))
        rate, rate_gbps = self.rate(os.path.join(port_dir, "rate"))
        gids, gid_netdevs = self.gids(port_dir, link_layer)
        lid = sm_lid = None
        if link_layer is LinkLayer.INFINIBAND:
            lid = self.lid(os.path.join(port_dir, "lid"))
            sm_lid = self.lid(os.path.join(port_dir, "sm_lid"))
        umad = self.umad.get((hca, number))
        issm = self.issm.get((hca, number))
        return Port(
            number=number,
            state=state,
            phys_state=phys_state,
            link_layer=link_layer,
            rate=rate,
            rate_gbps=rate_gbps,
            netdevs=tuple(dict.fromkeys(netdevs + gid_netdevs)),
            gids=tuple(gids),
            umad=self.char_device(umad) if umad else None,
            issm=self.char_device(issm) if issm else None,
            lid=lid,
            sm_lid=sm_lid,
        )

    def phys_state(self, path: str) -> str:
        try:
            raw = _read(path)
        except OSError as err:
            self.warn(f"cannot read {path} ({_why(err)}); physical state {UNKNOWN}")
            return UNKNOWN
        phys = _parse_phys_state(raw)
        if phys is None:
            self.warn(
                f"{path} holds {_shown(raw)}, not a state like '5: LinkUp'; "
                f"physical state {UNKNOWN}"
            )
            return UNKNOWN
        return phys

    def link_layer(self, path: str) -> LinkLayer:
        text = self.text(path)
        for layer in (LinkLayer.ETHERNET, LinkLayer.INFINIBAND):
            if text == layer.value:
                return layer
        if text is not None:
            self.warn(f"{path} holds {text!r}, not Ethernet or InfiniBand; link layer unknown")
        return LinkLayer.UNKNOWN

    def rate(self, path: str) -> tuple[str, float | None]:
        try:
            raw = _read(path)
        except OSError:
            # Some drivers answer EINVAL while the link is down: no rate is normal then.
            return "", None
        text = _decode(raw)
        m = _RATE.fullmatch(text) if text is not None else None
        if text is None or m is None:
            self.warn(f"{path} holds {_shown(raw)}, not a rate like '400 Gb/sec (4X NDR)'")
            return "", None
        return text, float(m.group(1))

    def lid(self, path: str) -> int | None:
        text = self.text(path)
        if text is None:
            return None
        try:
            return int(text, 16) if text.lower().startswith("0x") else int(text)
        except ValueError:
            self.warn(f"{path} holds {text!r}, not a LID like 0x5; ignoring it")
            return None

    # -- GIDs --------------------------------------------------------------------------

    def gids(self, port_dir: str, link_layer: LinkLayer) -> tuple[list[Gid], list[str]]:
        """Used GID entries and, in table order, the netdevs they belong to."""
        gid_dir = os.path.join(port_dir, "gids")
        # One descriptor for the directory: opening entries relative to it skips the
        # walk through class/infiniband's symlink for each of the 256 files.
        try:
            dir_fd = os.open(gid_dir, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return [], []
        except OSError as err:
            self.warn(f"cannot open {gid_dir} ({_why(err)}); the port shows no GIDs")
            return [], []
        try:
            return self.gid_table(dir_fd, gid_dir, port_dir, link_layer)
        finally:
            os.close(dir_fd)

    def gid_table(
        self, dir_fd: int, gid_dir: str, port_dir: str, link_layer: LinkLayer
    ) -> tuple[list[Gid], list[str]]:
        try:
            entries = os.listdir(dir_fd)
        except OSError as err:
            self.warn(f"cannot list {gid_dir} ({_why(err)}); the port shows no GIDs")
            return [], []
        used = _nonzero_entries(dir_fd, entries)
        if used is None:
            # Odd names or an unreadable entry: redo the table slowly, saying what is wrong.
            used = self.nonzero_entries_carefully(dir_fd, gid_dir, entries)
        used.sort()
        types_dir = os.path.join(port_dir, "gid_attrs", "types")
        have_types = os.path.isdir(types_dir)
        gids: list[Gid] = []
        netdevs: list[str] = []
        for index, entry, raw in used:
            path = os.path.join(gid_dir, entry)
            gid = self.gid(index, path, raw, port_dir, entry, link_layer, have_types)
            if gid is not None:
                gids.append(gid)
                if gid.netdev is not None:
                    netdevs.append(gid.netdev)
        return gids, netdevs

    def nonzero_entries_carefully(
        self, dir_fd: int, gid_dir: str, entries: list[str]
    ) -> list[tuple[int, str, bytes]]:
        used: list[tuple[int, str, bytes]] = []
        for index, entry in self.numbered(gid_dir, entries, "a GID index"):
            try:
                fd = os.open(entry, os.O_RDONLY, dir_fd=dir_fd)
                try:
                    raw = os.read(fd, 128)
                finally:
                    os.close(fd)
            except OSError as err:
                path = os.path.join(gid_dir, entry)
                self.warn(f"cannot read {path} ({_why(err)}); skipping that GID")
                continue
            if raw not in (_ZERO_GID_LINE, _ZERO_GID):
                used.append((index, entry, raw))
        return used

    def gid(
        self,
        index: int,
        path: str,
        raw: bytes,
        port_dir: str,
        entry: str,
        link_layer: LinkLayer,
        have_types: bool,
    ) -> Gid | None:
        text = _decode(raw)
        if text is None or _GID_TEXT.fullmatch(text) is None:
            self.warn(f"{path} holds {_shown(raw)}, not a GID; skipping it")
            return None
        addr = ipaddress.IPv6Address(text)
        if addr.packed == bytes(16):
            return None
        gid_type = ""
        if have_types:
            type_path = os.path.join(port_dir, "gid_attrs", "types", entry)
            try:
                type_raw = _read(type_path)
            except OSError:
                # The kernel answers EINVAL for an entry that is not in use; a stale
                # address left in gids/N is then not a GID anyone can use.
                return None
            type_text = _decode(type_raw)
            if type_text in _GID_TYPES:
                gid_type = type_text
            else:
                self.warn(
                    f"{type_path} holds {_shown(type_raw)}, not 'IB/RoCE v1' or 'RoCE v2'; "
                    "GID type unknown"
                )
        netdev: str | None = None
        ndev_path = os.path.join(port_dir, "gid_attrs", "ndevs", entry)
        try:
            ndev_raw = _read(ndev_path)
        except OSError:
            pass  # InfiniBand GIDs have no netdev: the kernel answers EINVAL
        else:
            ndev_text = _decode(ndev_raw)
            if ndev_text is None:
                self.warn(f"{ndev_path} holds {_shown(ndev_raw)}; GID netdev unknown")
            elif ndev_text:
                netdev = self.netdev_name(ndev_path, ndev_text)
        kind, ip = _classify(addr, link_layer)
        return Gid(index=index, address=text, type=gid_type, kind=kind, netdev=netdev, ip=ip)

    # -- node-wide -----------------------------------------------------------------------

    def netns_mode(self) -> str | None:
        path = self.path("module", "ib_core", "parameters", "netns_mode")
        text = self.text(path)
        if text is None:
            return None
        mode = _NETNS_MODES.get(text)
        if mode is None:
            self.warn(f"{path} holds {text!r}, expected Y or N; RDMA netns mode unknown")
        return mode

    def rdma_cm(self) -> CharDevice | None:
        entry = self.path("class", "misc", "rdma_cm")
        if os.path.isdir(entry):
            return self.char_device("rdma_cm")
        if os.path.islink(entry):
            self.warn(f"{entry} is a dangling symlink (-> {self.link_target(entry)}); no rdma_cm")
        return None

    def run(self) -> NodeInventory:
        if not os.path.isdir(self.sys):
            self.warn(
                f"sysfs root {self.sys} does not exist or is not a directory; no HCAs can be "
                "found (mount the host's /sys there or pass the right sysfs root)"
            )
            return NodeInventory(hcas=(), rdma_cm=None, netns_mode=None, warnings=self._done())
        self.load_char_maps()
        hcas = tuple(self.hca(name, path) for name, path in self.class_dirs("infiniband"))
        rdma_cm = self.rdma_cm()
        netns = self.netns_mode()
        return NodeInventory(hcas=hcas, rdma_cm=rdma_cm, netns_mode=netns, warnings=self._done())

    def _done(self) -> tuple[str, ...]:
        return tuple(self.warnings)


def discover_node(sysfs_root: StrPath, dev_root: StrPath) -> NodeInventory:
    """Everything about the node's HCAs in one pass; never raises on bad sysfs content.

    ``sysfs_root`` is normally ``/sys`` and ``dev_root`` normally ``/dev``. HCAs come
    back sorted by name (naturally: mlx5_2 before mlx5_10).
    """
    return _Discovery(sysfs_root, dev_root).run()


def discover(sysfs_root: StrPath, dev_root: StrPath) -> list[Hca]:
    """The HCAs of :func:`discover_node` as a list."""
    return list(discover_node(sysfs_root, dev_root).hcas)


def read_port_states(
    sysfs_root: StrPath, hca_names: Iterable[str]
) -> dict[tuple[str, int], tuple[str, str]]:
    """``(hca, port) -> (state, phys_state)``, e.g. ``("ACTIVE", "LinkUp")``.

    The health watcher polls this often, so it reads only the two state files per port
    and stays quiet: an HCA or port that vanished is simply absent, unparseable text
    reads as ``UNKNOWN`` (discovery is where such content gets reported).
    """
    root = os.fspath(sysfs_root)
    states: dict[tuple[str, int], tuple[str, str]] = {}
    for name in hca_names:
        if not _safe_name(name):
            continue
        ports_dir = os.path.join(root, "class", "infiniband", name, "ports")
        try:
            entries = os.listdir(ports_dir)
        except OSError:
            continue
        for entry in entries:
            if not _is_number(entry):
                continue
            port_dir = os.path.join(ports_dir, entry)
            try:
                state = _parse_state(_read(os.path.join(port_dir, "state"))) or UNKNOWN
            except OSError:
                continue
            try:
                phys = _parse_phys_state(_read(os.path.join(port_dir, "phys_state"))) or UNKNOWN
            except OSError:
                phys = UNKNOWN
            states[(name, int(entry))] = (state, phys)
    return states


def read_netns_mode(sysfs_root: StrPath) -> str | None:
    """The RDMA subsystem's network-namespace mode: "shared", "exclusive" or None.

    In "exclusive" mode an HCA is visible only in the namespace it was moved to, so a
    shared device plugin cannot hand it to pods; callers report that.
    """
    return _Discovery(sysfs_root, os.devnull).netns_mode()


def read_port_counters(sysfs_root: StrPath, hca: str, port: int) -> dict[str, int]:
    """The integer counters of ``ports/<port>/counters``; anything else is left out."""
    if not _safe_name(hca):
        return {}
    counters_dir = os.path.join(
        os.fspath(sysfs_root), "class", "infiniband", hca, "ports", str(port), "counters"
    )
    try:
        names = os.listdir(counters_dir)
    except OSError:
        return {}
    counters: dict[str, int] = {}
    for name in sorted(names):
        try:
            text = _decode(_read(os.path.join(counters_dir, name)))
        except OSError:
            continue  # some counters answer EOPNOTSUPP on some devices
        if text is not None and _is_number(text):
            counters[name] = int(text)
    return counters
