"""A fake Kubernetes API server for tests: real HTTP on 127.0.0.1, JSON shaped like a cluster's.

It serves the reads ``rdma-hca doctor`` makes, checks the bearer token like the real
server (401 with a ``Status`` object when it is wrong), returns ``Status`` objects for 403/404,
filters pods by ``labelSelector`` (equality terms) and ResourceSlices by ``fieldSelector``
(``spec.nodeName``, ``spec.driver``, ``metadata.name``; any other field is refused with 400
like the real server does), and records every request so tests can assert on what the
client sent. ``resource.k8s.io/v1`` is served only when ``resource_slices`` is not None.
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOKEN = "test-token-0123456789"
CREATED = "2024-05-01T00:00:00Z"


@dataclass
class Recorded:
    path: str
    query: dict[str, list[str]]
    authorization: str | None
    client_cn: str | None  # the common name of a verified TLS client certificate


@dataclass
class FakeCluster:
    """The state the fake server serves; tests mutate it before the request."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    daemonsets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    # None: the API server has no resource.k8s.io/v1 (before 1.34, or DRA off): 404.
    resource_slices: list[dict[str, Any]] | None = None
    device_classes: list[dict[str, Any]] = field(default_factory=list)
    forbidden: set[str] = field(default_factory=set)  # resources answered with 403
    broken: set[str] = field(default_factory=set)  # resources answered with 500
    plain_404: bool = False  # unknown paths get a text 404, as from a proxy in front
    token: str | None = TOKEN  # None: accept any caller (TLS client certificates)
    requests: list[Recorded] = field(default_factory=list)


def status_object(code: int, reason: str, message: str, details: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }


SLICE_FIELDS = ("metadata.name", "spec.nodeName", "spec.driver")


class BadSelector(ValueError):
    pass


def _field_value(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def field_selector_matches(selector: str, obj: dict[str, Any]) -> bool:
    """``a=b``, ``a==b`` and ``a!=b`` terms over the fields a ResourceSlice supports."""
    for term in filter(None, selector.split(",")):
        negate = "!=" in term
        key, _, value = term.partition("!=" if negate else "=")
        value = value.removeprefix("=")
        if key not in SLICE_FIELDS:
            raise BadSelector(f"field label not supported: {key}")
        if (_field_value(obj, key) == value) == negate:
            return False
    return True


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        cluster = self.server.cluster
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        auth = self.headers.get("Authorization")
        cluster.requests.append(Recorded(url.path, query, auth, self._client_cn()))
        if cluster.token is not None and auth != f"Bearer {cluster.token}":
            self._send(401, status_object(401, "Unauthorized", "Unauthorized", {}))
            return
        parts = url.path.strip("/").split("/")
        if parts == ["api", "v1", "nodes"]:
            self._list("nodes", "", None, "NodeList", cluster.nodes)
        elif len(parts) == 7 and parts[:4] == ["apis", "apps", "v1", "namespaces"] \
                and parts[5] == "daemonsets":
            self._daemonset(parts[4], parts[6])
        elif len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            selector = query.get("labelSelector", [""])[0]
            pods = [
                p for p in cluster.pods
                if p["metadata"].get("namespace") == parts[3]
                and _selector_matches(selector, p["metadata"].get("labels", {}))
            ]
            self._list("pods", "", parts[3], "PodList", pods)
        elif parts[:3] == ["apis", "resource.k8s.io", "v1"] and len(parts) == 4 \
                and cluster.resource_slices is not None:
            self._dra(parts[3], query.get("fieldSelector", [""])[0])
        elif cluster.plain_404:
            data = b"404 page not found\n"
            self.send_response(404)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._send(404, status_object(404, "NotFound", "the server could not find the "
                                          "requested resource", {}))

    def _dra(self, resource: str, selector: str) -> None:
        cluster = self.server.cluster
        if resource == "resourceslices":
            try:
                found = [s for s in cluster.resource_slices or []
                         if field_selector_matches(selector, s)]
            except BadSelector as exc:
                self._send(400, status_object(400, "BadRequest", str(exc), {}))
                return
            self._list("resourceslices", "resource.k8s.io", None, "ResourceSliceList", found)
        elif resource == "deviceclasses":
            self._list("deviceclasses", "resource.k8s.io", None, "DeviceClassList",
                       cluster.device_classes)
        else:
            self._send(404, status_object(404, "NotFound", "the server could not find the "
                                          "requested resource", {}))

    def _client_cn(self) -> str | None:
        if not isinstance(self.connection, ssl.SSLSocket):
            return None
        cert = self.connection.getpeercert() or {}
        subject: Any = cert.get("subject", ())
        names = {key: value for rdn in subject for key, value in rdn}
        return str(names["commonName"]) if "commonName" in names else None

    def _forbidden(self, verb: str, resource: str, group: str, ns: str | None) -> bool:
        if resource not in self.server.cluster.forbidden:
            return False
        scope = f'in the namespace "{ns}"' if ns else "at the cluster scope"
        message = (f'{resource} is forbidden: User "system:serviceaccount:default:viewer" '
                   f'cannot {verb} resource "{resource}" in API group "{group}" {scope}')
        self._send(403, status_object(403, "Forbidden", message,
                                      {"kind": resource, **({"group": group} if group else {})}))
        return True

    def _list(self, resource: str, group: str, ns: str | None, kind: str,
              items: list[dict[str, Any]]) -> None:
        if self._forbidden("list", resource, group, ns):
            return
        if resource in self.server.cluster.broken:
            self._send(500, status_object(500, "InternalError", "Internal error occurred: "
                                          "etcdserver: request timed out", {}))
            return
        self._send(200, {"kind": kind, "apiVersion": "v1",
                         "metadata": {"resourceVersion": "12345"}, "items": items})

    def _daemonset(self, ns: str, name: str) -> None:
        if self._forbidden("get", "daemonsets", "apps", ns):
            return
        ds = self.server.cluster.daemonsets.get((ns, name))
        if ds is None:
            self._send(404, status_object(404, "NotFound",
                                          f'daemonsets.apps "{name}" not found',
                                          {"name": name, "group": "apps", "kind": "daemonsets"}))
            return
        self._send(200, ds)

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, cluster: FakeCluster) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.cluster = cluster


@contextmanager
def serve(cluster: FakeCluster, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """Serve ``cluster`` on a free port (over TLS when given a server context); yields the URL."""
    server = _Server(cluster)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        scheme = "https" if tls is not None else "http"
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def write_kubeconfig(path: Path, server: str, token: str = TOKEN) -> Path:
    """A kubeconfig like ``kubectl config view --raw`` prints, pointing at ``server``."""
    path.write_text(
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- name: test\n"
        "  cluster:\n"
        f"    server: {server}\n"
        "contexts:\n"
        "- name: test\n"
        "  context:\n"
        "    cluster: test\n"
        "    user: viewer\n"
        "current-context: test\n"
        "users:\n"
        "- name: viewer\n"
        "  user:\n"
        f"    token: {token}\n"
    )
    return path


# ------------------------------------------------------------------ objects as a cluster has them


def node(name: str, *, hca: str | None = "1k", allocatable: str | None = None,
         labels: dict[str, str] | None = None, ready: bool = True) -> dict[str, Any]:
    """A node as ``GET /api/v1/nodes`` lists it, like the seed guide's e01-cn-xxxx."""
    capacity: dict[str, str] = {"cpu": "192", "memory": "2112881480Ki", "nvidia.com/gpu": "8",
                                "pods": "64"}
    alloc: dict[str, str] = {"cpu": "189280m", "memory": "2063229768Ki", "nvidia.com/gpu": "8",
                             "pods": "64"}
    if hca is not None:
        capacity["rdma/hca"] = hca
        alloc["rdma/hca"] = allocatable if allocatable is not None else hca
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": CREATED,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       **(labels or {})},
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                            "reason": "KubeletReady" if ready else "KubeletNotReady"}],
        },
    }


DS_LABELS = {"app": "ack-rdma-dp", "component": "rdma-device-plugin"}


def daemonset(*, desired: int, ready: int, node_selector: dict[str, str] | None = None,
              name: str = "ack-rdma-dp-ds", namespace: str = "kube-system",
              created: str = CREATED) -> dict[str, Any]:
    return {
        "kind": "DaemonSet",
        "apiVersion": "apps/v1",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-ds", "generation": 1,
                     "creationTimestamp": created},
        "spec": {
            "selector": {"matchLabels": dict(DS_LABELS)},
            "template": {
                "metadata": {"labels": dict(DS_LABELS)},
                "spec": {"nodeSelector": node_selector or {}, "hostNetwork": True,
                         "containers": [{"name": "rdma-hca", "image": "rdma-hca:0.1.0"}]},
            },
        },
        "status": {
            "currentNumberScheduled": desired,
            "numberMisscheduled": 0,
            "desiredNumberScheduled": desired,
            "numberReady": ready,
            "observedGeneration": 1,
            "updatedNumberScheduled": desired,
            "numberAvailable": ready,
            **({"numberUnavailable": desired - ready} if desired > ready else {}),
        },
    }


def pod(name: str, node_name: str, *, ready: bool = True, waiting: str | None = None,
        namespace: str = "kube-system") -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": CREATED}}
    if waiting:
        state = {"waiting": {"reason": waiting, "message": "back-off restarting"}}
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**DS_LABELS, "controller-revision-hash": "6d4b8f7c9"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                 "name": "ack-rdma-dp-ds", "uid": "uid-ds", "controller": True}],
        },
        "spec": {"nodeName": node_name, "hostNetwork": True,
                 "containers": [{"name": "rdma-hca", "image": "rdma-hca:0.1.0"}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
                {"type": "ContainersReady", "status": "True" if ready else "False"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [{"name": "rdma-hca", "ready": ready, "restartCount": 0,
                                   "image": "rdma-hca:0.1.0", "imageID": "",
                                   "state": state}],
        },
    }


# ---------------------------------------------------------------- DRA objects as the driver writes

DRIVER = "rdma-hca.io"


def dra_device(hca: str, *, down: bool = False, taint: bool = True,
               driver: str = DRIVER) -> dict[str, Any]:
    """A device as the driver publishes it: a port down sets linkState and (taint) a taint."""
    attrs = {
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:37"},
        f"{driver}/hcaName": {"string": hca},
        f"{driver}/linkState": {"string": "down" if down else "up"},
    }
    device: dict[str, Any] = {"name": hca.replace("_", "-"), "attributes": attrs,
                              "allowMultipleAllocations": True}
    if down and taint:
        device["taints"] = [{"key": f"{driver}/link-down", "value": "down",
                             "effect": "NoSchedule"}]
    return device


def resource_slice(node_name: str, devices: list[dict[str, Any]] | None = None, *,
                   name: str | None = None, pool: str | None = None, generation: int = 1,
                   driver: str = DRIVER) -> dict[str, Any]:
    if devices is None:
        devices = [dra_device(f"mlx5_{i}", driver=driver) for i in range(4)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node_name}-{driver}-x7k2p", "uid": f"uid-{name}",
                     "resourceVersion": "100", "creationTimestamp": CREATED},
        "spec": {"driver": driver, "nodeName": node_name,
                 "pool": {"name": pool or node_name, "generation": generation,
                          "resourceSliceCount": 1},
                 "devices": devices},
    }


def device_class(name: str, expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "creationTimestamp": CREATED},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }
