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
import tempfile

TEMP_PREFIX = ".rdma-hca-"
TEMP_SUFFIX = ".tmp"


def write_atomic(path: str, data: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` (UTF-8) in one rename, creating its directory.

    Blocks (fsync): call it off the event loop. Raises the OSError of the step that
    failed; the temp file is then removed and the old file stays as it was.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates the file 0600 whatever the umask; readers may need more.
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
