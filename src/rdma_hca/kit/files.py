"""Writing a file so that a reader sees the old content or the new, never a part.

The daemon's CDI specs and the DRA driver's checkpoint are read by others at any time
(a container runtime, the driver itself after a crash): each is written to a temp file
in the same directory, flushed to disk, given its mode and renamed over the old one.
A rename within one directory is atomic, and containerd notices a spec only when it is
written or renamed inside the directory it watches.
"""

from __future__ import annotations

import contextlib
import os

TEMP_PREFIX = ".rdma-hca-"
TEMP_SUFFIX = ".tmp"


def _create_temp(directory: str) -> tuple[int, str]:
    """A new file of our own beside the target, as ``tempfile.mkstemp`` makes one (0600,
    never an existing name), without the standard library's tempfile module: it brings
    shutil, random and the compression modules, over half a MiB in every node daemon."""
    for _ in range(100):
        tmp = os.path.join(directory, f"{TEMP_PREFIX}{os.urandom(6).hex()}{TEMP_SUFFIX}")
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {directory}")


def write_temp(directory: str, data: str, mode: int = 0o644) -> str:
    """A new temp file in ``directory`` holding ``data`` (UTF-8), fsynced and given
    ``mode``: its path, for the caller to rename into place. Blocks (fsync). On a failure
    nothing is left behind."""
    fd, tmp = _create_temp(directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # The temp file is created 0600 whatever the umask; readers may need more.
        os.chmod(tmp, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def write_atomic(path: str, data: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` (UTF-8) in one rename, creating its directory.

    Blocks (fsync): call it off the event loop. Raises the OSError of the step that
    failed; the temp file is then removed and the old file stays as it was.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = write_temp(directory, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
