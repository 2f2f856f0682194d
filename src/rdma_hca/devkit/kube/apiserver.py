"""A fake Kubernetes API server over real HTTP(S) on loopback, as strict as the real one
where our code touches it.

One server for everything that talks to the API: ``doctor``'s reads (nodes, the DaemonSet,
its pods, ResourceSlices, DeviceClasses; 401/403/404 as ``Status`` objects; a client
certificate's CN over TLS), and the DRA driver's writes (ResourceSlices created with
``generateName``, replaced with ``resourceVersion`` conflicts, deleted; ResourceClaims read
and their ``/status`` subresource written, replaced or applied server-side per field
manager (``apply``); Events in ``events.k8s.io/v1`` and core ``v1``, created and
merge-patched; Nodes merge-patched, their labels and annotations validated (``nodes``)).
Slices and claim status are validated as the
real server validates them (:mod:`rdma_hca.devkit.kube.validation`). Faults come on demand
(an error status with ``Retry-After``, a hang, a connection reset), and every request is
recorded and counted by verb and path, so tests and the bench can assert on the traffic.

The state is a :class:`FakeCluster` that tests seed and read directly. The server runs in
threads of its own: code under test reaches it only through sockets. This module is the
front tests hold; the pieces live beside it: the state (``cluster``), faults (``faults``),
storage (``store``), paths (``routes``), Events (``events``) and the HTTP side (``httpd``).
"""

from __future__ import annotations

import copy
import ssl
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from rdma_hca.devkit.kube import faults
from rdma_hca.devkit.kube.cluster import DRA, TOKEN, FakeCluster, Recorded
from rdma_hca.devkit.kube.faults import Fault
from rdma_hca.devkit.kube.httpd import Server
from rdma_hca.devkit.kube.routes import Router
from rdma_hca.devkit.kube.store import Store, now
from rdma_hca.devkit.kube.validation import Invalid


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
        self.store = Store(cluster)
        self.router = Router(self.store)
        self._lock = self.store.lock
        self._httpd: Server | None = None
        self._thread: threading.Thread | None = None
        self.stopping = threading.Event()

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
        httpd = Server(self)
        if self.tls is not None:
            httpd.socket = self.tls.wrap_socket(httpd.socket, server_side=True)
        self._httpd = httpd
        self.stopping.clear()
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()  # hung requests end now
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

    def write_kubeconfig(self, path: str | Path, *, ca: str | None = None) -> Path:
        """``ca``: the kubeconfig's certificate-authority-data (base64), for a server
        started with ``tls``."""
        return write_kubeconfig(Path(path), self.url, self.token, ca=ca)

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: dict[str, Any] | None,
               content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
        return self.router.handle(method, path, query, body, content_type)

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

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            return faults.take(self.cluster.faults, method, path)

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
            return copy.deepcopy(self.store.find(self.cluster.resource_claims, namespace, name))

    def events(self, *, reason: str | None = None, kind: str | None = None,
               name: str | None = None) -> list[dict[str, Any]]:
        """The stored Events (events.k8s.io/v1 shape), oldest first, by reason and about
        which object (``regarding``'s kind and name) when given."""
        with self._lock:
            found = copy.deepcopy(self.cluster.events)
        return [e for e in found
                if (reason is None or e.get("reason") == reason)
                and (kind is None or (e.get("regarding") or {}).get("kind") == kind)
                and (name is None or (e.get("regarding") or {}).get("name") == name)]

    def node(self, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.store.find(self.cluster.nodes, "", name))

    def add_node(self, name: str) -> str:
        """A Node object (replacing one of that name: a node re-created); returns its UID."""
        uid = str(uuid.uuid4())
        with self._lock:
            self.cluster.nodes[:] = [n for n in self.cluster.nodes
                                     if n["metadata"]["name"] != name]
            self.cluster.nodes.append({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": uid, "resourceVersion": self.store.next_rv(),
                             "creationTimestamp": now()},
                "spec": {}, "status": {}})
        return uid

    def put(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as an API client's create would (tests seed other nodes' slices)."""
        ns = obj.get("metadata", {}).get("namespace", "")
        with self._lock:
            try:
                return copy.deepcopy(self.store.create(resource, ns, copy.deepcopy(obj)))
            except Invalid as exc:
                raise ValueError(str(exc)) from exc

    def add_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A namespace's labels (``resource.kubernetes.io/admin-access: "true"`` lets its
        claims ask for admin access)."""
        with self._lock:
            self.cluster.namespaces[name] = dict(labels or {})

    def add_claim(self, namespace: str, name: str, results: list[dict[str, Any]],
                  config: list[dict[str, Any]] | None = None,
                  class_config: list[dict[str, Any]] | None = None) -> str:
        """A ResourceClaim the scheduler has allocated; returns its UID. Its requests are
        what the results imply (``claim_requests``); ``config``: its
        ``spec.devices.config``; the allocation copies the class's entries (``class_config``,
        a DeviceClass's ``spec.config``) and then the claim's, as the scheduler does."""
        devices: dict[str, Any] = {"requests": claim_requests(results)}
        allocation: dict[str, Any] = {"results": results}
        if config:
            devices["config"] = config
        copied = [{"source": "FromClass", **c} for c in class_config or []] + \
            [{"source": "FromClaim", **c} for c in config or []]
        if copied:
            allocation["config"] = copied
        claim = self.put("resourceclaims", {
            "apiVersion": DRA, "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name},
            "spec": {"devices": devices},
            "status": {"allocation": {"devices": allocation}},
        })
        uid: str = claim["metadata"]["uid"]
        return uid

    def touch(self, resource: str, namespace: str, name: str) -> str:
        """Another writer updated the object: a new resourceVersion; returns it."""
        with self._lock:
            obj = self.store.find(self.store.items(resource), namespace, name)
            obj["metadata"]["resourceVersion"] = self.store.next_rv()
            return str(obj["metadata"]["resourceVersion"])

    def delete(self, resource: str, namespace: str, name: str) -> None:
        with self._lock:
            items = self.store.items(resource)
            items[:] = [o for o in items if not (o["metadata"]["name"] == name and
                                                 o["metadata"].get("namespace", "") == namespace)]


def claim_requests(results: list[dict[str, Any]], device_class: str = "rdma-hca.io"
                   ) -> list[dict[str, Any]]:
    """The requests a claim had for the scheduler to write ``results``: one per request
    name, ``exactly`` with the count of its results (and ``adminAccess`` when they carry
    it), or for a prioritized list's ``<request>/<subrequest>`` a ``firstAvailable`` whose
    first entry is the subrequest chosen."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        name, _, sub = str(r["request"]).partition("/")
        known = out.get(name)
        if sub:
            if known is None:
                out[name] = {"name": name, "firstAvailable": [
                    {"name": sub, "deviceClassName": device_class}]}
            else:
                known["firstAvailable"][0]["count"] = \
                    known["firstAvailable"][0].get("count", 1) + 1
        elif known is None:
            exactly: dict[str, Any] = {"deviceClassName": device_class}
            if r.get("adminAccess"):
                exactly["adminAccess"] = True
            out[name] = {"name": name, "exactly": exactly}
        else:
            known["exactly"]["count"] = known["exactly"].get("count", 1) + 1
    return list(out.values())


def write_kubeconfig(path: Path, server: str, token: str | None = TOKEN, *,
                     ca: str | None = None) -> Path:
    """A kubeconfig like ``kubectl config view --raw`` prints, pointing at ``server``."""
    user: dict[str, Any] = {"token": token} if token else {}
    cluster: dict[str, Any] = {"server": server}
    if ca is not None:
        cluster["certificate-authority-data"] = ca
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": cluster}],
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
