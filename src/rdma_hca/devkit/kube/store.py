"""The objects the fake API server keeps, created, replaced and listed as the real one does:
names from ``generateName``, UIDs, resourceVersions with conflicts, validation on write."""

from __future__ import annotations

import copy
import itertools
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

from rdma_hca.devkit.kube import apply, validation
from rdma_hca.devkit.kube.cluster import DRA, FakeCluster
from rdma_hca.devkit.kube.errors import HttpError
from rdma_hca.devkit.kube.selectors import field_selector_matches, label_matches
from rdma_hca.devkit.kube.validation import Invalid


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    """The cluster's objects behind one lock; callers of the methods below hold ``lock``."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.lock = threading.RLock()
        self._rv = itertools.count(1000)

    def next_rv(self) -> str:
        return str(next(self._rv))

    def items(self, resource: str) -> list[dict[str, Any]]:
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
    def find(items: list[dict[str, Any]], ns: str, name: str) -> dict[str, Any]:
        for o in items:
            meta = o.get("metadata", {})
            if meta.get("name") == name and meta.get("namespace", "") == ns:
                return o
        raise HttpError(404, "NotFound", f'"{name}" not found', {"name": name})

    def create(self, resource: str, ns: str, obj: dict[str, Any],
               manager: str = "") -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta.pop("managedFields", None)  # the server's to write
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise Invalid("metadata.name: Required value: name or generateName is "
                              "required")
            meta["name"] = prefix + uuid.uuid4().hex[:5]
        if resource == "resourceslices":
            validation.check_slice(obj, taints_allowed=self.cluster.taints_allowed)
        if resource == "resourceclaims":
            validation.check_claim_config(obj)
            validation.check_claim(obj, self.cluster.namespaces.get(ns, {}))
        items = self.items(resource)
        if any(o["metadata"]["name"] == meta["name"] and o["metadata"].get("namespace", "") == ns
               for o in items):
            raise HttpError(409, "AlreadyExists", f'{resource} "{meta["name"]}" already exists')
        if ns:
            meta["namespace"] = ns
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        meta["resourceVersion"] = self.next_rv()
        meta.pop("generation", None)
        obj["apiVersion"] = DRA
        obj["kind"] = {"resourceslices": "ResourceSlice",
                       "resourceclaims": "ResourceClaim"}.get(resource, obj.get("kind"))
        apply.record_update(obj, manager, DRA, meta["creationTimestamp"])
        items.append(obj)
        return obj

    def replace(self, resource: str, ns: str, name: str, obj: dict[str, Any],
                status_only: bool, manager: str = "") -> dict[str, Any]:
        items = self.items(resource)
        old = self.find(items, ns, name)
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
            apply.prune(new)
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
            # A write that changes nothing leaves managedFields as they were.
            apply.record_update(new, manager, DRA, now(), "status" if status_only else "")
            new["metadata"]["resourceVersion"] = self.next_rv()
        items[items.index(old)] = new
        return new

    def apply_status(self, resource: str, ns: str, name: str, body: dict[str, Any] | None,
                     query: dict[str, list[str]]) -> dict[str, Any]:
        """Server-side apply to the status subresource (``rdma_hca.devkit.kube.apply``)."""
        manager, force = apply.check_options(query)
        kind = {"resourceclaims": "ResourceClaim"}.get(resource, "")
        apply.check_body(body, name, ns, kind, DRA)
        assert body is not None
        items = self.items(resource)
        try:
            old = self.find(items, ns, name)
        except HttpError:
            uid = (body.get("metadata") or {}).get("uid")
            if uid:
                raise HttpError(409, "Conflict", f'Operation cannot be fulfilled on '
                                f'{resource} "{name}": uid mismatch: the provided object '
                                f'specified uid {uid}, and no existing object was found'
                                ) from None
            raise
        new = apply.apply_status(old, body, manager, force,
                                 gate_on=self.cluster.claim_device_status, api_version=DRA,
                                 stamp=now())
        if new != old:
            new["metadata"]["resourceVersion"] = self.next_rv()
        items[items.index(old)] = new
        return new

    @staticmethod
    def select(items: list[dict[str, Any]], ns: str | None, fields: str, labels: str,
               allowed: tuple[str, ...]) -> list[dict[str, Any]]:
        return [o for o in items
                if (ns is None or o["metadata"].get("namespace", "") == ns)
                and field_selector_matches(fields, o, allowed)
                and label_matches(labels, o["metadata"].get("labels") or {})]

    def list_answer(self, kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {"kind": kind, "apiVersion": "v1",
                "metadata": {"resourceVersion": self.next_rv()},
                "items": copy.deepcopy(items)}
