"""Which claims are prepared, kept on disk across restarts and shared between instances.

The format is ``contract/checkpoint.py``'s (the doctor reads it too): versioned, with a
checksum of its claims; version 1 (no checksum) is read and written back as the current
version. Two instances of the driver run side by side during a
rolling update: both write this one file, always as read-modify-write under a lock
(an open-file-description record lock on ``claims.lock``), so neither loses the
other's claims. The same lock file holds one lock per claim, so a claim is prepared or
unprepared by one instance at a time. Open-file-description locks (not the classic
per-process ``lockf``) belong to the descriptor: they exclude two instances even
within one process, and closing some other descriptor of the file drops none of them.
Everything here blocks: the driver calls it off the loop, and commits the changes of
claims that are ready at the same moment in one write (``groupcommit.py``). A caller off
the loop gives up at its deadline, but its thread cannot be stopped: so the file lock is
tried again and again rather than waited for (a thread blocked in the kernel would take
it, and write, long after its caller had gone), and an update whose deadline passed
before its write gives up instead of writing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Mapping

from rdma_hca.contract.checkpoint import (
    CHECKPOINT_VERSION,
    CheckpointError,
    Claims,
    EncodedClaims,
    PreparedClaim,
    encode,
    load_checkpoint,
)
from rdma_hca.daemon.dra.files import StagedFile
from rdma_hca.kit.backoff import Backoff

log = logging.getLogger(__name__)

_FILE_LOCK = 0  # byte 0 of the lock file: the checkpoint itself; claims lock bytes 1..2^48
DEADLINE = 5.0  # seconds an update may take, unless the caller says otherwise
# Of an update's deadline, the part it may wait for the file lock: the rest is left for the
# read and the write, so that the write begins before the caller stops waiting.
LOCK_SHARE = 0.8
LOCK_RETRY_FIRST = 0.002
LOCK_RETRY_MAX = 0.05


class CheckpointBusy(OSError):
    """An update gave up before writing: the lock was held elsewhere past its deadline."""


def write_file(path: str, text: str, before_rename: Callable[[], None] | None = None) -> None:
    """Replace the file in one rename, after an fsync; then fsync the directory, so that
    the rename itself survives a power loss (else the old file may come back).
    ``before_rename``: called once the new text is durable, just before the rename; when
    it raises, nothing is renamed."""
    staged = StagedFile(path, text, 0o600)
    staged.flush()
    # Opened before the rename: between the rename and the directory's fsync the thread
    # takes the GIL back once, not twice (the rename wakes the loop's follower, which
    # wants it too).
    try:
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if before_rename is not None:
                before_rename()
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        staged.discard()
        raise
    try:
        staged.place()
        os.fsync(fd)
    finally:
        os.close(fd)


# struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for an OFD lock), padding.
_FLOCK = "hhqqi4x"


def _ofd_lock(fd: int, kind: int, offset: int) -> bool:
    """Lock (or, with F_UNLCK, unlock) one byte; False when it is held elsewhere.

    Never waits (F_OFD_SETLK, not F_OFD_SETLKW): callers retry within their deadline.
    """
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, offset, 1, 0))
    except (BlockingIOError, PermissionError):
        return False
    return True


def claim_offset(uid: str) -> int:
    """The byte of the lock file that stands for one claim (never the checkpoint's byte)."""
    return 1 + int.from_bytes(hashlib.sha256(uid.encode()).digest()[:6], "big")


FileId = tuple[int, int, int, int]

# Filesystems whose record locks the kernel keeps itself (no ``lock`` method of their own
# that asks a server): there a lock tried without waiting never sleeps.
LOCAL_LOCKS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay",
                          "f2fs", "ramfs", "zfs"})


def filesystem_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem ``path`` is on (None: not known)."""
    path = os.path.realpath(path)
    best, kind = -1, None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields, _, tail = line.partition(" - ")
                parts = fields.split()
                if len(parts) < 5 or not tail:
                    continue
                # Spaces in a mount point are written as \040.
                point = parts[4].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) > best:
                    best, kind = len(point), tail.split()[0]
    except OSError:
        return None
    return kind


def _file_id(path: str) -> FileId | None:
    """Which version of the file is there: every write is a rename to a new inode."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


class Checkpoint:
    """The checkpoint file and its lock file; each method blocks (run it off the loop).

    Threads of one instance share its descriptor, so its locks do not exclude them from
    each other: updates also take a lock of this instance, and the driver never works
    on one claim twice at a time. ``deadline``: seconds an update may take (the caller's
    own deadline for it).
    """

    def __init__(self, path: str, lock_path: str, *,
                 write: Callable[[str, str], None] | None = None,
                 deadline: float = DEADLINE) -> None:
        self.path = path
        self.lock_path = lock_path
        # (path, text): one durable write of the whole file; by default ``write_file``,
        # calling an update's ``before_rename`` between the fsync and the rename.
        self.write = write or self._write_file
        self._before_rename: Callable[[], None] | None = None
        self.deadline = deadline
        self.writes = 0  # whole-file writes made (each one fsync), counted once done
        # Writes of ours begun, counted before their rename: a follower may skip as many
        # of the file's rename events (``follow.py``). A write that fails takes its count
        # back and calls ``on_unsure`` (from its thread): whether it renamed is not known.
        self.renames = 0
        self.on_unsure: Callable[[], None] | None = None
        self.lock_waits = 0  # times the file lock was held elsewhere when tried
        # A version written by another instance was read under the lock and carried into
        # a write of ours: what the follower must hand on although the file is ours now.
        self._merged_foreign = False
        self._merged_lock = threading.Lock()
        self._fd: int | None = None
        # The claims' locks may be tried and dropped on the event loop: see open().
        self.locks_now = False
        self._local = threading.Lock()
        self.written: FileId | None = None  # the version this instance wrote last
        # The claims of the version last read or written: a file nobody else wrote since
        # costs a stat, not a parse.
        self._cache: tuple[FileId, Claims] | None = None
        # Each claim's JSON as last written: a write encodes only the claims it changed.
        self._encoded = EncodedClaims()

    def open(self) -> None:
        """Open the lock file (blocks). On a filesystem whose locks the kernel keeps
        itself, trying a claim's lock then costs one ``fcntl(F_OFD_SETLK)`` on this open
        descriptor: it takes the kernel's lock list spinlock, never sleeps and never
        touches the disk, so it may run on the event loop (``locks_now``); elsewhere (a
        network filesystem asks its server) it runs off the loop."""
        if self._fd is None:
            os.makedirs(os.path.dirname(self.lock_path) or ".", exist_ok=True)
            self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self.locks_now = filesystem_of(self.lock_path) in LOCAL_LOCKS

    def close(self) -> None:
        self.locks_now = False
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _lock_fd(self) -> int:
        self.open()
        assert self._fd is not None
        return self._fd

    def try_lock_claim(self, uid: str) -> bool:
        """Take the claim's lock unless another instance holds it; True when taken."""
        return _ofd_lock(self._lock_fd(), fcntl.F_WRLCK, claim_offset(uid))

    def unlock_claim(self, uid: str) -> None:
        if self._fd is not None:
            _ofd_lock(self._fd, fcntl.F_UNLCK, claim_offset(uid))

    def read(self) -> tuple[Claims, int]:
        ident = _file_id(self.path)
        if ident is not None and self._cache is not None and self._cache[0] == ident:
            return dict(self._cache[1]), CHECKPOINT_VERSION
        claims, version = load_checkpoint(self.path)
        if ident is not None and version == CHECKPOINT_VERSION:
            self._cache = (ident, dict(claims))
        return claims, version

    def version(self) -> FileId | None:
        """Which version of the file is there now (None: no file)."""
        return _file_id(self.path)

    def take_merged_foreign(self) -> bool:
        """Whether a write of ours carried another instance's version since last asked."""
        with self._merged_lock:
            merged, self._merged_foreign = self._merged_foreign, False
        return merged

    def _write_file(self, path: str, text: str) -> None:
        hook, self._before_rename = self._before_rename, None
        write_file(path, text, hook)

    def update(self, change: Callable[[Claims], None], fallback: Mapping[str, PreparedClaim],
               *, force: bool = False, deadline: float | None = None,
               before_rename: Callable[[], None] | None = None) -> Claims:
        """Read the file under the lock, apply ``change``, write it back; the new claims.

        What another instance wrote since we last looked is kept. A file that cannot be
        read is replaced by ``fallback`` (what this instance knows) with the change. The
        file is written only when the claims changed, unless ``force`` (a migration).
        ``deadline`` (``time.monotonic()``; by default ``self.deadline`` from now): the
        lock not taken in time, or the time up before the write, raises
        :class:`CheckpointBusy` and nothing is written. ``before_rename``: called under the
        lock once the new version is durable in its temp file, before the rename (with a
        write given at construction, before the write); raising, it stops the write.
        """
        start = time.monotonic()
        end = start + self.deadline if deadline is None else deadline
        lock_by = start + max(0.0, end - start) * LOCK_SHARE
        if not self._local.acquire(timeout=max(0.0, lock_by - time.monotonic())):
            raise CheckpointBusy(f"another update of {self.path} in this instance took over "
                                 f"{end - start:.3g} s")
        try:
            fd = self._lock_fd()
            self._lock_file(fd, lock_by, end - start)
            try:
                try:
                    found = _file_id(self.path)
                    claims, _ = self.read()
                except CheckpointError as exc:
                    log.warning("%s; writing it anew from the claims this instance knows", exc)
                    claims = dict(fallback)
                before = dict(claims)
                change(claims)
                if force or claims != before:
                    if time.monotonic() > end:
                        raise CheckpointBusy(f"gave up writing {self.path}: its caller's "
                                             f"deadline of {end - start:.3g} s passed")
                    self.renames += 1
                    try:
                        text = encode(claims, self._encoded)
                        if self.write == self._write_file:
                            self._before_rename = before_rename
                        elif before_rename is not None:
                            before_rename()  # a write given at construction: first
                        self.write(self.path, text)
                    except BaseException:
                        self._before_rename = None
                        self.renames -= 1
                        if self.on_unsure is not None:
                            self.on_unsure()
                        raise
                    # Counted once in place: the follower reads again when this moved
                    # during its read, so a version older than ours is never handed on
                    # after a Prepare has gone on with its entry.
                    self.writes += 1
                    if found is not None and found != self.written:
                        with self._merged_lock:
                            self._merged_foreign = True
                    self.written = _file_id(self.path)
                    if self.written is not None:
                        self._cache = (self.written, dict(claims))
                elif before_rename is not None:  # the file holds the change already
                    before_rename()
                return claims
            finally:
                _ofd_lock(fd, fcntl.F_UNLCK, _FILE_LOCK)
        finally:
            self._local.release()

    def _lock_file(self, fd: int, by: float, budget: float) -> None:
        """The checkpoint's lock, tried until ``by``: never a thread blocked in the kernel."""
        backoff = Backoff(LOCK_RETRY_FIRST, LOCK_RETRY_MAX)
        while not _ofd_lock(fd, fcntl.F_WRLCK, _FILE_LOCK):
            self.lock_waits += 1
            left = by - time.monotonic()
            if left <= 0:
                raise CheckpointBusy(f"another instance of the driver held the lock of "
                                     f"{self.path} (in {self.lock_path}) for {budget:.3g} s")
            time.sleep(min(backoff.next(), left))
