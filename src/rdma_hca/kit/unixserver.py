"""A gRPC server on a unix socket that only its owner (root: the kubelet) can reach.

Both front ends serve the kubelet this way. Any local user who can connect to one of
these sockets could allocate devices, so the socket is created 0600 whatever the
process umask, its path is checked against the kernel's limit before bind (which would
otherwise fail with a message naming no path), and gRPC refuses requests larger than
the caller's limit before decoding them. A request that does not decode reaches the
handler as :class:`Malformed` (``lenient``), so the servicer answers it with one line of
its own instead of gRPC logging a traceback for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
# sun_path holds 108 bytes with the terminating NUL.
UNIX_PATH_MAX = 107


M = TypeVar("M", bound=Message)


class Malformed(Generic[M]):
    """A request body that does not decode as the message its method expects."""

    def __init__(self, kind: type[M], size: int, error: str) -> None:
        self.kind = kind
        self.size = size
        self.error = error[:200]

    def describe(self) -> str:
        return (f"the request ({self.size} bytes) is not a valid "
                f"{self.kind.DESCRIPTOR.full_name} message: {self.error}")


def lenient(kind: type[M]) -> Callable[[bytes], M | Malformed[M]]:
    """A deserializer that hands undecodable bytes to the handler instead of raising.

    gRPC logs a deserializer's exception as an ERROR with a traceback; the handler
    answers a Malformed request itself, with one WARNING.
    """

    def parse(data: bytes) -> M | Malformed[M]:
        try:
            return kind.FromString(data)
        except (DecodeError, ValueError, RuntimeError) as exc:
            return Malformed(kind, len(data), str(exc))

    return parse


def lenient_service(service: str, methods: Mapping[str, tuple[Callable[..., object],
                    type[Message], type[Message], bool]]) -> grpc.GenericRpcHandler[Any, Any]:
    """A service's handlers with lenient request parsing.

    ``methods``: name -> (handler, request type, response type, server streaming).
    """
    handlers = {}
    for name, (handler, request, response, streaming) in methods.items():
        make = (grpc.unary_stream_rpc_method_handler if streaming
                else grpc.unary_unary_rpc_method_handler)
        handlers[name] = make(handler, request_deserializer=lenient(request),
                              response_serializer=response.SerializeToString)
    return grpc.method_handlers_generic_handler(service, handlers)


class Throttle:
    """At most one line per key and interval, so a flood of bad requests is a few lines.

    ``allow(key)`` answers None while the key is quiet, otherwise how many lines were
    held back since the last one it allowed.
    """

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, key: str) -> int | None:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)


def socket_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a unix socket's path, or None when it can."""
    size = len(os.path.abspath(path).encode())
    if size > UNIX_PATH_MAX:
        return (f"the path {path} is {size} bytes, over the unix socket limit of "
                f"{UNIX_PATH_MAX}")
    return None


def _hidden_beside(path: str) -> str:
    """A random hidden name in ``path``'s directory, no longer than ``path`` when it can be
    (watchers such as the kubelet's skip names that start with a dot)."""
    directory, base = os.path.split(path)
    return os.path.join(directory, "." + os.urandom(8).hex()[:max(6, len(base) - 1)])


class UnixServer:
    """``add(server)`` puts the services on; ``start()``, ``on_disk()``, ``stop()``."""

    def __init__(self, path: str, add: Callable[[grpc.aio.Server], None], *,
                 max_receive_bytes: int, hint: str = "use a shorter directory") -> None:
        self.path = os.path.abspath(path)
        self._add = add
        self._max_receive = max_receive_bytes
        self._hint = hint
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._inode: tuple[int, int] | None = None

    async def start(self) -> None:
        problem = socket_path_problem(self.path)
        if problem is not None:
            raise OSError(f"{problem}; {self._hint}")
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        # Bound under a hidden name, then renamed over our path (and over a socket left by
        # a process killed with -9): gRPC removes the path it bound when it stops, which
        # must never be a socket another process has put on our name since.
        bound = _hidden_beside(self.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bound)
        server = grpc.aio.server(
            options=[("grpc.max_receive_message_length", self._max_receive)])
        self._add(server)
        # bind creates the socket with the process umask: narrow it for that one call so
        # the socket is never reachable by others, even for a moment. Nothing else
        # creates files meanwhile: this runs on the loop's thread, between awaits.
        old = os.umask(0o177)
        try:
            server.add_insecure_port("unix://" + bound)
        finally:
            os.umask(old)
        try:
            os.chmod(bound, SOCKET_MODE)
            os.rename(bound, self.path)
            st = os.stat(self.path)
            self._inode = (st.st_dev, st.st_ino)
            await server.start()
        except BaseException:
            await server.stop(None)
            raise
        self._server = server

    def on_disk(self) -> bool:
        """Our socket is still the file at our path (not removed, not replaced).

        A bound socket keeps its inode alive, so the number cannot be reused by another
        file while this server lives.
        """
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self._inode

    async def stop(self, grace: float = 0.5, before: Callable[[], None] | None = None) -> None:
        """Stop once, even if called again or if the caller is cancelled meanwhile.

        An interrupted gRPC server shutdown, or a second one started beside it, fails
        inside gRPC ("invalid state"); so the shutdown runs as one task of its own.
        ``before`` runs first (a servicer ending its streams).
        """
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace, before))
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float, before: Callable[[], None] | None) -> None:
        if before is not None:
            before()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        self.remove_socket()

    def remove_socket(self) -> None:
        """Remove our socket, but never a file someone else put on our name."""
        if self.on_disk():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
