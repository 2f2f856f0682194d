"""The small readers every part of discovery uses: optional text, checked text, names.

Nothing raises on bad content: each problem becomes one warning naming the path. Only
running out of a resource raises (``DiscoveryFailed``), because then the answer would be
wrong rather than incomplete.
"""

from __future__ import annotations

import os
import re

from rdma_hca.kit.text import natural_key
from rdma_hca.node.file_reads import Reads, check_exhausted
from rdma_hca.node.model import CharDevice
from rdma_hca.node.sysfs_values import (
    DEV_DIR,
    NETDEV,
    attribute_text,
    is_number,
    printable,
    shown,
    why,
)

StrPath = str | os.PathLike[str]


class Walk:
    """One pass over sysfs; collects warnings as it goes."""

    def __init__(self, sysfs_root: StrPath, dev_root: StrPath, io: Reads | None = None) -> None:
        self.sys = os.fspath(sysfs_root)
        self.dev = os.fspath(dev_root)
        self.real_sys = os.path.realpath(self.sys)
        self.io = io if io is not None else Reads()
        self.warnings: list[str] = []
        self._escaped_netdevs: set[str] = set()

    def warn(self, message: str) -> None:
        # Collected, not logged: the daemon rediscovers on every change and says each
        # warning once; `rdma-hca discover` prints them in its report. Paths may hold
        # bytes that are not UTF-8; the message must still print anywhere.
        self.warnings.append(printable(message))

    def path(self, *parts: str) -> str:
        return os.path.join(self.sys, *parts)

    def os_error(self, err: OSError) -> str:
        """Why a read failed, for a warning; raises when a resource ran out."""
        check_exhausted(err)
        return why(err)

    # -- small readers ---------------------------------------------------------------

    def raw(self, path: str) -> bytes | None:
        """Raw content, None when absent (quietly) or unreadable (with a warning)."""
        try:
            return self.io.read(path)
        except FileNotFoundError:
            return None
        except OSError as err:
            self.warn(f"cannot read {path} ({self.os_error(err)}); ignoring it")
            return None

    def text(self, path: str) -> str | None:
        """Optional attribute: None when absent (quietly) or unreadable (with a warning)."""
        raw = self.raw(path)
        if raw is None:
            return None
        text = attribute_text(raw)
        if text is None:
            self.warn(f"{path} holds unreadable content {shown(raw)}; ignoring it")
        return text

    def name_text(self, path: str) -> str | None:
        """A file holding a device name (``ibdev``), in the form names are shown in."""
        raw = self.raw(path)
        if raw is None:
            return None
        name = os.fsdecode(raw.rstrip(b"\n"))
        return printable(name) if name else None

    def matching(self, path: str, pattern: re.Pattern[str], expected: str) -> str | None:
        text = self.text(path)
        if text is None:
            return None
        if pattern.fullmatch(text) is None:
            self.warn(f"{path} holds {text!r}, expected {expected}; ignoring it")
            return None
        return text

    def number(self, path: str, limit: int, expected: str) -> int | None:
        """A decimal (or 0x hex) number below ``limit``; anything else is unknown."""
        text = self.text(path)
        if text is None:
            return None
        try:
            value = int(text, 16) if text.lower().startswith("0x") else int(text)
        except ValueError:
            value = -1
        if not 0 <= value < limit:
            self.warn(f"{path} holds {shown(text.encode())}, not {expected}; ignoring it")
            return None
        return value

    def netdev_name(self, path: str, name: str) -> str | None:
        undecodable = any("\udc80" <= c <= "\udcff" for c in name)
        if NETDEV.fullmatch(name) is None or not all(
            c.isprintable() or "\udc80" <= c <= "\udcff" for c in name
        ):
            self.warn(f"{path} names {name!r}, which is not a valid netdev name; ignoring it")
            return None
        if not undecodable:
            return name
        # Linux allows any bytes but '/', ':' and blanks; keep the netdev, show it escaped.
        escaped = printable(name)
        if escaped not in self._escaped_netdevs:  # once, not once per GID naming it
            self._escaped_netdevs.add(escaped)
            self.warn(f"{path} names a netdev whose name is not UTF-8 text; shown as {escaped}")
        return escaped

    def link_target(self, path: str) -> str:
        try:
            return os.readlink(path)
        except OSError as err:
            return f"<unreadable: {self.os_error(err)}>"

    def numbered(
        self, parent: str, entries: list[str], what: str, limit: int
    ) -> list[tuple[int, str]]:
        """Entries named by a number below ``limit``, sorted by it; others get a warning
        and are dropped."""
        numbered: list[tuple[int, str]] = []
        for entry in entries:
            if is_number(entry) and int(entry) < limit:
                numbered.append((int(entry), entry))
            else:
                self.warn(f"ignoring {os.path.join(parent, entry)}: its name is not {what}")
        numbered.sort()
        return numbered

    def listdir(self, path: str) -> list[str]:
        """Entries of a directory; raises OSError (FileNotFoundError when it is gone)."""
        try:
            return os.listdir(path)
        except OSError as err:
            check_exhausted(err)
            raise

    def char_device(self, name: str) -> CharDevice:
        present = os.path.exists(os.path.join(self.dev, "infiniband", name))
        return CharDevice(name=name, path=f"{DEV_DIR}/{name}", present=present)

    def class_dirs(self, kind: str) -> list[tuple[str, str]]:
        """Directory entries of ``class/<kind>`` (symlinks followed), naturally sorted.

        Plain files such as ``abi_version`` sit beside the device entries and are skipped;
        a dangling symlink is a device that is half gone and gets a warning.
        """
        cls = self.path("class", kind)
        try:
            names = self.listdir(cls)
        except FileNotFoundError:
            return []
        except OSError as err:
            self.warn(f"cannot list {cls} ({why(err)}); treating it as empty")
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
