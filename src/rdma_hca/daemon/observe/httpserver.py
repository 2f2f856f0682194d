"""``/metrics``, ``/healthz`` and ``/readyz`` on one small asyncio HTTP server.

It reads the daemon only through a status snapshot (a callable returning a frozen
:class:`Status`). ``/metrics`` renders that snapshot on a worker thread, so what a
scrape costs the event loop does not grow with the node. Concurrent connections are
capped: the port may listen on every address of the node (hostNetwork), and a flood
of connections must not take the file descriptors discovery needs; a client over the
cap gets 503 at once and the connection is closed.

Two instances share the TCP port during a rolling update of the DRA driver alone (the
new pod starts beside the old one on the host network): only then (``share_port``) is the
port bound with SO_REUSEPORT, which the kernel grants only to sockets of the same user
that all ask for it, so a second instance of the same DaemonSet shares it while any other
program holding the port still makes the start fail with "already in use". Which instance
answers a TCP request is then the kernel's choice; what must be an instance's own (its
probes) is also served on its probe socket (``rdma_hca.kit.probe``), a unix socket named
after its pod. In every other mode the port is this instance's alone: a second release
on the node, or a second ``serve``, is refused with "already in use" instead of sharing
the port and answering the other's liveness.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rdma_hca.kit.probe import UNIX_PATH_MAX
from rdma_hca.kit.workers import WORKERS

if TYPE_CHECKING:
    from rdma_hca.daemon.observe.metrics import Collects
    from rdma_hca.daemon.observe.status import Status

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
READ_TIMEOUT = 5.0
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class BindError(Exception):
    """The HTTP address cannot be listened on; the message is one line for the operator."""


def split_address(address: str) -> tuple[str | None, int]:
    """``HOST:PORT`` (``[v6]:PORT``, or ``:PORT`` for every address) as (host, port)."""
    host, _, port = address.rpartition(":")
    return (host.removeprefix("[").removesuffix("]") or None), int(port)


def _response(status: int, ctype: str, body: Sequence[bytes], head_only: bool = False) -> bytes:
    """The response's bytes; the body comes in parts (a scrape's page is three, together
    over half a megabyte on a large node) so that it is copied once, here."""
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {sum(map(len, body))}\r\nConnection: close\r\n\r\n").encode()
    return head if head_only else b"".join((head, *body))


class MetricsServer:
    def __init__(self, status: Callable[[], Status], address: str, *,
                 collectors: Iterable[Collects] = (),
                 on_scrape: Callable[[], None] | None = None,
                 max_connections: int = MAX_CONNECTIONS,
                 probe_socket: str | None = None,
                 share_port: bool = False) -> None:
        self.status = status
        self.probe_socket = probe_socket
        self.share_port = share_port
        self.address = address
        self.host, self.port = split_address(address)
        self.collectors = tuple(collectors)
        self.on_scrape = on_scrape
        self.max_connections = max_connections
        self.rejected = 0
        self._active = 0
        self._server: asyncio.Server | None = None
        self._probe: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._ports: Any = None  # port_metrics.PortText, made by the first scrape

    @property
    def bound_port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._accept, self.host, self.port,
                                                      reuse_port=self.share_port)
        except OSError as exc:
            why = ("the address is already in use" if exc.errno == errno.EADDRINUSE
                   else exc.strerror or str(exc))
            raise BindError(f"cannot serve HTTP on {self.address!r}: {why}; choose another "
                            "HOST:PORT with --metrics-address (metricsAddress), or leave it "
                            "empty to turn the endpoints off") from None
        if self.probe_socket is not None:
            await self._start_probe(self.probe_socket)
        log.info("serving /metrics, /healthz and /readyz on %s (port %d)%s",
                 self.address, self.bound_port,
                 f", and on the probe socket {self.probe_socket}" if self.probe_socket else "")

    async def _start_probe(self, path: str) -> None:
        if len(os.fsencode(path)) > UNIX_PATH_MAX:
            await self.stop()
            raise BindError(f"cannot serve the probe socket {path}: the path is longer than "
                            f"{UNIX_PATH_MAX} bytes; set TMPDIR to a shorter directory")
        # A socket left by this pod's previous container (the scratch directory outlives
        # it); anything else at the path is not ours to remove.
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        except FileNotFoundError:
            pass
        try:
            self._probe = await asyncio.start_unix_server(self._accept, path)
            os.chmod(path, 0o600)
        except OSError as exc:
            await self.stop()
            raise BindError(f"cannot serve the probe socket {path}: "
                            f"{exc.strerror or exc}") from None

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None
            if self.probe_socket is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self.probe_socket)
        if self._server is not None:
            self._server.close()
            for t in list(self._handlers):
                t.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    async def respond(self, path: str) -> tuple[int, str, Sequence[bytes]]:
        path = path.split("?", 1)[0]
        if path == "/metrics":
            if self.on_scrape is not None:
                self.on_scrape()
            status, rejected = self.status(), self.rejected
            ctype, body = await WORKERS.run(lambda: self._render(status, rejected),
                                            "rdma-hca-scrape")
            return 200, ctype, body
        if path == "/healthz":
            alive = self.status().liveness(time.time())
            if alive.ok:
                return 200, "text/plain", (b"ok\n",)
            return 503, "text/plain", ((alive.reason + "\n").encode(),)
        if path == "/readyz":
            s = self.status()
            if s.ready:
                return 200, "text/plain", (b"registered with the kubelet\n",)
            return 503, "text/plain", (("not registered yet: " + ", ".join(s.waiting)
                                        + "\n").encode(),)
        return 404, "text/plain", (b"not found: try /metrics, /healthz or /readyz\n",)

    @property
    def port_texts_made(self) -> int:
        """How many times the per-port text was made, by a counter refresh or a scrape."""
        return 0 if self._ports is None else int(self._ports.made)

    async def counters_read(self) -> None:
        """Make the per-port text of the counters just read, before a scrape asks for it.

        The counters are re-read every few seconds while someone scrapes, and a scrape
        after a busy interval would otherwise format thousands of new values while the
        scraper waits (most of its time on a large node). Made here, on the refresh's
        time, a scrape finds the page's largest part made. Nothing is made before the
        first scrape, which loads the Prometheus client."""
        ports = self._ports
        if ports is None:
            return
        s = self.status()
        try:
            await WORKERS.run(lambda: ports.get(s.hcas, s.counters, s.state_changes),
                              "rdma-hca-scrape")
        except Exception:
            # The next scrape makes the text itself, and says what fails.
            log.exception("could not make the port counters' /metrics text ahead of a scrape")

    def _render(self, status: Status, rejected: int) -> tuple[str, list[bytes]]:
        # On the scrape's worker thread: the first scrape loads the Prometheus client there,
        # not at start (registering does not need it) and not on the event loop.
        from rdma_hca.daemon.observe.metrics import CONTENT_TYPE, render_parts
        from rdma_hca.daemon.observe.port_metrics import PortText

        if self._ports is None:
            self._ports = PortText()
        return CONTENT_TYPE, render_parts(status, self.collectors, rejected, self._ports)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._active >= self.max_connections:
            self.rejected += 1
            with contextlib.suppress(Exception):
                writer.write(_response(503, "text/plain", (b"too many connections\n",)))
                writer.close()
            return
        self._active += 1
        self._handlers.add(task)
        try:
            await self._handle(reader, writer)
        finally:
            self._active -= 1
            self._handlers.discard(task)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            line = request.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(line) < 2 or line[0] not in {"GET", "HEAD"}:
                status, ctype = 405, "text/plain"
                body: Sequence[bytes] = (b"only GET is supported\n",)
            else:
                status, ctype, body = await self.respond(line[1])
            writer.write(_response(status, ctype, body, head_only=bool(line) and line[0] == "HEAD"))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
