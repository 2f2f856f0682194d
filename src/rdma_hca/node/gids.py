"""GID tables: the hot loop of discovery, and what an entry in use looks like.

A node can have hundreds of ports with 256 entries each, almost all of them zero, so the
table is read with bare ``os.open``/``os.read`` relative to one directory descriptor; any
oddity sends the table to a careful path that names what is wrong.
"""

from __future__ import annotations

import ipaddress
import os

from rdma_hca.node.file_reads import Watch, check_exhausted
from rdma_hca.node.model import Gid, LinkLayer
from rdma_hca.node.sysfs_values import (
    GID_TEXT,
    GID_TYPES,
    MAX_GID_INDEX,
    ZERO_GID,
    ZERO_GID_LINE,
    attribute_text,
    classify,
    shown,
    unused_gid,
)
from rdma_hca.node.sysfs_walk import Walk

UsedEntry = tuple[int, str, bytes]


def nonzero_entries(
    dir_fd: int, entries: list[str], watch: Watch, gid_dir: str
) -> list[UsedEntry] | None:
    """(index, name, content) of the GID entries that are not all zeros.

    Each entry costs an open, a read and a close with nothing else in the loop (functions
    bound to locals, no per-entry try); the only extra is telling ``watch`` which entry is
    being read, so a supervisor can name a file that never answers. Returns None, having
    closed what it opened, if any name is not a plain number or any entry cannot be read;
    the caller then takes the careful path.
    """
    joined = "".join(entries)
    if not (joined.isascii() and joined.isdecimal()) or len(entries) > MAX_GID_INDEX:
        return None
    opener, reader, closer = os.open, os.read, os.close
    flags = os.O_RDONLY
    zero_line, zero = ZERO_GID_LINE, ZERO_GID
    used: list[UsedEntry] = []
    watch.seq += 1
    watch.base = gid_dir
    fd = -1
    try:
        for entry in entries:
            if watch.abandoned:
                return None  # given up on while a read hung: stop before the next one
            watch.entry = entry
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
    finally:
        watch.entry = ""
    if any(index >= MAX_GID_INDEX for index, _, _ in used):
        return None
    return used


class GidWalk(Walk):
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
            self.warn(f"cannot open {gid_dir} ({self.os_error(err)}); the port shows no GIDs")
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
            self.warn(f"cannot list {gid_dir} ({self.os_error(err)}); the port shows no GIDs")
            return [], []
        used = None
        if not self.io.any_stuck_under(gid_dir):
            used = nonzero_entries(dir_fd, entries, self.io.watch, gid_dir)
            self.io.checkpoint()
        if used is None:
            # Odd names, an unreadable or stuck entry: redo the table slowly, saying why.
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
    ) -> list[UsedEntry]:
        used: list[UsedEntry] = []
        for index, entry in self.numbered(gid_dir, entries, "a GID index", MAX_GID_INDEX):
            try:
                raw = self.io.read_at(dir_fd, gid_dir, entry)
            except OSError as err:
                check_exhausted(err)
                path = os.path.join(gid_dir, entry)
                self.warn(f"cannot read {path} ({self.os_error(err)}); skipping that GID")
                continue
            if raw not in (ZERO_GID_LINE, ZERO_GID):
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
        text = attribute_text(raw)
        if text is None or GID_TEXT.fullmatch(text) is None:
            self.warn(f"{path} holds {shown(raw)}, not a GID; skipping it")
            return None
        addr = ipaddress.IPv6Address(text)
        if unused_gid(addr.packed):
            return None
        gid_type = ""
        if have_types:
            type_path = os.path.join(port_dir, "gid_attrs", "types", entry)
            try:
                type_raw = self.io.read(type_path)
            except OSError as err:
                check_exhausted(err)
                # The kernel answers EINVAL for an entry that is not in use; a stale
                # address left in gids/N is then not a GID anyone can use.
                return None
            type_text = attribute_text(type_raw)
            if type_text in GID_TYPES:
                gid_type = type_text
            else:
                self.warn(
                    f"{type_path} holds {shown(type_raw)}, not 'IB/RoCE v1' or 'RoCE v2'; "
                    "GID type unknown"
                )
        netdev: str | None = None
        ndev_path = os.path.join(port_dir, "gid_attrs", "ndevs", entry)
        try:
            ndev_raw = self.io.read(ndev_path)
        except OSError as err:
            check_exhausted(err)  # InfiniBand GIDs have no netdev: the kernel answers EINVAL
        else:
            ndev_text = os.fsdecode(ndev_raw.rstrip(b"\n")).strip()
            if ndev_text:
                netdev = self.netdev_name(ndev_path, ndev_text)
        kind, ip = classify(addr, link_layer)
        return Gid(index=index, address=text, type=gid_type, kind=kind, netdev=netdev, ip=ip)
