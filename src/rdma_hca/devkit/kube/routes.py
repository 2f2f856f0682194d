"""Which request reaches which resource: the paths, verbs and refusals (403 for resources
tests forbid, 500 for broken ones, 404 for what is not served) of the fake API server."""

from __future__ import annotations

import copy
from typing import Any

from rdma_hca.devkit.kube import apply
from rdma_hca.devkit.kube.apply import APPLY_PATCH
from rdma_hca.devkit.kube.cluster import DRA
from rdma_hca.devkit.kube.errors import HttpError, not_found
from rdma_hca.devkit.kube.events import EventsApi
from rdma_hca.devkit.kube.nodes import patch_node
from rdma_hca.devkit.kube.selectors import SLICE_FIELDS
from rdma_hca.devkit.kube.store import Store


class Router:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.cluster = store.cluster
        self.events = EventsApi(store)

    def guard(self, verb: str, resource: str, group: str, ns: str | None) -> None:
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
               body: dict[str, Any] | None,
               content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
        fields = query.get("fieldSelector", [""])[0]
        labels = query.get("labelSelector", [""])[0]
        parts = path.strip("/").split("/")
        verb = {"GET": "get", "POST": "create", "PUT": "update", "DELETE": "delete"}.get(
            method, method.lower())
        store, cluster = self.store, self.cluster
        with store.lock:
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) <= 4:
                if len(parts) == 3:
                    self.guard("list", "nodes", "", None)
                    if method != "GET":
                        raise HttpError(405, "MethodNotAllowed", f"{method} is not allowed")
                    return 200, store.list_answer("NodeList", cluster.nodes)
                self.guard(verb, "nodes", "", None)
                node = store.find(cluster.nodes, "", parts[3])
                if method == "PATCH":
                    if body is None:
                        raise HttpError(400, "BadRequest", "a body is required")
                    new = patch_node(node, body, content_type, store.next_rv)
                    cluster.nodes[cluster.nodes.index(node)] = new
                    return 200, copy.deepcopy(new)
                if method != "GET":
                    raise HttpError(405, "MethodNotAllowed", f"{method} is not allowed")
                return 200, copy.deepcopy(node)
            if len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] \
                    and parts[4] == "pods" and method == "GET":
                self.guard("list", "pods", "", parts[3])
                pods = store.select(cluster.pods, parts[3], "", labels, ())
                return 200, store.list_answer("PodList", pods)
            if len(parts) == 7 and parts[:4] == ["apis", "apps", "v1", "namespaces"] \
                    and parts[5] == "daemonsets" and method == "GET":
                self.guard("get", "daemonsets", "apps", parts[4])
                ds = cluster.daemonsets.get((parts[4], parts[6]))
                if ds is None:
                    raise HttpError(404, "NotFound", f'daemonsets.apps "{parts[6]}" not found',
                                    {"name": parts[6], "group": "apps", "kind": "daemonsets"})
                return 200, copy.deepcopy(ds)
            if parts[:2] == ["apis", "resource.k8s.io"] and len(parts) > 2 \
                    and parts[2] in cluster.dra_versions \
                    and cluster.resource_slices is not None:
                code, answer = self._dra(method, verb, parts[3:], fields, labels, body,
                                         query, content_type)
                return code, _as_version(answer, f"resource.k8s.io/{parts[2]}")
            events = self.events.handle(method, parts, body, content_type)
            if events is not None:
                return events
        raise not_found()

    def _dra(self, method: str, verb: str, rest: list[str], fields: str, labels: str,
             body: dict[str, Any] | None, query: dict[str, list[str]],
             content_type: str) -> tuple[int, dict[str, Any]]:
        store = self.store
        ns: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest:
            raise not_found()
        resource, name = rest[0], (rest[1] if len(rest) > 1 else None)
        status = len(rest) == 3 and rest[2] == "status"
        if len(rest) > 3 or (len(rest) == 3 and not status):
            raise not_found()
        if resource == "deviceclasses" and name is None and method == "GET":
            self.guard("list", "deviceclasses", "resource.k8s.io", None)
            return 200, store.list_answer("DeviceClassList", self.cluster.device_classes)
        if resource == "resourceclaimtemplates" and name is None and method == "GET":
            self.guard("list", "resourceclaimtemplates", "resource.k8s.io", ns)
            return 200, store.list_answer("ResourceClaimTemplateList", store.select(
                self.cluster.resource_claim_templates, ns, fields, labels,
                ("metadata.name", "metadata.namespace")))
        if resource not in ("resourceslices", "resourceclaims") or \
                (resource == "resourceslices" and ns is not None) or \
                (resource == "resourceclaims" and ns is None and not (
                    name is None and method == "GET")) or \
                (status and resource != "resourceclaims"):
            raise not_found()
        kind = "ResourceSlice" if resource == "resourceslices" else "ResourceClaim"
        allowed = SLICE_FIELDS if resource == "resourceslices" else ("metadata.name",
                                                                    "metadata.namespace")
        items = store.items(resource)
        if name is None:
            self.guard("list" if method == "GET" else verb, resource, "resource.k8s.io", ns)
            if method == "GET":
                return 200, store.list_answer(kind + "List",
                                              store.select(items, ns, fields, labels, allowed))
            if method == "POST":
                if body is None:
                    raise HttpError(400, "BadRequest", "a body is required")
                return 201, copy.deepcopy(store.create(resource, ns or "", body,
                                                       apply.check_manager(query)))
            if method == "DELETE":
                gone = store.select(items, ns, fields, labels, allowed)
                items[:] = [o for o in items if o not in gone]
                return 200, store.list_answer(kind + "List", gone)
            raise HttpError(405, "MethodNotAllowed", f"{method} is not allowed here")
        self.guard(verb, resource + ("/status" if status else ""), "resource.k8s.io", ns)
        if method == "GET":
            return 200, copy.deepcopy(store.find(items, ns or "", name))
        if method == "PUT":
            if body is None:
                raise HttpError(400, "BadRequest", "a body is required")
            return 200, copy.deepcopy(store.replace(resource, ns or "", name, body, status,
                                                    apply.check_manager(query)))
        if method == "PATCH" and status:
            if content_type.split(";")[0].strip() != APPLY_PATCH:
                raise HttpError(415, "UnsupportedMediaType", "the fake API server takes "
                                f"only {APPLY_PATCH} on a claim's status, not {content_type}")
            return 200, copy.deepcopy(store.apply_status(resource, ns or "", name, body,
                                                         query))
        if method == "DELETE" and not status:
            obj = store.find(items, ns or "", name)
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
