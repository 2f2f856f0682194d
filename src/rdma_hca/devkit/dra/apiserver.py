"""A fake Kubernetes API server for ResourceSlices and ResourceClaims, over real HTTP.

It speaks enough of the API for lightkube: create (with ``generateName``), get, list with
``fieldSelector``/``labelSelector``, replace with ``resourceVersion`` conflicts, delete
and delete-collection, ``Status`` objects for errors, and a bearer token. It validates
what a real server would refuse of a slice (pool, node, device names, counts) so a
driver bug shows up here and not on a cluster. Every request is recorded, so tests can
count the writes a driver made. It runs in a thread of its own: the driver under test
and its event loop reach it only through sockets.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

GROUP_VERSION = "resource.k8s.io/v1"
PREFIX = "/apis/resource.k8s.io/v1"
KINDS = {"resourceslices": "ResourceSlice", "resourceclaims": "ResourceClaim"}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS = 64


@dataclass(frozen=True, slots=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]


class HttpError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _selector_terms(selector: str) -> list[tuple[str, str, str | None]]:
    terms: list[tuple[str, str, str | None]] = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        m = re.match(r"^([^!=]+?)\s*(==|!=|=)\s*(.*)$", term)
        if m:
            op = "!=" if m.group(2) == "!=" else "="
            terms.append((m.group(1).strip(), op, m.group(3).strip()))
        elif term.startswith("!"):
            terms.append((term[1:], "absent", None))
        else:
            terms.append((term, "exists", None))
    return terms


def field_matches(selector: str, obj: dict[str, Any]) -> bool:
    for key, op, value in _selector_terms(selector):
        actual = _field(obj, key)
        if (op == "=" and actual != value) or (op == "!=" and actual == value):
            return False
    return True


def label_matches(selector: str, labels: dict[str, str]) -> bool:
    for key, op, value in _selector_terms(selector):
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "absent" and key in labels:
            return False
    return True


def validate_slice(obj: dict[str, Any], *, taints_allowed: bool) -> None:
    """Refuse what the real API server refuses of a ResourceSlice (the parts that matter)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise HttpError(422, "Invalid", "spec: Required value")
    if not spec.get("driver"):
        raise HttpError(422, "Invalid", "spec.driver: Required value")
    pool = spec.get("pool") or {}
    if not pool.get("name") or not isinstance(pool.get("generation"), int) \
            or not isinstance(pool.get("resourceSliceCount"), int) \
            or pool["resourceSliceCount"] < 1:
        raise HttpError(422, "Invalid", "spec.pool: name, generation and resourceSliceCount "
                                        "are required")
    where = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
             if spec.get(k)]
    if len(where) != 1:
        raise HttpError(422, "Invalid", "spec: exactly one of nodeName, nodeSelector, "
                                        "allNodes, perDeviceNodeSelection is required")
    devices = spec.get("devices") or []
    tainted = any(d.get("taints") for d in devices)
    if tainted and not taints_allowed:
        raise HttpError(422, "Invalid", "spec.devices[0].taints: Forbidden: "
                                        "disabled by feature gate DRADeviceTaints")
    limit = MAX_DEVICES_WITH_TAINTS if tainted else MAX_DEVICES
    if len(devices) > limit:
        raise HttpError(422, "Invalid", f"spec.devices: Too many: {len(devices)}: "
                                        f"must have at most {limit} items")
    seen: set[str] = set()
    for i, d in enumerate(devices):
        name = d.get("name", "")
        if not _DNS_LABEL.match(name):
            raise HttpError(422, "Invalid", f"spec.devices[{i}].name: Invalid value: "
                                            f"{name!r}: a lowercase RFC 1123 label must ...")
        if name in seen:
            raise HttpError(422, "Invalid", f"spec.devices[{i}].name: Duplicate value: {name!r}")
        seen.add(name)
        for key, value in (d.get("attributes") or {}).items():
            if not isinstance(value, dict) or len(value) != 1:
                raise HttpError(422, "Invalid", f"spec.devices[{i}].attributes[{key}]: "
                                                "exactly one value must be specified")


class FakeApiServer:
    """Start with ``start()`` (or as a context manager); ``url`` is where it listens."""

    def __init__(self, token: str | None = "fake-token", *, taints_allowed: bool = True) -> None:
        self.token = token
        self.taints_allowed = taints_allowed
        self.requests: list[Recorded] = []
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._rv = itertools.count(1)
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.on_request: Callable[[Recorded], None] | None = None

    # --- running -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() the server first"
        host, port = self._httpd.server_address[:2]
        text = host.decode() if isinstance(host, bytes) else host
        return f"http://{text}:{port}"

    def start(self) -> FakeApiServer:
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.api = self  # type: ignore[attr-defined]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: str | Path) -> Path:
        return write_kubeconfig(path, self.url, self.token)

    # --- what tests read and change directly ---------------------------------------------

    def slices(self, node: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            found = [copy.deepcopy(o) for (k, _, _), o in sorted(self._objects.items())
                     if k == "resourceslices"]
        return [s for s in found if node is None or s["spec"].get("nodeName") == node]

    def writes(self, resource: str = "resourceslices") -> list[Recorded]:
        return [r for r in list(self.requests)
                if r.method in ("POST", "PUT", "DELETE", "PATCH") and resource in r.path]

    def put(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as an API client's create would (tests seed other nodes' slices)."""
        ns = obj.get("metadata", {}).get("namespace", "")
        with self._lock:
            return copy.deepcopy(self._create(resource, ns, copy.deepcopy(obj)))

    def add_claim(self, namespace: str, name: str, results: list[dict[str, str]]) -> str:
        """A ResourceClaim the scheduler has allocated; returns its UID."""
        claim = self.put("resourceclaims", {
            "apiVersion": GROUP_VERSION, "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name},
            "spec": {"devices": {"requests": [
                {"name": r["request"], "exactly": {"deviceClassName": "rdma-hca.io"}}
                for r in results]}},
            "status": {"allocation": {"devices": {"results": results}}},
        })
        uid: str = claim["metadata"]["uid"]
        return uid

    def delete(self, resource: str, namespace: str, name: str) -> None:
        with self._lock:
            self._objects.pop((resource, namespace, name), None)

    # --- storage (callers hold the lock) -------------------------------------------------

    def _stamp(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def _create(self, resource: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise HttpError(422, "Invalid", "metadata.name: Required value")
            meta["name"] = prefix + uuid.uuid4().hex[:5]
        if resource == "resourceslices":
            validate_slice(obj, taints_allowed=self.taints_allowed)
        key = (resource, ns, meta["name"])
        if key in self._objects:
            raise HttpError(409, "AlreadyExists",
                            f'{resource} "{meta["name"]}" already exists')
        if ns:
            meta["namespace"] = ns
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta.pop("resourceVersion", None)
        obj["apiVersion"] = GROUP_VERSION
        obj["kind"] = KINDS[resource]
        self._stamp(obj)
        self._objects[key] = obj
        return obj

    def _replace(self, resource: str, ns: str, name: str, obj: dict[str, Any],
                 status_only: bool) -> dict[str, Any]:
        key = (resource, ns, name)
        old = self._objects.get(key)
        if old is None:
            raise HttpError(404, "NotFound", f'{resource} "{name}" not found')
        meta = obj.get("metadata") or {}
        if meta.get("name", name) != name:
            raise HttpError(400, "BadRequest", "the name of the object does not match the URL")
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise HttpError(409, "Conflict", f'Operation cannot be fulfilled on {resource} '
                            f'"{name}": the object has been modified; please apply your '
                            'changes to the latest version and try again')
        new = copy.deepcopy(old)
        if status_only:
            new["status"] = obj.get("status")
        else:
            if resource == "resourceslices":
                validate_slice(obj, taints_allowed=self.taints_allowed)
            new["spec"] = obj.get("spec")
            for k in ("labels", "annotations", "ownerReferences"):
                if k in meta:
                    new["metadata"][k] = meta[k]
                else:
                    new["metadata"].pop(k, None)
        if new != old:
            self._stamp(new)
        self._objects[key] = new
        return new

    def _list(self, resource: str, ns: str | None, fields: str,
              labels: str) -> list[dict[str, Any]]:
        return [
            o for (k, ons, _), o in sorted(self._objects.items())
            if k == resource and (ns is None or ons == ns)
            and field_matches(fields, o)
            and label_matches(labels, o["metadata"].get("labels") or {})
        ]

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        record = Recorded(method, path, query)
        self.requests.append(record)
        if self.on_request is not None:
            self.on_request(record)
        m = re.match(rf"^{PREFIX}(?:/namespaces/([^/]+))?/(resourceslices|resourceclaims)"
                     r"(?:/([^/]+))?(/status)?/?$", path)
        if not m:
            raise HttpError(404, "NotFound", f"the server could not find the path {path}")
        ns, resource, name, status = m.group(1), m.group(2), m.group(3), bool(m.group(4))
        if (resource == "resourceclaims") != (ns is not None) and not (
                resource == "resourceclaims" and name is None and method == "GET"):
            raise HttpError(404, "NotFound", f"the server could not find the path {path}")
        fields = query.get("fieldSelector", [""])[0]
        labels = query.get("labelSelector", [""])[0]
        with self._lock:
            if name is None:
                if method == "GET":
                    items = copy.deepcopy(self._list(resource, ns, fields, labels))
                    return 200, {"apiVersion": GROUP_VERSION, "kind": KINDS[resource] + "List",
                                 "metadata": {"resourceVersion": str(next(self._rv))},
                                 "items": items}
                if method == "POST":
                    if body is None:
                        raise HttpError(400, "BadRequest", "a body is required")
                    return 201, copy.deepcopy(self._create(resource, ns or "", body))
                if method == "DELETE":
                    gone = self._list(resource, ns, fields, labels)
                    for o in gone:
                        self._objects.pop((resource, ns or "", o["metadata"]["name"]), None)
                    return 200, {"apiVersion": GROUP_VERSION, "kind": KINDS[resource] + "List",
                                 "metadata": {}, "items": copy.deepcopy(gone)}
                raise HttpError(405, "MethodNotAllowed", f"{method} is not allowed here")
            key = (resource, ns or "", name)
            if method == "GET":
                obj = self._objects.get(key)
                if obj is None:
                    raise HttpError(404, "NotFound", f'{resource} "{name}" not found')
                return 200, copy.deepcopy(obj)
            if method == "PUT":
                if body is None:
                    raise HttpError(400, "BadRequest", "a body is required")
                return 200, copy.deepcopy(self._replace(resource, ns or "", name, body, status))
            if method == "DELETE":
                obj = self._objects.pop(key, None)
                if obj is None:
                    raise HttpError(404, "NotFound", f'{resource} "{name}" not found')
                return 200, copy.deepcopy(obj)
        raise HttpError(405, "MethodNotAllowed", f"{method} is not allowed here")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Clients keep connections alive; closing must not wait for them to hang up.
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-request (a driver stopping) is not an error here.
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as lightkube's HTTP client expects
    # Headers and body go out in two writes; with Nagle on, the body waits for the
    # client's delayed ACK (40 ms), which no real API server makes a client wait.
    disable_nagle_algorithm = True
    server: ThreadingHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self, method: str) -> None:
        api: FakeApiServer = self.server.api  # type: ignore[attr-defined]
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            if api.token is not None and self.headers.get("Authorization") != \
                    f"Bearer {api.token}":
                raise HttpError(401, "Unauthorized", "Unauthorized")
            body = json.loads(raw) if raw else None
            if body is not None and not isinstance(body, dict):
                raise HttpError(400, "BadRequest", "the body must be a JSON object")
            code, answer = api.handle(method, url.path, query, body)
        except HttpError as exc:
            code, answer = exc.code, status_object(exc.code, exc.reason, str(exc))
        except ValueError as exc:
            code, answer = 400, status_object(400, "BadRequest", f"invalid JSON: {exc}")
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


def write_kubeconfig(path: str | Path, server: str, token: str | None) -> Path:
    """A kubeconfig with one cluster, user and context, as kubectl would write it."""
    user: dict[str, Any] = {"token": token} if token else {}
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": user}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                  "namespace": "default"}}],
    }
    path = Path(path)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@contextmanager
def running(token: str | None = "fake-token") -> Iterator[FakeApiServer]:
    server = FakeApiServer(token).start()
    try:
        yield server
    finally:
        server.stop()
