"""The probe socket: one instance's own ``/healthz`` and ``/readyz``, on a unix socket.

On the host network two instances of the daemon run side by side during a rolling update
(the DRA driver alone) and share the node's TCP metrics port, so a probe over TCP reaches
whichever instance the kernel picks. The probe socket is the instance's own: its name
carries the pod's UID and it sits in the pod's own scratch directory, so an exec probe
(``python -m rdma_hca.tools.probe readyz``) asks exactly the pod it runs in.

The client is the standard library only and blocking: a probe runs every few seconds
as a process of its own, and what it imports is what it costs. So it imports no more than
the interpreter has loaded already: the C socket module rather than ``socket`` (which
loads ``selectors``, ``enum`` and more), and its types only for the type checker.
"""

from __future__ import annotations

import _socket
import os

# Not typing.TYPE_CHECKING: importing typing would cost the probe what it saves.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# sun_path holds 108 bytes with the terminating NUL.
UNIX_PATH_MAX = 107
NAME_PREFIX = "rdma-hca-"
NAME_SUFFIX = ".sock"
MAX_ANSWER = 64 * 1024


def default_dir(env: Mapping[str, str]) -> str:
    """The scratch directory both sides agree on: ``$TMPDIR``, else ``/tmp`` (the chart's
    emptyDir). Not ``tempfile.gettempdir()``: it writes a file to choose, and may choose
    differently in the daemon and in a probe process."""
    return env.get("TMPDIR") or "/tmp"


def probe_socket_path(directory: str, pod_uid: str) -> str:
    """Where the instance of pod ``pod_uid`` listens in ``directory``."""
    return os.path.join(directory, f"{NAME_PREFIX}{pod_uid}{NAME_SUFFIX}")


class ProbeError(Exception):
    """The instance did not answer; the message is one line."""


def ask(path: str, endpoint: str, timeout: float) -> tuple[int, str]:
    """GET ``endpoint`` from the instance at ``path``: (HTTP status, body)."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(f"GET {endpoint} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
        data = b""
        while len(data) < MAX_ANSWER:
            chunk = s.recv(MAX_ANSWER - len(data))
            if not chunk:
                break
            data += chunk
    except FileNotFoundError:
        raise ProbeError(f"no probe socket at {path}: the daemon has not started its "
                         "HTTP endpoints yet, or runs in another pod") from None
    except TimeoutError:
        raise ProbeError(f"the daemon at {path} did not answer within {timeout:g} s") \
            from None
    except OSError as exc:
        raise ProbeError(f"cannot ask the daemon at {path}: {exc.strerror or exc}") \
            from None
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ProbeError(f"the daemon at {path} gave no HTTP answer")
    return int(parts[1]), body.decode("utf-8", "replace")
