"""The simulated node itself: specs of HCAs and GPUs, and the sysfs and /dev trees they make.

The trees follow the kernel's layout closely because discovery is only as good as the
trees it is tested on: ``class/infiniband/<hca>`` entries are relative symlinks into
``devices/...``; PCI functions sit under a root complex (``devices/pci0000:3a``) behind
their bridges, are linked from ``bus/pci/devices`` and carry ``vendor``/``device``/
``class``/``numa_node``, a ``driver`` link and ``net/<netdev>``; the uverbs and MAD class
directories hold an ``abi_version`` file beside the device entries; GID tables have all
of their entries, zero ones included. Device nodes under the dev tree are empty regular
files: discovery only checks that they exist.

Writing uses bare ``os.open``/``os.write`` because benchmark nodes have hundreds of
thousands of small files and ``open()`` costs twice as much per file.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

_ZERO_GID = b"0000:0000:0000:0000:0000:0000:0000:0000\n"
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
_ROCE_V1 = "IB/RoCE v1"
_ROCE_V2 = "RoCE v2"
_COUNTERS = (
    "port_rcv_data",
    "port_xmit_data",
    "port_rcv_packets",
    "port_xmit_packets",
    "port_rcv_errors",
    "port_xmit_discards",
    "symbol_error",
    "link_downed",
)
UVERBS_ABI_VERSION = "6"
MAD_ABI_VERSION = "5"


@dataclass(frozen=True)
class PortSpec:
    """One port of a simulated HCA.

    ``netdev`` is the netdev the RoCE GIDs belong to (for InfiniBand: the IPoIB netdev
    listed under the PCI device). ``ipv4``/``ipv6`` add RoCE v1 and v2 GIDs for that
    address; ``gid_table_size`` counts every entry, the zero ones too. ``unused_gid`` is
    what unused entries hold instead of zeros (mlx4 on InfiniBand writes the subnet
    prefix with a zero interface ID there).
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


@dataclass(frozen=True)
class GpuSpec:
    """A GPU as a PCI function (an H100 by default): it only has to sit in the PCI tree,
    so DRA's pcieRoot of each HCA can be checked against the GPUs beside it."""

    pci_address: str
    pcie_root: str
    bridges: tuple[str, ...] = ()
    vendor: str = "0x10de"
    device: str = "0x2330"
    numa_node: int | None = None


def default_topology(address: str) -> tuple[str, tuple[str, ...]]:
    """Root complex and bridges of a PCI function whose spec does not say: one root
    complex per domain and one root port per bus, as on a simple server."""
    domain, bus, _ = _pci_parts(address)
    if bus == 0:
        return f"pci{domain}:00", ()
    return f"pci{domain}:00", (f"{domain}:00:{bus % 0x1F + 1:02x}.0",)


def topology(spec: HcaSpec) -> tuple[str, tuple[str, ...]]:
    """(root complex, bridges from it down) of a PCI HCA."""
    assert spec.pci_address is not None
    root, bridges = default_topology(spec.pci_address)
    return (spec.pcie_root or root), (bridges if spec.bridges is None else spec.bridges)


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, _WRITE_FLAGS, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _write_line(path: str, text: str) -> None:
    # Names may carry bytes that are not UTF-8 (as surrogate escapes): write them back raw.
    _write(path, (text + "\n").encode("utf-8", "surrogateescape"))


def _symlink(target: str, link: str) -> None:
    """Relative link, as sysfs has them, so a moved or copied tree stays valid."""
    os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


def _guid_bytes(guid: str) -> bytes:
    return bytes.fromhex(guid.replace(":", ""))


def guid_text(raw: bytes) -> str:
    h = raw.hex()
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


def _gid_line(addr: ipaddress.IPv6Address) -> bytes:
    return (addr.exploded + "\n").encode()


def _link_local(guid: str, port: int) -> ipaddress.IPv6Address:
    """The default RoCE GID: fe80:: plus the modified EUI-64 of the port's MAC.

    mlx5 derives node GUID and MAC from the same base (GUID = MAC[0:3] 03:00 MAC[3:6]),
    so the sim does the same to keep GUIDs and GIDs consistent.
    """
    g = bytearray(_guid_bytes(guid))
    mac = bytearray(g[0:3] + g[5:8])
    mac[5] = (mac[5] + port - 1) & 0xFF
    eui = bytes([mac[0] ^ 0x02, mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]])
    return ipaddress.IPv6Address(b"\xfe\x80" + b"\x00" * 6 + eui)


def _port_guid(guid: str, port: int) -> bytes:
    value = int.from_bytes(_guid_bytes(guid), "big") + port - 1
    return value.to_bytes(8, "big")


def _pci_parts(address: str) -> tuple[str, int, str]:
    domain, bus, devfn = address.split(":")
    return domain, int(bus, 16), devfn


class SimNode:
    """A simulated node: its sysfs tree, its dev tree and the specs it was built from.

    ``specs`` keeps removed HCAs too, so ``add_hca(node.specs[name])`` brings one back
    as a driver reload would. ``damaged`` lists paths a broken-tree builder corrupted,
    so tests can check that discovery names them.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sysfs_root = root / "sys"
        self.dev_root = root / "dev"
        self.specs: dict[str, HcaSpec] = {}
        self.gpus: list[GpuSpec] = []
        self.damaged: list[Path] = []
        self.fifos: dict[Path, bytes] = {}
        self._present: set[str] = set()
        self._mad: dict[tuple[str, int], int] = {}

    # -- paths ---------------------------------------------------------------------------

    @property
    def hca_names(self) -> list[str]:
        """Names of the HCAs currently in the tree, in build order."""
        return [n for n in self.specs if n in self._present]

    def hca_dir(self, name: str) -> Path:
        """The class entry of an HCA (a symlink; writing through it reaches the real dir)."""
        return self.sysfs_root / "class" / "infiniband" / name

    def port_dir(self, name: str, port: int = 1) -> Path:
        return self.hca_dir(name) / "ports" / str(port)

    def pci_dir(self, name: str) -> Path | None:
        """The real PCI function directory of an HCA, or None for a soft device."""
        spec = self.specs[name]
        if spec.pci_address is None:
            return None
        return Path(self._pci_dir(spec, spec.pci_address))

    def expected_pcie_root(self, name: str) -> str | None:
        """The answer ``resource.kubernetes.io/pcieRoot`` must give for an HCA."""
        spec = self.specs[name]
        return None if spec.pci_address is None else topology(spec)[0]

    def gpus_by_root(self) -> dict[str, list[str]]:
        """PCI addresses of the GPUs under each root complex."""
        found: dict[str, list[str]] = {}
        for gpu in self.gpus:
            found.setdefault(gpu.pcie_root, []).append(gpu.pci_address)
        return found

    def uverbs_name(self, name: str) -> str:
        return f"uverbs{self.specs[name].uverbs_index}"

    def umad_name(self, name: str, port: int = 1) -> str:
        return f"umad{self._mad[(name, port)]}"

    def issm_name(self, name: str, port: int = 1) -> str:
        return f"issm{self._mad[(name, port)]}"

    def write(self, relpath: str, data: str | bytes) -> Path:
        """Write raw content to a file under sysfs_root (parents are created).

        The file is replaced rather than rewritten so a test corrupting one entry cannot
        affect another that happens to share storage.
        """
        path = self.sysfs_root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = data.encode() if isinstance(data, str) else data
        tmp = path.with_name(path.name + ".tmp-sim")
        tmp.write_bytes(raw)
        os.replace(tmp, path)
        return path

    def _s(self, *parts: str) -> str:
        return os.path.join(str(self.sysfs_root), *parts)

    def _pci_dir(self, spec: HcaSpec, address: str) -> str:
        root, bridges = topology(spec)
        return self._s("devices", root, *bridges, address)

    def _make_bridges(self, root: str, bridges: tuple[str, ...]) -> None:
        path = self._s("devices", root)
        for bridge in bridges:
            path = os.path.join(path, bridge)
            if not os.path.isdir(path):
                os.makedirs(path)
                _write_line(os.path.join(path, "vendor"), "0x8086")
                _write_line(os.path.join(path, "device"), "0x347a")
                _write_line(os.path.join(path, "class"), "0x060400")
                self._bus_link(path)

    def _bus_link(self, function_dir: str) -> None:
        """``bus/pci/devices/<address>``: how Kubernetes finds a function's place."""
        link = self._s("bus", "pci", "devices", os.path.basename(function_dir))
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if os.path.lexists(link):
            os.unlink(link)
        _symlink(function_dir, link)

    def add_gpu(self, gpu: GpuSpec) -> None:
        """A GPU function under ``gpu.pcie_root`` behind ``gpu.bridges``."""
        self._make_bridges(gpu.pcie_root, gpu.bridges)
        path = self._s("devices", gpu.pcie_root, *gpu.bridges, gpu.pci_address)
        os.makedirs(path)
        _write_line(os.path.join(path, "vendor"), gpu.vendor)
        _write_line(os.path.join(path, "device"), gpu.device)
        _write_line(os.path.join(path, "class"), "0x030200")
        numa = -1 if gpu.numa_node is None else gpu.numa_node
        _write_line(os.path.join(path, "numa_node"), str(numa))
        drv = self._s("bus", "pci", "drivers", "nvidia")
        os.makedirs(drv, exist_ok=True)
        _symlink(drv, os.path.join(path, "driver"))
        self._bus_link(path)
        self.gpus.append(gpu)

    # -- hostile files -------------------------------------------------------------------

    def replace_with_fifo(self, relpath: str) -> Path:
        """Put a FIFO in place of a file under sysfs_root: a read of it blocks until
        something writes, as a read stuck in a driver or HCA firmware does. Undo it with
        ``release_fifo`` (tests must, or a thread stays blocked in the read)."""
        path = self.sysfs_root / relpath
        real = Path(os.path.realpath(path))
        self.fifos[real] = real.read_bytes() if real.is_file() else b""
        tmp = real.with_name(real.name + ".fifo-sim")
        os.mkfifo(tmp)
        os.replace(tmp, real)
        return path

    def release_fifo(self, relpath: str) -> None:
        """Put the file back and let every read blocked on the FIFO return."""
        real = Path(os.path.realpath(self.sysfs_root / relpath))
        content = self.fifos.pop(real)
        aside = real.with_name(real.name + ".fifo-released")
        os.replace(real, aside)
        tmp = real.with_name(real.name + ".tmp-sim")
        tmp.write_bytes(content)
        os.replace(tmp, real)
        # Opening read-write never blocks on Linux and counts as a writer: every reader
        # blocked in open() returns, and reads EOF once this closes.
        fd = os.open(aside, os.O_RDWR | os.O_NONBLOCK)
        os.close(fd)
        if stat.S_ISFIFO(os.lstat(aside).st_mode):
            os.unlink(aside)

    def release_fifos(self) -> None:
        for real in list(self.fifos):
            self.release_fifo(os.path.relpath(real, os.path.realpath(self.sysfs_root)))

    def _function_address(self, address: str, function: int) -> str:
        return address.rsplit(".", 1)[0] + f".{function}"

    def _hca_real_dir(self, spec: HcaSpec) -> str:
        if spec.pci_address is not None:
            return os.path.join(self._pci_dir(spec, spec.pci_address), "infiniband", spec.name)
        return self._s("devices", "virtual", "infiniband", spec.name)

    def _class_parent(self, spec: HcaSpec, kind: str) -> str:
        if spec.pci_address is not None:
            return os.path.join(self._pci_dir(spec, spec.pci_address), kind)
        return self._s("devices", "virtual", kind)

    def _mad_index(self, name: str, port: int) -> int:
        key = (name, port)
        if key not in self._mad:
            self._mad[key] = max(self._mad.values(), default=-1) + 1
        return self._mad[key]

    # -- building ------------------------------------------------------------------------

    def _make_base(self, *, rdma: bool, rdma_cm: bool, netns_mode: str | None) -> None:
        for d in ("class/net", "class/misc", "devices/virtual/net", "bus/pci/drivers"):
            os.makedirs(self._s(d), exist_ok=True)
        os.makedirs(self.dev_root, exist_ok=True)
        lo = self._s("devices", "virtual", "net", "lo")
        os.makedirs(lo, exist_ok=True)
        _symlink(lo, self._s("class", "net", "lo"))
        if not rdma:
            return
        os.makedirs(self.dev_root / "infiniband", exist_ok=True)
        os.makedirs(self._s("class", "infiniband"), exist_ok=True)
        abis = (("infiniband_verbs", UVERBS_ABI_VERSION), ("infiniband_mad", MAD_ABI_VERSION))
        for kind, abi in abis:
            os.makedirs(self._s("class", kind), exist_ok=True)
            _write_line(self._s("class", kind, "abi_version"), abi)
        os.makedirs(self._s("module", "ib_core", "parameters"), exist_ok=True)
        if netns_mode is not None:
            self.set_netns_mode(netns_mode)
        if rdma_cm:
            cm = self._s("devices", "virtual", "misc", "rdma_cm")
            os.makedirs(cm)
            _write_line(os.path.join(cm, "dev"), "10:58")
            _symlink(cm, self._s("class", "misc", "rdma_cm"))
            (self.dev_root / "infiniband" / "rdma_cm").touch()

    def _virtual_netdev(self, name: str) -> None:
        path = self._s("devices", "virtual", "net", name)
        if not os.path.isdir(path):
            os.makedirs(path)
            _write_line(os.path.join(path, "operstate"), "up")
        link = self._s("class", "net", name)
        if not os.path.lexists(link):
            _symlink(path, link)

    def _pci_netdev(self, pci_dir: str, name: str, dev_port: int, master: str | None) -> None:
        path = os.path.join(pci_dir, "net", name)
        os.makedirs(path)
        _write_line(os.path.join(path, "dev_port"), str(dev_port))
        _write_line(os.path.join(path, "operstate"), "up")
        if master is not None:
            self._virtual_netdev(master)
            _symlink(self._s("devices", "virtual", "net", master), os.path.join(path, "master"))
        link = self._s("class", "net", name)
        if os.path.lexists(link):
            os.unlink(link)
        _symlink(path, link)

    def _make_pci_function(self, spec: HcaSpec, address: str) -> str:
        self._make_bridges(*topology(spec))
        pci = self._pci_dir(spec, address)
        os.makedirs(pci, exist_ok=True)  # the HCA's own directory below it may exist already
        self._bus_link(pci)
        _write_line(os.path.join(pci, "vendor"), spec.vendor)
        _write_line(os.path.join(pci, "device"), spec.device)
        _write_line(os.path.join(pci, "class"), "0x020000")
        numa = -1 if spec.numa_node is None else spec.numa_node
        _write_line(os.path.join(pci, "numa_node"), str(numa))
        if spec.driver is not None:
            drv = self._s("bus", "pci", "drivers", spec.driver)
            os.makedirs(drv, exist_ok=True)
            _symlink(drv, os.path.join(pci, "driver"))
        return pci

    def _make_parent(self, spec: HcaSpec, hca_dir: str) -> None:
        if spec.pci_address is not None:
            pci = self._make_pci_function(spec, spec.pci_address)
            _symlink(pci, os.path.join(hca_dir, "device"))
            if spec.bond_slaves:
                bond = spec.ports[0].netdev or "bond0"
                for fn, slave in enumerate(spec.bond_slaves):
                    addr = self._function_address(spec.pci_address, fn)
                    fdir = pci if fn == 0 else self._make_pci_function(spec, addr)
                    self._pci_netdev(fdir, slave, 0, bond)
            else:
                for i, port in enumerate(spec.ports):
                    if port.netdev is not None:
                        self._pci_netdev(pci, port.netdev, i, None)
            return
        if spec.parent_device is not None:
            parent = self._s("devices", *spec.parent_device.split("/"))
            os.makedirs(parent, exist_ok=True)
            _symlink(parent, os.path.join(hca_dir, "device"))
        if spec.soft_parent is not None:
            _write_line(os.path.join(hca_dir, "parent"), spec.soft_parent)
        for port in spec.ports:
            if port.netdev is not None:
                self._virtual_netdev(port.netdev)

    def _gid_entries(self, spec: HcaSpec, number: int, port: PortSpec) -> list[tuple[bytes, str]]:
        if port.link_layer == "InfiniBand":
            gid = b"\xfe\x80" + b"\x00" * 6 + _port_guid(spec.node_guid, number)
            return [(_gid_line(ipaddress.IPv6Address(gid)), _ROCE_V1)]
        if port.netdev is None:
            return []
        addrs = [_link_local(spec.node_guid, number)]
        if port.ipv4 is not None:
            v4 = ipaddress.IPv4Address(port.ipv4)
            addrs.append(ipaddress.IPv6Address(b"\x00" * 10 + b"\xff\xff" + v4.packed))
        if port.ipv6 is not None:
            addrs.append(ipaddress.IPv6Address(port.ipv6))
        # mlx5 fills the table v1, v2 per address, lowest free index first.
        return [(_gid_line(a), t) for a in addrs for t in (_ROCE_V1, _ROCE_V2)]

    def _make_port(self, spec: HcaSpec, number: int, port: PortSpec, hca_dir: str) -> None:
        pd = os.path.join(hca_dir, "ports", str(number))
        gids = os.path.join(pd, "gids")
        types = os.path.join(pd, "gid_attrs", "types")
        ndevs = os.path.join(pd, "gid_attrs", "ndevs")
        for d in (gids, types, ndevs):
            os.makedirs(d)
        self._write_port_state(pd, port.up)
        _write_line(os.path.join(pd, "link_layer"), port.link_layer)
        _write_line(os.path.join(pd, "rate"), port.rate)
        _write_line(os.path.join(pd, "lid"), f"0x{port.lid:x}")
        _write_line(os.path.join(pd, "sm_lid"), f"0x{port.sm_lid:x}")
        _write_line(os.path.join(pd, "cap_mask"), "0x00010000")
        entries = self._gid_entries(spec, number, port)[: port.gid_table_size]
        is_ib = port.link_layer == "InfiniBand"
        for index, (line, gid_type) in enumerate(entries):
            name = str(index)
            _write(os.path.join(gids, name), line)
            _write_line(os.path.join(types, name), gid_type)
            if not is_ib and port.netdev is not None:
                _write_line(os.path.join(ndevs, name), port.netdev)
        # Unused entries: the gids file reads as zeros; types/ndevs fail on a real
        # kernel (EINVAL), so they are left out here rather than written.
        prefix = gids + os.sep
        unused = _ZERO_GID if port.unused_gid is None else (port.unused_gid + "\n").encode()
        for index in range(len(entries), port.gid_table_size):
            _write(prefix + str(index), unused)
        if port.counters:
            cdir = os.path.join(pd, "counters")
            os.makedirs(cdir)
            for counter in _COUNTERS:
                _write_line(os.path.join(cdir, counter), "0")

    @staticmethod
    def _write_port_state(port_dir: str, up: bool) -> None:
        _write_line(os.path.join(port_dir, "state"), "4: ACTIVE" if up else "1: DOWN")
        _write_line(os.path.join(port_dir, "phys_state"), "5: LinkUp" if up else "3: Disabled")

    def _make_char_device(self, spec: HcaSpec, kind: str, name: str, attrs: dict[str, str]) -> None:
        real = os.path.join(self._class_parent(spec, kind), name)
        os.makedirs(real)
        for attr, value in attrs.items():
            _write_line(os.path.join(real, attr), value)
        if spec.pci_address is not None:
            _symlink(self._pci_dir(spec, spec.pci_address), os.path.join(real, "device"))
        _symlink(real, self._s("class", kind, name))
        (self.dev_root / "infiniband" / name).touch()

    def add_hca(self, spec: HcaSpec) -> None:
        """Make an HCA appear, as a driver load or hot plug would."""
        if spec.name in self._present:
            raise ValueError(f"HCA {spec.name} is already present in {self.sysfs_root}")
        taken = {self.specs[n].uverbs_index for n in self._present}
        if spec.has_uverbs and spec.uverbs_index in taken:
            raise ValueError(f"uverbs{spec.uverbs_index} is already used on this node")
        hca_dir = self._hca_real_dir(spec)
        os.makedirs(hca_dir)
        self._make_parent(spec, hca_dir)
        _write_line(os.path.join(hca_dir, "node_guid"), spec.node_guid)
        _write_line(os.path.join(hca_dir, "sys_image_guid"), spec.node_guid)
        _write_line(os.path.join(hca_dir, "node_type"), spec.node_type)
        _write_line(os.path.join(hca_dir, "node_desc"), f"sim-node {spec.name}")
        for attr in ("fw_ver", "board_id", "hca_type"):
            value = getattr(spec, attr)
            if value is not None:
                _write_line(os.path.join(hca_dir, attr), value)
        for number, port in enumerate(spec.ports, start=1):
            self._make_port(spec, number, port, hca_dir)
        _symlink(hca_dir, str(self.hca_dir(spec.name)))
        if spec.has_uverbs:
            n = spec.uverbs_index
            attrs = {"ibdev": spec.name, "abi_version": "1", "dev": f"231:{192 + n}"}
            self._make_char_device(spec, "infiniband_verbs", f"uverbs{n}", attrs)
        for number, port in enumerate(spec.ports, start=1):
            m = self._mad_index(spec.name, number)
            attrs = {"ibdev": spec.name, "port": str(number), "dev": f"231:{m}"}
            self._make_char_device(spec, "infiniband_mad", f"umad{m}", attrs)
            if port.link_layer == "InfiniBand":
                attrs = {"ibdev": spec.name, "port": str(number), "dev": f"231:{64 + m}"}
                self._make_char_device(spec, "infiniband_mad", f"issm{m}", attrs)
        self.specs[spec.name] = spec
        self._present.add(spec.name)

    # -- changing a live node ------------------------------------------------------------

    def _require(self, name: str) -> HcaSpec:
        if name not in self._present:
            raise KeyError(f"no HCA named {name!r} is present on this node")
        return self.specs[name]

    def remove_hca(self, name: str) -> None:
        """Take an HCA away as a driver unload or hot unplug does: class entries,
        device directories (and their netdevs), MAD/verbs entries and device nodes."""
        spec = self._require(name)
        self.hca_dir(name).unlink()
        char_names = [f"uverbs{spec.uverbs_index}"] if spec.has_uverbs else []
        for number, port in enumerate(spec.ports, start=1):
            m = self._mad[(name, number)]
            char_names.append(f"umad{m}")
            if port.link_layer == "InfiniBand":
                char_names.append(f"issm{m}")
        for cname in char_names:
            kind = "infiniband_verbs" if cname.startswith("uverbs") else "infiniband_mad"
            Path(self._s("class", kind, cname)).unlink(missing_ok=True)
            (self.dev_root / "infiniband" / cname).unlink(missing_ok=True)
            shutil.rmtree(os.path.join(self._class_parent(spec, kind), cname), ignore_errors=True)
        if spec.pci_address is None:
            shutil.rmtree(self._hca_real_dir(spec), ignore_errors=True)
        else:
            functions = max(1, len(spec.bond_slaves))
            for fn in range(functions):
                addr = spec.pci_address if fn == 0 else self._function_address(spec.pci_address, fn)
                pci = self._pci_dir(spec, addr)
                Path(self._s("bus", "pci", "devices", addr)).unlink(missing_ok=True)
                net = os.path.join(pci, "net")
                if os.path.isdir(net):
                    for netdev in os.listdir(net):
                        Path(self._s("class", "net", netdev)).unlink(missing_ok=True)
                shutil.rmtree(pci, ignore_errors=True)
        self._present.discard(name)

    def set_port(self, hca: str, port: int = 1, *, up: bool) -> None:
        """Bring a port's link up or down (writes state and phys_state)."""
        spec = self._require(hca)
        if not 1 <= port <= len(spec.ports):
            raise KeyError(f"{hca} has no port {port}")
        self._write_port_state(str(self.port_dir(hca, port)), up)
        ports = list(spec.ports)
        ports[port - 1] = replace(ports[port - 1], up=up)
        self.specs[hca] = replace(spec, ports=tuple(ports))

    def set_counter(self, hca: str, port: int, counter: str, value: int) -> None:
        self._require(hca)
        cdir = self.port_dir(hca, port) / "counters"
        cdir.mkdir(exist_ok=True)
        _write_line(str(cdir / counter), str(value))

    def remove_dev_node(self, name: str) -> None:
        """Delete ``<dev_root>/infiniband/<name>`` (e.g. "uverbs3"), as a missing mknod would."""
        (self.dev_root / "infiniband" / name).unlink()

    def restore_dev_node(self, name: str) -> None:
        (self.dev_root / "infiniband").mkdir(parents=True, exist_ok=True)
        (self.dev_root / "infiniband" / name).touch()

    def set_netns_mode(self, mode: str | None) -> None:
        """Set ib_core's netns_mode ("shared" writes Y, "exclusive" writes N; None removes it)."""
        path = self._s("module", "ib_core", "parameters", "netns_mode")
        if mode is None:
            Path(path).unlink(missing_ok=True)
            return
        values = {"shared": "Y", "exclusive": "N"}
        if mode not in values:
            raise ValueError(f"netns mode must be 'shared' or 'exclusive', not {mode!r}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write_line(path, values[mode])


def build_node(
    root: Path,
    specs: Sequence[HcaSpec],
    *,
    rdma_cm: bool = True,
    netns_mode: str | None = "shared",
) -> SimNode:
    """Write a node with the given HCAs under ``root`` (``root/sys`` and ``root/dev``)."""
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"HCA names must be unique, repeated: {', '.join(dupes)}")
    node = SimNode(Path(root))
    node._make_base(rdma=True, rdma_cm=rdma_cm, netns_mode=netns_mode)
    for spec in specs:
        node.add_hca(spec)
    return node
