"""The simulated node itself: the sysfs and /dev trees its specs make, and live changes.

The trees follow the kernel's layout closely because discovery is only as good as the
trees it is tested on: ``class/infiniband/<hca>`` entries are relative symlinks into
``devices/...``; PCI functions sit under a root complex behind their bridges (see
``pcitree``), are linked from ``bus/pci/devices`` and carry ``vendor``/``device``/
``class``/``numa_node``, a ``driver`` link and ``net/<netdev>``; the uverbs and MAD class
directories hold an ``abi_version`` file beside the device entries; GID tables have all
of their entries, zero ones included. Device nodes under the dev tree are empty regular
files: discovery only checks that they exist.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rdma_hca.devkit.sim.pcitree import GpuSpec, PciTree, topology
from rdma_hca.devkit.sim.specs import (
    COUNTERS,
    HW_LIFESPAN,
    MAD_ABI_VERSION,
    MLX5_HW_COUNTERS,
    MLX5_ROCE_HW_COUNTERS,
    ROCE_V1,
    ROCE_V2,
    UVERBS_ABI_VERSION,
    ZERO_GID_LINE,
    HcaSpec,
    PortSpec,
    gid_line,
    link_local,
    port_guid,
    replace_line,
    replace_lines,
    symlink,
    write,
    write_line,
)


class SimNode(PciTree):
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
        symlink(lo, self._s("class", "net", "lo"))
        if not rdma:
            return
        os.makedirs(self.dev_root / "infiniband", exist_ok=True)
        os.makedirs(self._s("class", "infiniband"), exist_ok=True)
        abis = (("infiniband_verbs", UVERBS_ABI_VERSION), ("infiniband_mad", MAD_ABI_VERSION))
        for kind, abi in abis:
            os.makedirs(self._s("class", kind), exist_ok=True)
            write_line(self._s("class", kind, "abi_version"), abi)
        os.makedirs(self._s("module", "ib_core", "parameters"), exist_ok=True)
        if netns_mode is not None:
            self.set_netns_mode(netns_mode)
        if rdma_cm:
            cm = self._s("devices", "virtual", "misc", "rdma_cm")
            os.makedirs(cm)
            write_line(os.path.join(cm, "dev"), "10:58")
            symlink(cm, self._s("class", "misc", "rdma_cm"))
            (self.dev_root / "infiniband" / "rdma_cm").touch()

    def _virtual_netdev(self, name: str) -> None:
        path = self._s("devices", "virtual", "net", name)
        if not os.path.isdir(path):
            os.makedirs(path)
            write_line(os.path.join(path, "operstate"), "up")
        link = self._s("class", "net", name)
        if not os.path.lexists(link):
            symlink(path, link)

    def _pci_netdev(self, pci_dir: str, name: str, dev_port: int, master: str | None) -> None:
        path = os.path.join(pci_dir, "net", name)
        os.makedirs(path)
        write_line(os.path.join(path, "dev_port"), str(dev_port))
        write_line(os.path.join(path, "operstate"), "up")
        if master is not None:
            self._virtual_netdev(master)
            symlink(self._s("devices", "virtual", "net", master), os.path.join(path, "master"))
        link = self._s("class", "net", name)
        if os.path.lexists(link):
            os.unlink(link)
        symlink(path, link)

    def _make_pci_function(self, spec: HcaSpec, address: str) -> str:
        self._make_bridges(*topology(spec))
        pci = self._pci_dir(spec, address)
        os.makedirs(pci, exist_ok=True)  # the HCA's own directory below it may exist already
        self._bus_link(pci)
        write_line(os.path.join(pci, "vendor"), spec.vendor)
        write_line(os.path.join(pci, "device"), spec.device)
        write_line(os.path.join(pci, "class"), "0x020000")
        numa = -1 if spec.numa_node is None else spec.numa_node
        write_line(os.path.join(pci, "numa_node"), str(numa))
        if spec.driver is not None:
            drv = self._s("bus", "pci", "drivers", spec.driver)
            os.makedirs(drv, exist_ok=True)
            symlink(drv, os.path.join(pci, "driver"))
        return pci

    def _make_parent(self, spec: HcaSpec, hca_dir: str) -> None:
        if spec.pci_address is not None:
            pci = self._make_pci_function(spec, spec.pci_address)
            symlink(pci, os.path.join(hca_dir, "device"))
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
            symlink(parent, os.path.join(hca_dir, "device"))
        if spec.soft_parent is not None:
            write_line(os.path.join(hca_dir, "parent"), spec.soft_parent)
        for port in spec.ports:
            if port.netdev is not None:
                self._virtual_netdev(port.netdev)

    def _gid_entries(self, spec: HcaSpec, number: int, port: PortSpec) -> list[tuple[bytes, str]]:
        if port.link_layer == "InfiniBand":
            gid = b"\xfe\x80" + b"\x00" * 6 + port_guid(spec.node_guid, number)
            return [(gid_line(ipaddress.IPv6Address(gid)), ROCE_V1)]
        if port.netdev is None:
            return []
        ips: list[ipaddress.IPv6Address] = []
        if port.ipv4 is not None:
            v4 = ipaddress.IPv4Address(port.ipv4)
            ips.append(ipaddress.IPv6Address(b"\x00" * 10 + b"\xff\xff" + v4.packed))
        if port.ipv6 is not None:
            ips.insert(0 if port.ipv6_first else len(ips), ipaddress.IPv6Address(port.ipv6))
        addrs = [link_local(spec.node_guid, number), *ips]
        # mlx5 fills the table v1, v2 per address, lowest free index first.
        return [(gid_line(a), t) for a in addrs for t in (ROCE_V1, ROCE_V2)]

    def _make_port(self, spec: HcaSpec, number: int, port: PortSpec, hca_dir: str) -> None:
        pd = os.path.join(hca_dir, "ports", str(number))
        gids = os.path.join(pd, "gids")
        types = os.path.join(pd, "gid_attrs", "types")
        ndevs = os.path.join(pd, "gid_attrs", "ndevs")
        for d in (gids, types, ndevs):
            os.makedirs(d)
        self._write_port_state(pd, port.up)
        write_line(os.path.join(pd, "link_layer"), port.link_layer)
        write_line(os.path.join(pd, "rate"), port.rate)
        write_line(os.path.join(pd, "lid"), f"0x{port.lid:x}")
        write_line(os.path.join(pd, "sm_lid"), f"0x{port.sm_lid:x}")
        write_line(os.path.join(pd, "cap_mask"), "0x00010000")
        entries = self._gid_entries(spec, number, port)[: port.gid_table_size]
        is_ib = port.link_layer == "InfiniBand"
        for index, (line, gid_type) in enumerate(entries):
            name = str(index)
            write(os.path.join(gids, name), line)
            write_line(os.path.join(types, name), gid_type)
            if not is_ib and port.netdev is not None:
                write_line(os.path.join(ndevs, name), port.netdev)
        # Unused entries: the gids file reads as zeros; types/ndevs fail on a real
        # kernel (EINVAL), so they are left out here rather than written.
        prefix = gids + os.sep
        unused = ZERO_GID_LINE if port.unused_gid is None else (port.unused_gid + "\n").encode()
        for index in range(len(entries), port.gid_table_size):
            write(prefix + str(index), unused)
        if port.counters:
            cdir = os.path.join(pd, "counters")
            os.makedirs(cdir)
            for counter in COUNTERS:
                write_line(os.path.join(cdir, counter), "0")
            if spec.driver == "mlx5_core":
                hdir = os.path.join(pd, "hw_counters")
                os.makedirs(hdir)
                names = MLX5_HW_COUNTERS + (() if is_ib else MLX5_ROCE_HW_COUNTERS)
                for counter in names:
                    write_line(os.path.join(hdir, counter), "0")
                write_line(os.path.join(hdir, HW_LIFESPAN), "10")

    @staticmethod
    def _write_port_state(port_dir: str, up: bool) -> None:
        write_line(os.path.join(port_dir, "state"), "4: ACTIVE" if up else "1: DOWN")
        write_line(os.path.join(port_dir, "phys_state"), "5: LinkUp" if up else "3: Disabled")

    def _make_char_device(self, spec: HcaSpec, kind: str, name: str, attrs: dict[str, str]) -> None:
        real = os.path.join(self._class_parent(spec, kind), name)
        os.makedirs(real)
        for attr, value in attrs.items():
            write_line(os.path.join(real, attr), value)
        if spec.pci_address is not None:
            symlink(self._pci_dir(spec, spec.pci_address), os.path.join(real, "device"))
        symlink(real, self._s("class", kind, name))
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
        write_line(os.path.join(hca_dir, "node_guid"), spec.node_guid)
        write_line(os.path.join(hca_dir, "sys_image_guid"), spec.node_guid)
        write_line(os.path.join(hca_dir, "node_type"), spec.node_type)
        write_line(os.path.join(hca_dir, "node_desc"), f"sim-node {spec.name}")
        for attr in ("fw_ver", "board_id", "hca_type"):
            value = getattr(spec, attr)
            if value is not None:
                write_line(os.path.join(hca_dir, attr), value)
        for number, port in enumerate(spec.ports, start=1):
            self._make_port(spec, number, port, hca_dir)
        symlink(hca_dir, str(self.hca_dir(spec.name)))
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
        port_dir = str(self.port_dir(hca, port))
        replace_lines({os.path.join(port_dir, "state"): "4: ACTIVE" if up else "1: DOWN",
                       os.path.join(port_dir, "phys_state"):
                           "5: LinkUp" if up else "3: Disabled"})
        ports = list(spec.ports)
        ports[port - 1] = replace(ports[port - 1], up=up)
        self.specs[hca] = replace(spec, ports=tuple(ports))

    def set_counter(self, hca: str, port: int, counter: str, value: int, *,
                    hw: bool = False) -> None:
        """Write one counter of ``ports/<port>/counters`` (``hw_counters`` with ``hw``)."""
        self._require(hca)
        cdir = self.port_dir(hca, port) / ("hw_counters" if hw else "counters")
        cdir.mkdir(exist_ok=True)
        replace_line(str(cdir / counter), str(value))

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
        write_line(path, values[mode])


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
