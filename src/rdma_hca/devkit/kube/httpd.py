"""The fake API server's HTTP(S) side: keep-alive connections, bearer tokens and TLS client
certificates checked, every request recorded, faults acted out, answers as JSON."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import sys
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import yaml

from rdma_hca.devkit.kube.apply import APPLY_PATCH, with_manager
from rdma_hca.devkit.kube.cluster import FakeCluster, Recorded
from rdma_hca.devkit.kube.errors import HttpError, status_object
from rdma_hca.devkit.kube.faults import Fault, reason_for
from rdma_hca.devkit.kube.validation import Invalid


class Api(Protocol):
    """What the HTTP side needs of the server it fronts."""

    cluster: FakeCluster
    on_request: Callable[[Recorded], None] | None
    stopping: threading.Event

    def take_fault(self, method: str, path: str) -> Fault | None: ...

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: dict[str, Any] | None,
               content_type: str = "application/json") -> tuple[int, dict[str, Any]]: ...


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # Clients keep connections alive; closing must not wait for them to hang up.
    block_on_close = False

    def __init__(self, api: Api) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api = api

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-request (a driver stopping) is not an error here.
        if not isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect
    # Headers and body go out in two writes; with Nagle on, the body waits for the
    # client's delayed ACK (40 ms), which no real API server makes a client wait.
    disable_nagle_algorithm = True
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _client_cn(self) -> str | None:
        if not isinstance(self.connection, ssl.SSLSocket):
            return None
        cert = self.connection.getpeercert() or {}
        subject: Any = cert.get("subject", ())
        names = {key: value for rdn in subject for key, value in rdn}
        return str(names["commonName"]) if "commonName" in names else None

    def _serve(self, method: str) -> None:
        api = self.server.api
        cluster = api.cluster
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        auth = self.headers.get("Authorization")
        agent = self.headers.get("User-Agent")
        record = Recorded(method, url.path, query, auth, self._client_cn(), agent)
        cluster.requests.append(record)
        if api.on_request is not None:
            api.on_request(record)
        fault = api.take_fault(method, url.path)
        if fault is not None and fault.kind == "reset":
            self._reset()
            return
        if fault is not None and fault.kind == "hang":
            api.stopping.wait(fault.seconds)
            self.close_connection = True
            return
        if fault is not None and fault.kind == "hold":
            fault.wait_released(api.stopping)
            fault = None
        headers: dict[str, str] = {}
        try:
            if fault is not None:
                if fault.retry_after is not None:
                    headers["Retry-After"] = fault.retry_after
                raise HttpError(fault.code, reason_for(fault.code),
                                f"injected fault: HTTP {fault.code}")
            if cluster.token is not None and auth != f"Bearer {cluster.token}":
                raise HttpError(401, "Unauthorized", "Unauthorized")
            content_type = self.headers.get("Content-Type") or ""
            # An apply patch is YAML (JSON is YAML); everything else here is JSON.
            body = ((yaml.safe_load(raw) if content_type.startswith(APPLY_PATCH)
                     else json.loads(raw)) if raw else None)
            if body is not None and not isinstance(body, dict):
                raise HttpError(400, "BadRequest", "the body must be a JSON object")
            code, answer = api.handle(method, url.path, with_manager(
                method, query, content_type, agent or ""), body, content_type)
        except HttpError as exc:
            if exc.code == 404 and cluster.plain_404 and "could not find" in str(exc):
                self._send_raw(404, b"404 page not found\n", "text/plain; charset=utf-8", {})
                return
            code, answer = exc.code, status_object(exc.code, exc.reason, str(exc), exc.details)
        except Invalid as exc:
            code, answer = 422, status_object(422, "Invalid", f"is invalid: {exc}")
        except (ValueError, yaml.YAMLError) as exc:
            code, answer = 400, status_object(400, "BadRequest", f"invalid JSON: {exc}")
        self._send_raw(code, json.dumps(answer).encode(), "application/json", headers)

    def _send_raw(self, code: int, data: bytes, content_type: str,
                  headers: dict[str, str]) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _reset(self) -> None:
        # SO_LINGER with a zero timeout: close() sends RST instead of FIN.
        sock = self.connection
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        except OSError:
            pass
        self.close_connection = True

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")
