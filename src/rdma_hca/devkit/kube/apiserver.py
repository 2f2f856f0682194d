"""A fake Kubernetes API server over real HTTP(S) on loopback, as strict as the real one
where our code touches it.

One server for everything that talks to the API: ``doctor``'s reads (nodes, the DaemonSet,
its pods, ResourceSlices, DeviceClasses; 401/403/404 as ``Status`` objects; a client
certificate's CN over TLS), and the DRA driver's writes (ResourceSlices created with
``generateName``, replaced with ``resourceVersion`` conflicts, deleted; ResourceClaims read
and their ``/status`` subresource written). Slices and claim status are validated as the
real server validates them (:mod:`rdma_hca.devkit.kube.validation`). Faults come on demand
(an error status with ``Retry-After``, a hang, a connection reset), and every request is
recorded and counted by verb and path, so tests and the bench can assert on the traffic.

The state is a :class:`FakeCluster` that tests seed and read directly. The server runs in
threads of its own: code under test reaches it only through sockets.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import socket
import ssl
import struct
import threading
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from rdma_hca.devkit.kube import validation
from rdma_hca.devkit.kube.validation import Invalid

TOKEN = "test-token-0123456789"
DRA = "resource.k8s.io/v1"
SLICE_FIELDS = ("metadata.name", "spec.nodeName", "spec.driver")


@dataclass(frozen=True, slots=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str | None = None
    client_cn: str | None = None  # the common name of a verified TLS client certificate


@dataclass
class Fault:
    """What the server does instead of answering the next ``times`` matching requests."""

    kind: str  # "status", "hang", "reset" or "hold"
    code: int = 500
    retry_after: str | None = None
    seconds: float = 0.0  # how long a hang lasts before the connection is closed
    method: str | None = None
    path: str = ""  # a part of the path the request must contain
    times: int = 1
    released: threading.Event = field(default_factory=threading.Event)  # ends a "hold"
    held: int = 0  # requests a "hold" has held so far

    def release(self) -> None:
        """Let the held requests (and every later one) through, answered as usual."""
        self.released.set()

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and self.path in path


@dataclass
class FakeCluster:
    """The state the fake server serves; tests change it between requests."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    daemonsets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    # None: the API server has no resource.k8s.io/v1 (before 1.34, or DRA off): 404.
    resource_slices: list[dict[str, Any]] | None = None
    resource_claims: list[dict[str, Any]] = field(default_factory=list)
    device_classes: list[dict[str, Any]] = field(default_factory=list)
    forbidden: set[str] = field(default_factory=set)  # resources answered with 403
    broken: set[str] = field(default_factory=set)  # resources answered with 500
    plain_404: bool = False  # unknown paths get a text 404, as from a proxy in front
    token: str | None = TOKEN  # None: accept any caller (TLS client certificates)
    taints_allowed: bool = True  # the DRADeviceTaints feature gate
    # DRAResourceClaimDeviceStatus: off, the server drops status.devices from writes.
    claim_device_status: bool = True
    # The versions of resource.k8s.io served over one store. v1beta2 has v1's shape (v1 is
    # v1beta2 graduated); v1beta1 (devices under "basic") is not served here.
    dra_versions: tuple[str, ...] = ("v1", "v1beta2")
    requests: list[Recorded] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)


class HttpError(Exception):
    def __init__(self, code: int, reason: str, message: str,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.details = details or {}


def status_object(code: int, reason: str, message: str,
                  details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details or {}, "code": code}


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def field_selector_matches(selector: str, obj: dict[str, Any],
                           allowed: tuple[str, ...] = SLICE_FIELDS) -> bool:
    """``a=b``, ``a==b`` and ``a!=b`` terms; a field the resource does not index is a 400."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        key, _, value = term.partition("!=" if negate else "=")
        value = value.removeprefix("=")
        if key not in allowed:
            raise HttpError(400, "BadRequest", f"field label not supported: {key}")
        if (_field(obj, key) == value) == negate:
            return False
    return True


def label_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality, ``in``/``notin``, existence and ``!key`` terms, as kubectl sends them."""
    for term in re.findall(r"[^,(]+(?:\([^)]*\))?", selector):
        term = term.strip()
        if not term:
            continue
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            if (labels.get(m.group(1)) in values) != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            key, _, value = term.partition("!=")
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, _, value = term.partition("=")
            if labels.get(key) != value.removeprefix("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeApiServer:
    """``start()`` (or a ``with`` block); ``url`` is where it listens."""

    def __init__(self, cluster: FakeCluster | None = None, *, token: str | None = TOKEN,
                 taints_allowed: bool = True, tls: ssl.SSLContext | None = None) -> None:
        if cluster is None:
            cluster = FakeCluster(resource_slices=[], token=token,
                                  taints_allowed=taints_allowed)
        self.cluster = cluster
        self.tls = tls
        self.on_request: Callable[[Recorded], None] | None = None
        self._rv = itertools.count(1000)
        self._lock = threading.RLock()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # --- running -------------------------------------------------------------------------

    @property
    def token(self) -> str | None:
        return self.cluster.token

    @token.setter
    def token(self, value: str | None) -> None:
        self.cluster.token = value  # a rotated token: every request is now refused (401)

    @property
    def requests(self) -> list[Recorded]:
        return self.cluster.requests

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() the server first"
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> FakeApiServer:
        httpd = _Server(self)
        if self.tls is not None:
            httpd.socket = self.tls.wrap_socket(httpd.socket, server_side=True)
        self._httpd = httpd
        self._stopping.clear()
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # hung requests end now
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
        return write_kubeconfig(Path(path), self.url, self.token)

    # --- faults and counts ---------------------------------------------------------------

    def fail(self, code: int, *, times: int = 1, retry_after: str | None = None,
             method: str | None = None, path: str = "") -> Fault:
        """Answer the next ``times`` matching requests with ``code`` (a Status object)."""
        return self._fault(Fault("status", code=code, retry_after=retry_after, method=method,
                                 path=path, times=times))

    def hang(self, seconds: float, *, times: int = 1, method: str | None = None,
             path: str = "") -> Fault:
        """Hold the next matching requests ``seconds`` unanswered, then close the connection."""
        return self._fault(Fault("hang", seconds=seconds, method=method, path=path,
                                 times=times))

    def hold(self, *, method: str | None = None, path: str = "") -> Fault:
        """Hold every matching request unanswered until ``fault.release()``, then answer
        it as usual: a slow API server for some kind of request, released at will."""
        return self._fault(Fault("hold", method=method, path=path, times=1 << 62))

    def reset(self, *, times: int = 1, method: str | None = None, path: str = "") -> Fault:
        """Reset the connection of the next matching requests (TCP RST, no answer)."""
        return self._fault(Fault("reset", method=method, path=path, times=times))

    def _fault(self, fault: Fault) -> Fault:
        with self._lock:
            self.cluster.faults.append(fault)
        return fault

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.cluster.faults:
                if fault.times > 0 and fault.matches(method, path):
                    fault.times -= 1
                    return fault
        return None

    def counts(self) -> Counter[tuple[str, str]]:
        """Requests by (verb, path), faults included."""
        return Counter((r.method, r.path) for r in list(self.requests))

    def count(self, method: str | None = None, path: str = "") -> int:
        return sum(1 for r in list(self.requests)
                   if (method is None or r.method == method) and path in r.path)

    def writes(self, resource: str = "resourceslices") -> list[Recorded]:
        return [r for r in list(self.requests)
                if r.method in ("POST", "PUT", "DELETE", "PATCH") and resource in r.path]

    # --- what tests read and change directly ---------------------------------------------

    def slices(self, node: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            found = sorted(copy.deepcopy(self.cluster.resource_slices or []),
                           key=lambda s: s["metadata"]["name"])
        return [s for s in found if node is None or s["spec"].get("nodeName") == node]

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._find(self.cluster.resource_claims, namespace, name))

    def add_node(self, name: str) -> str:
        """A Node object (replacing one of that name: a node re-created); returns its UID."""
        uid = str(uuid.uuid4())
        with self._lock:
            self.cluster.nodes[:] = [n for n in self.cluster.nodes
                                     if n["metadata"]["name"] != name]
            self.cluster.nodes.append({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": uid, "resourceVersion": self._next_rv(),
                             "creationTimestamp": _now()},
                "spec": {}, "status": {}})
        return uid

    def put(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as an API client's create would (tests seed other nodes' slices)."""
        ns = obj.get("metadata", {}).get("namespace", "")
        with self._lock:
            try:
                return copy.deepcopy(self._create(resource, ns, copy.deepcopy(obj)))
            except Invalid as exc:
                raise ValueError(str(exc)) from exc

    def add_claim(self, namespace: str, name: str, results: list[dict[str, Any]]) -> str:
        """A ResourceClaim the scheduler has allocated; returns its UID."""
        claim = self.put("resourceclaims", {
            "apiVersion": DRA, "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name},
            "spec": {"devices": {"requests": [
                {"name": r["request"], "exactly": {"deviceClassName": "rdma-hca.io"}}
                for r in results]}},
            "status": {"allocation": {"devices": {"results": results}}},
        })
        uid: str = claim["metadata"]["uid"]
        return uid

    def touch(self, resource: str, namespace: str, name: str) -> str:
        """Another writer updated the object: a new resourceVersion; returns it."""
        with self._lock:
            obj = self._find(self._store(resource), namespace, name)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            return str(obj["metadata"]["resourceVersion"])

    def delete(self, resource: str, namespace: str, name: str) -> None:
        with self._lock:
            items = self._store(resource)
            items[:] = [o for o in items if not (o["metadata"]["name"] == name and
                                                 o["metadata"].get("namespace", "") == namespace)]

    # --- storage (callers hold the lock) -------------------------------------------------

    def _next_rv(self) -> str:
        return str(next(self._rv))

    def _store(self, resource: str) -> list[dict[str, Any]]:
        if resource == "resourceslices":
            if self.cluster.resource_slices is None:
                self.cluster.resource_slices = []
            return self.cluster.resource_slices
        if resource == "resourceclaims":
            return self.cluster.resource_claims
        if resource == "nodes":
            return self.cluster.nodes
        raise HttpError(405, "MethodNotAllowed", f"{resource} are read-only here")

    @staticmethod
    def _find(items: list[dict[str, Any]], ns: str, name: str) -> dict[str, Any]:
        for o in items:
            meta = o.get("metadata", {})
            if meta.get("name") == name and meta.get("namespace", "") == ns:
                return o
        raise HttpError(404, "NotFound", f'"{name}" not found', {"name": name})

    def _create(self, resource: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise Invalid("metadata.name: Required value: name or generateName is "
                              "required")
            meta["name"] = prefix + uuid.uuid4().hex[:5]
        if resource == "resourceslices":
            validation.check_slice(obj, taints_allowed=self.cluster.taints_allowed)
        items = self._store(resource)
        if any(o["metadata"]["name"] == meta["name"] and o["metadata"].get("namespace", "") == ns
               for o in items):
            raise HttpError(409, "AlreadyExists", f'{resource} "{meta["name"]}" already exists')
        if ns:
            meta["namespace"] = ns
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["resourceVersion"] = self._next_rv()
        meta.pop("generation", None)
        obj["apiVersion"] = DRA
        obj["kind"] = {"resourceslices": "ResourceSlice",
                       "resourceclaims": "ResourceClaim"}.get(resource, obj.get("kind"))
        items.append(obj)
        return obj

    def _replace(self, resource: str, ns: str, name: str, obj: dict[str, Any],
                 status_only: bool) -> dict[str, Any]:
        items = self._store(resource)
        old = self._find(items, ns, name)
        meta = obj.get("metadata") or {}
        if meta.get("name", name) != name:
            raise HttpError(400, "BadRequest", "the name of the object does not match the "
                            "name on the URL")
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise HttpError(409, "Conflict", f'Operation cannot be fulfilled on {resource} '
                            f'"{name}": the object has been modified; please apply your '
                            'changes to the latest version and try again')
        uid = meta.get("uid")
        if uid and uid != old["metadata"]["uid"]:
            raise HttpError(409, "Conflict", f'Precondition failed: UID in precondition: '
                            f'{uid}, UID in object meta: {old["metadata"]["uid"]}')
        new = copy.deepcopy(old)
        if status_only:
            status = copy.deepcopy(obj.get("status") or {})
            if not self.cluster.claim_device_status:
                status.pop("devices", None)  # a disabled field is dropped, as upstream does
            validation.check_claim_status(old, status)
            new["status"] = status
        else:
            validation.check_owner_references(meta)
            if resource == "resourceslices":
                candidate = {**obj, "metadata": {**meta, "name": name}}
                validation.check_slice(candidate, taints_allowed=self.cluster.taints_allowed)
                validation.check_slice_update(old, obj)
            new["spec"] = copy.deepcopy(obj.get("spec"))
            for k in ("labels", "annotations", "ownerReferences"):
                if k in meta:
                    new["metadata"][k] = copy.deepcopy(meta[k])
                else:
                    new["metadata"].pop(k, None)
        if new != old:
            new["metadata"]["resourceVersion"] = self._next_rv()
        items[items.index(old)] = new
        return new

    def _list(self, items: list[dict[str, Any]], ns: str | None, fields: str, labels: str,
              allowed: tuple[str, ...]) -> list[dict[str, Any]]:
        return [o for o in items
                if (ns is None or o["metadata"].get("namespace", "") == ns)
                and field_selector_matches(fields, o, allowed)
                and label_matches(labels, o["metadata"].get("labels") or {})]

    def _list_answer(self, kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {"kind": kind, "apiVersion": "v1",
                "metadata": {"resourceVersion": self._next_rv()},
                "items": copy.deepcopy(items)}

    # --- requests ------------------------------------------------------------------------

    def _guard(self, verb: str, resource: str, group: str, ns: str | None) -> None:
        if resource in self.cluster.forbidden:
            scope = f'in the namespace "{ns}"' if ns else "at the cluster scope"
            raise HttpError(403, "Forbidden",
                            f'{resource} is forbidden: User "system:serviceaccount:default:'
                            f'viewer" cannot {verb} resource "{resource}" in API group '
                            f'"{group}" {scope}',
                            {"kind": resource, **({"group": group} if group else {})})
        if resource in self.cluster.broken:
            raise HttpError(500, "InternalError", "Internal error occurred: etcdserver: "
                            "request timed out")

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        fields = query.get("fieldSelector", [""])[0]
        labels = query.get("labelSelector", [""])[0]
        parts = path.strip("/").split("/")
        verb = {"GET": "get", "POST": "create", "PUT": "update", "DELETE": "delete"}.get(
            method, method.lower())
        with self._lock:
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) <= 4:
                if len(parts) == 3:
                    self._guard("list", "nodes", "", None)
                    if method != "GET":
                        raise HttpError(405, "MethodNotAllowed", f"{method} is not allowed")
                    return 200, self._list_answer("NodeList", self.cluster.nodes)
                self._guard(verb, "nodes", "", None)
                if method != "GET":
                    raise HttpError(405, "MethodNotAllowed", f"{method} is not allowed")
                return 200, copy.deepcopy(self._find(self.cluster.nodes, "", parts[3]))
            if len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] \
                    and parts[4] == "pods" and method == "GET":
                self._guard("list", "pods", "", parts[3])
                pods = self._list(self.cluster.pods, parts[3], "", labels, ())
                return 200, self._list_answer("PodList", pods)
            if len(parts) == 7 and parts[:4] == ["apis", "apps", "v1", "namespaces"] \
                    and parts[5] == "daemonsets" and method == "GET":
                self._guard("get", "daemonsets", "apps", parts[4])
                ds = self.cluster.daemonsets.get((parts[4], parts[6]))
                if ds is None:
                    raise HttpError(404, "NotFound", f'daemonsets.apps "{parts[6]}" not found',
                                    {"name": parts[6], "group": "apps", "kind": "daemonsets"})
                return 200, copy.deepcopy(ds)
            if parts[:2] == ["apis", "resource.k8s.io"] and len(parts) > 2 \
                    and parts[2] in self.cluster.dra_versions \
                    and self.cluster.resource_slices is not None:
                code, answer = self._dra(method, verb, parts[3:], fields, labels, body)
                return code, _as_version(answer, f"resource.k8s.io/{parts[2]}")
        raise HttpError(404, "NotFound", "the server could not find the requested resource")

    def _dra(self, method: str, verb: str, rest: list[str], fields: str, labels: str,
             body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        ns: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest:
            raise HttpError(404, "NotFound", "the server could not find the requested resource")
        resource, name = rest[0], (rest[1] if len(rest) > 1 else None)
        status = len(rest) == 3 and rest[2] == "status"
        if len(rest) > 3 or (len(rest) == 3 and not status):
            raise HttpError(404, "NotFound", "the server could not find the requested resource")
        if resource == "deviceclasses" and name is None and method == "GET":
            self._guard("list", "deviceclasses", "resource.k8s.io", None)
            return 200, self._list_answer("DeviceClassList", self.cluster.device_classes)
        if resource not in ("resourceslices", "resourceclaims") or \
                (resource == "resourceslices" and ns is not None) or \
                (resource == "resourceclaims" and ns is None and not (
                    name is None and method == "GET")) or \
                (status and resource != "resourceclaims"):
            raise HttpError(404, "NotFound", "the server could not find the requested resource")
        kind = "ResourceSlice" if resource == "resourceslices" else "ResourceClaim"
        allowed = SLICE_FIELDS if resource == "resourceslices" else ("metadata.name",
                                                                    "metadata.namespace")
        items = self._store(resource)
        if name is None:
            self._guard("list" if method == "GET" else verb, resource, "resource.k8s.io", ns)
            if method == "GET":
                return 200, self._list_answer(kind + "List",
                                              self._list(items, ns, fields, labels, allowed))
            if method == "POST":
                if body is None:
                    raise HttpError(400, "BadRequest", "a body is required")
                return 201, copy.deepcopy(self._create(resource, ns or "", body))
            if method == "DELETE":
                gone = self._list(items, ns, fields, labels, allowed)
                items[:] = [o for o in items if o not in gone]
                return 200, self._list_answer(kind + "List", gone)
            raise HttpError(405, "MethodNotAllowed", f"{method} is not allowed here")
        self._guard(verb, resource + ("/status" if status else ""), "resource.k8s.io", ns)
        if method == "GET":
            return 200, copy.deepcopy(self._find(items, ns or "", name))
        if method == "PUT":
            if body is None:
                raise HttpError(400, "BadRequest", "a body is required")
            return 200, copy.deepcopy(self._replace(resource, ns or "", name, body, status))
        if method == "DELETE" and not status:
            obj = self._find(items, ns or "", name)
            items.remove(obj)
            return 200, copy.deepcopy(obj)
        raise HttpError(405, "MethodNotAllowed", f"{method} is not allowed here")


def _as_version(answer: dict[str, Any], version: str) -> dict[str, Any]:
    """The answer as the version it was asked in (lists: each item too)."""
    if answer.get("kind") == "Status" or version == DRA:
        return answer
    for obj in [answer, *answer.get("items", [])]:
        if obj.get("apiVersion") == DRA:
            obj["apiVersion"] = version
    return answer


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Clients keep connections alive; closing must not wait for them to hang up.
    block_on_close = False

    def __init__(self, api: FakeApiServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api = api

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-request (a driver stopping) is not an error here.
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect
    # Headers and body go out in two writes; with Nagle on, the body waits for the
    # client's delayed ACK (40 ms), which no real API server makes a client wait.
    disable_nagle_algorithm = True
    server: _Server

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
        record = Recorded(method, url.path, query, auth, self._client_cn())
        cluster.requests.append(record)
        if api.on_request is not None:
            api.on_request(record)
        fault = api._take_fault(method, url.path)
        if fault is not None and fault.kind == "reset":
            self._reset()
            return
        if fault is not None and fault.kind == "hang":
            api._stopping.wait(fault.seconds)
            self.close_connection = True
            return
        if fault is not None and fault.kind == "hold":
            with api._lock:
                fault.held += 1
            while not fault.released.wait(0.02) and not api._stopping.is_set():
                pass
            fault = None
        headers: dict[str, str] = {}
        try:
            if fault is not None:
                if fault.retry_after is not None:
                    headers["Retry-After"] = fault.retry_after
                reason = {429: "TooManyRequests", 503: "ServiceUnavailable"}.get(
                    fault.code, "InternalError")
                raise HttpError(fault.code, reason, f"injected fault: HTTP {fault.code}")
            if cluster.token is not None and auth != f"Bearer {cluster.token}":
                raise HttpError(401, "Unauthorized", "Unauthorized")
            body = json.loads(raw) if raw else None
            if body is not None and not isinstance(body, dict):
                raise HttpError(400, "BadRequest", "the body must be a JSON object")
            code, answer = api.handle(method, url.path, query, body)
        except HttpError as exc:
            if exc.code == 404 and cluster.plain_404 and "could not find" in str(exc):
                self._send_raw(404, b"404 page not found\n", "text/plain; charset=utf-8", {})
                return
            code, answer = exc.code, status_object(exc.code, exc.reason, str(exc), exc.details)
        except Invalid as exc:
            code, answer = 422, status_object(422, "Invalid", f"is invalid: {exc}")
        except ValueError as exc:
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


def write_kubeconfig(path: Path, server: str, token: str | None = TOKEN) -> Path:
    """A kubeconfig like ``kubectl config view --raw`` prints, pointing at ``server``."""
    user: dict[str, Any] = {"token": token} if token else {}
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "viewer"}}],
        "users": [{"name": "viewer", "user": user}],
    }
    path = Path(path)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@contextmanager
def serve(cluster: FakeCluster, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """Serve ``cluster`` on a free port (over TLS when given a server context); yields the URL."""
    server = FakeApiServer(cluster, tls=tls).start()
    try:
        yield server.url
    finally:
        server.stop()

