"""The one place discovery reads files, so a read that never returns can be watched.

A sysfs attribute is produced by a driver when it is read; a driver waiting on stuck HCA
firmware makes the read hang, and no timeout in Python can interrupt it. So reads are
not interrupted but watched: the reading thread says what it is reading (``Watch``), a
supervisor (``node.deadline_reader``) notices a read that passes its deadline, gives that thread
up and remembers the path as stuck. Until the hung read returns, every read of that path
answers at once with ``ReadStalled``, so at most one thread ever hangs on one file.

Plain ``Reads`` has none of that and costs nothing: the daemon's tests and the benchmarks
use it through ``discover_node``; ``GuardedReads`` adds the checks.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from rdma_hca.node.sysfs_values import MAX_READ, printable

T = TypeVar("T")

# Running out of these makes every read fail; taking that as "no HCAs" would make the
# daemon withdraw every device from the kubelet.
_EXHAUSTED = {
    errno.EMFILE: "file descriptors of this process (EMFILE)",
    errno.ENFILE: "file descriptors of the system (ENFILE)",
    errno.ENOMEM: "kernel memory (ENOMEM)",
}


class DiscoveryFailed(Exception):
    """Discovery could not run to the end because a resource ran out (file descriptors,
    memory, threads); its answer would be wrong, so there is none. Keep the last one."""


class ReadStalled(OSError):
    """The file did not answer within the deadline, or an earlier read of it still hangs."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.ETIMEDOUT, "did not answer within the deadline", path)


class Abandoned(BaseException):
    """Raised in a reading thread its supervisor gave up on; it only unwinds that thread
    (a BaseException, so no ``except Exception`` in discovery takes it for bad content)."""


def check_exhausted(err: OSError) -> None:
    """Raise DiscoveryFailed when ``err`` says a resource ran out rather than a bad file."""
    what = _EXHAUSTED.get(err.errno or 0)
    if what is not None:
        where = f" reading {printable(err.filename)}" if isinstance(err.filename, str) else ""
        raise DiscoveryFailed(f"discovery ran out of {what}{where}") from err


def read_file(path: str) -> bytes:
    """One attribute's raw bytes; raises OSError like the kernel does (EINVAL, ENOENT...)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, MAX_READ)
    finally:
        os.close(fd)


class Watch:
    """What one reading thread is doing, for its supervisor to look at.

    ``seq`` moves on every read; ``base``/``entry`` name the file (the GID loop sets only
    ``entry`` per file, which is cheaper than building a path). ``owner`` is the HCA the
    thread is reading about. The supervisor sets ``abandoned`` and ``stuck_path``.
    """

    __slots__ = ("abandoned", "base", "entry", "owner", "seq", "stuck_path")

    def __init__(self) -> None:
        self.seq = 0
        self.base = ""
        self.entry = ""
        self.owner: str | None = None
        self.abandoned = False
        self.stuck_path: str | None = None

    def path(self) -> str:
        return os.path.join(self.base, self.entry) if self.entry else self.base


class StuckFiles:
    """Paths whose read still hangs (shared by every call of one reader), and their HCA."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.paths: dict[str, str | None] = {}
        self.stalls_total = 0

    def give_up(self, watch: Watch, seen: tuple[int, str, str]) -> str | None:
        """Mark the read ``watch`` has been doing since ``seen`` as stuck; None when the
        thread moved on in the meantime."""
        with self.lock:
            if (watch.seq, watch.base, watch.entry) != seen or watch.abandoned:
                return None
            path = watch.path()
            watch.abandoned = True
            watch.stuck_path = path
            self.paths[path] = watch.owner
            self.stalls_total += 1
            return path

    def release(self, watch: Watch) -> None:
        """Called by an abandoned thread when its read came back: the path may be read
        again. Always raises Abandoned so the thread stops."""
        with self.lock:
            path = watch.stuck_path
            if path is not None:
                # Said before the path is free, so whoever sees it free has seen this too.
                logging.getLogger(__name__).info(
                    "sysfs: %s answered again; it is read normally from now on",
                    printable(path))
                self.paths.pop(path, None)
                watch.stuck_path = None
        raise Abandoned

    def owners(self) -> set[str]:
        with self.lock:
            return {o for o in self.paths.values() if o is not None}


class Reads:
    """Direct reads, for a caller that accepts hanging with the file (no deadline)."""

    def __init__(self) -> None:
        self.watch = Watch()
        self.stalled: list[str] = []

    def read(self, path: str) -> bytes:
        return read_file(path)

    def read_at(self, dir_fd: int, base: str, entry: str) -> bytes:
        fd = os.open(entry, os.O_RDONLY, dir_fd=dir_fd)
        try:
            return os.read(fd, 128)
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def any_stuck_under(self, directory: str) -> bool:
        return False

    def working_on(self, owner: str | None) -> None:
        self.watch.owner = owner

    def checkpoint(self) -> None:
        """Where a thread that was given up on stops (the GID loop checks only here)."""


class GuardedReads(Reads):
    """Reads that a supervisor watches; a stuck path answers ReadStalled at once."""

    def __init__(self, stuck: StuckFiles) -> None:
        super().__init__()
        self.stuck = stuck

    def _refuse(self, path: str) -> None:
        # Once: working_on may have named it already (stuck in an earlier attempt).
        if path not in self.stalled:
            self.stalled.append(path)
        raise ReadStalled(path)

    def _watched(self, path: str, base: str, entry: str, call: Callable[[], T]) -> T:
        """``call()``, with the watch saying that it reads ``path``; a stuck path is
        refused at once, and a thread given up on stops once the call returns."""
        if path in self.stuck.paths:
            self._refuse(path)
        w = self.watch
        w.seq += 1
        w.base = base
        w.entry = entry
        try:
            return call()
        finally:
            if w.abandoned:
                self.stuck.release(w)

    def read(self, path: str) -> bytes:
        return self._watched(path, path, "", lambda: read_file(path))

    def read_at(self, dir_fd: int, base: str, entry: str) -> bytes:
        return self._watched(os.path.join(base, entry), base, entry,
                             lambda: Reads.read_at(self, dir_fd, base, entry))

    def listdir(self, path: str) -> list[str]:
        return self._watched(path, path, "", lambda: os.listdir(path))

    def working_on(self, owner: str | None) -> None:
        """Files of ``owner`` stuck in an earlier call (a counter, say) count as stalled
        for this one too: while one of its reads hangs, the HCA's state is unknown."""
        self.watch.owner = owner
        if owner is not None and self.stuck.paths:
            with self.stuck.lock:
                held = [p for p, o in self.stuck.paths.items() if o == owner]
            self.stalled.extend(p for p in held if p not in self.stalled)

    def any_stuck_under(self, directory: str) -> bool:
        if not self.stuck.paths:
            return False
        prefix = directory + os.sep
        return any(p.startswith(prefix) for p in list(self.stuck.paths))

    def checkpoint(self) -> None:
        w = self.watch
        if w.abandoned:
            self.stuck.release(w)
