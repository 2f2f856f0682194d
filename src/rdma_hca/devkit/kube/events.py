"""Events in the fake API server: ``events.k8s.io/v1`` and core ``v1`` over one store, as
the real server keeps them, validated as it validates them (pkg/apis/core/validation's
events rules: the legacy checks for both versions, the strict ones for creates and
updates through ``events.k8s.io/v1``), and patched with JSON merge patches.

Stored in the ``events.k8s.io/v1`` shape; a core request's fields are renamed on the way
in and out (``involvedObject`` is ``regarding``, ``message`` is ``note``, ``count`` is
``deprecatedCount``...).
"""

from __future__ import annotations

import copy
import re
import uuid
from typing import Any

from rdma_hca.devkit.kube.errors import HttpError, not_found
from rdma_hca.devkit.kube.store import Store, now
from rdma_hca.devkit.kube.validation import Invalid

EVENTS_V1 = "events.k8s.io/v1"
REPORTING_INSTANCE_MAX = 128
ACTION_MAX = 128
REASON_MAX = 128
NOTE_MAX = 1024
MERGE_PATCH = ("application/merge-patch+json", "application/strategic-merge-patch+json")

# core v1 name -> events.k8s.io/v1 name; the rest are the same in both.
_CORE_TO_V1 = {"involvedObject": "regarding", "message": "note",
               "reportingComponent": "reportingController", "source": "deprecatedSource",
               "firstTimestamp": "deprecatedFirstTimestamp",
               "lastTimestamp": "deprecatedLastTimestamp", "count": "deprecatedCount"}
_V1_TO_CORE = {v: k for k, v in _CORE_TO_V1.items()}
# What an update through events.k8s.io/v1 may not change (the upstream names).
_IMMUTABLE = ("regarding", "reason", "note", "deprecatedSource", "deprecatedFirstTimestamp",
              "deprecatedLastTimestamp", "deprecatedCount", "type", "eventTime", "action",
              "related", "reportingController", "reportingInstance")
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def _upstream(name: str) -> str:
    """The field's name in the server's words (its internal type is the core Event)."""
    return _V1_TO_CORE.get(name, name)


def to_v1(core: dict[str, Any]) -> dict[str, Any]:
    out = {_CORE_TO_V1.get(k, k): copy.deepcopy(v) for k, v in core.items()}
    out["apiVersion"], out["kind"] = EVENTS_V1, "Event"
    return out


def to_core(v1: dict[str, Any]) -> dict[str, Any]:
    out = {_V1_TO_CORE.get(k, k): copy.deepcopy(v) for k, v in v1.items()}
    out["apiVersion"], out["kind"] = "v1", "Event"
    return out


def _subdomain(value: str) -> bool:
    return len(value) <= 253 and bool(_DNS1123_SUBDOMAIN.match(value))


def check_legacy(event: dict[str, Any], ns: str) -> None:
    """What every Event must pass, whichever version wrote it."""
    regarding = event.get("regarding") or {}
    ref_ns = str(regarding.get("namespace") or "")
    if not event.get("eventTime"):
        if (ref_ns == "" and ns not in ("", "default")) or (ref_ns and ns != ref_ns):
            raise Invalid(f"involvedObject.namespace: Invalid value: {ref_ns!r}: does not "
                          "match event.namespace")
    else:
        if ref_ns == "" and ns not in ("default", "kube-system"):
            raise Invalid(f"involvedObject.namespace: Invalid value: {ref_ns!r}: does not "
                          "match event.namespace")
        controller = str(event.get("reportingController") or "")
        if not controller:
            raise Invalid("reportingController: Required value")
        if len(controller.rpartition("/")[2]) > 63 or not _QUALIFIED.match(
                controller.rpartition("/")[2]):
            raise Invalid(f"reportingController: Invalid value: {controller!r}: must be a "
                          "qualified name")
        for key, most in (("reportingInstance", REPORTING_INSTANCE_MAX),
                          ("action", ACTION_MAX), ("reason", REASON_MAX)):
            value = str(event.get(key) or "")
            if not value:
                raise Invalid(f"{_upstream(key)}: Required value")
            if len(value) > most:
                raise Invalid(f"{_upstream(key)}: Invalid value: \"\": can have at most "
                              f"{most} characters")
        if len(str(event.get("note") or "")) > NOTE_MAX:
            raise Invalid(f"message: Invalid value: \"\": can have at most {NOTE_MAX} "
                          "characters")
    if ns and not _subdomain(ns):
        raise Invalid(f"namespace: Invalid value: {ns!r}: a lowercase RFC 1123 subdomain "
                      "must consist of lower case alphanumeric characters, '-' or '.'")


def _check_series(event: dict[str, Any]) -> None:
    series = event.get("series")
    if series is None:
        return
    if not isinstance(series, dict) or int(series.get("count") or 0) < 2:
        raise Invalid("series.count: Invalid value: \"\": should be at least 2")
    if not series.get("lastObservedTime"):
        raise Invalid("series.lastObservedTime: Required value")


def check_v1_create(event: dict[str, Any], ns: str) -> None:
    """The strict checks of a create through events.k8s.io/v1, after the legacy ones."""
    check_legacy(event, ns)
    name = str((event.get("metadata") or {}).get("name") or "")
    if not _subdomain(name):
        raise Invalid(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 "
                      "subdomain must consist of lower case alphanumeric characters, '-' "
                      "or '.'")
    _check_series(event)
    if not event.get("eventTime"):
        raise Invalid("eventTime: Required value")
    if event.get("type") not in ("Normal", "Warning"):
        raise Invalid(f"type: Invalid value: \"\": has invalid value: {event.get('type', '')}")
    for key in ("deprecatedFirstTimestamp", "deprecatedLastTimestamp", "deprecatedCount"):
        if event.get(key):
            raise Invalid(f"{_upstream(key)}: Invalid value: \"\": needs to be unset")
    source = event.get("deprecatedSource") or {}
    if source.get("component") or source.get("host"):
        raise Invalid("source: Invalid value: \"\": needs to be unset")


def check_v1_update(new: dict[str, Any], old: dict[str, Any], ns: str) -> None:
    check_legacy(new, ns)
    if new.get("series") != old.get("series"):
        _check_series(new)
    for key in _IMMUTABLE:
        if new.get(key) != old.get(key):
            raise Invalid(f"{_upstream(key)}: Invalid value: {new.get(key)!r}: field is "
                          "immutable")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _resource_list() -> dict[str, Any]:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": EVENTS_V1,
            "resources": [{"name": "events", "singularName": "event", "namespaced": True,
                           "kind": "Event", "verbs": ["create", "delete", "deletecollection",
                                                     "get", "list", "patch", "update",
                                                     "watch"],
                           "shortNames": ["ev"]}]}


class EventsApi:
    """Both versions' paths over the one store (``FakeCluster.events``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cluster = store.cluster

    def handle(self, method: str, parts: list[str], body: dict[str, Any] | None,
               content_type: str) -> tuple[int, dict[str, Any]] | None:
        """The answer, or None when the path is not an Events path."""
        if parts[:2] == ["api", "v1"]:
            version, rest = "v1", parts[2:]
        elif parts[:3] == ["apis", "events.k8s.io", "v1"]:
            if not self.cluster.events_v1:
                raise not_found()
            version, rest = EVENTS_V1, parts[3:]
            if not rest and method == "GET":
                return 200, _resource_list()
        else:
            return None
        if rest == ["events"] and method == "GET":
            return 200, self._list(version, None)
        if len(rest) < 3 or rest[0] != "namespaces" or rest[2] != "events" or len(rest) > 4:
            return None
        ns, name = rest[1], (rest[3] if len(rest) == 4 else None)
        self._guard(method, ns, version)
        if name is None:
            if method == "GET":
                return 200, self._list(version, ns)
            if method == "POST":
                if body is None:
                    raise HttpError(400, "BadRequest", "a body is required")
                return 201, self._create(version, ns, body)
            raise HttpError(405, "MethodNotAllowed", f"{method} is not allowed here")
        if method == "GET":
            return 200, self._out(version, self.store.find(self.cluster.events, ns, name))
        if method == "PATCH":
            if content_type.split(";")[0].strip() not in MERGE_PATCH:
                raise HttpError(415, "UnsupportedMediaType",
                                f"the body of the request was in an unknown format - accepted "
                                f"media types include: {', '.join(MERGE_PATCH)}")
            if body is None:
                raise HttpError(400, "BadRequest", "a body is required")
            return 200, self._patch(version, ns, name, body)
        if method == "DELETE":
            obj = self.store.find(self.cluster.events, ns, name)
            self.cluster.events.remove(obj)
            return 200, self._out(version, obj)
        raise HttpError(405, "MethodNotAllowed", f"{method} is not allowed here")

    def _guard(self, method: str, ns: str, version: str) -> None:
        verb = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update",
                "DELETE": "delete"}.get(method, method.lower())
        if "events" in self.cluster.forbidden:
            group = "events.k8s.io" if version == EVENTS_V1 else ""
            raise HttpError(403, "Forbidden",
                            f'events is forbidden: User "system:serviceaccount:default:'
                            f'viewer" cannot {verb} resource "events" in API group '
                            f'"{group}" in the namespace "{ns}"', {"kind": "events"})

    @staticmethod
    def _out(version: str, stored: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(stored) if version == EVENTS_V1 else to_core(stored)

    def _list(self, version: str, ns: str | None) -> dict[str, Any]:
        items = [self._out(version, e) for e in self.cluster.events
                 if ns is None or e["metadata"].get("namespace") == ns]
        return {"kind": "EventList", "apiVersion": version,
                "metadata": {"resourceVersion": self.store.next_rv()}, "items": items}

    def _create(self, version: str, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        event = copy.deepcopy(body) if version == EVENTS_V1 else to_v1(body)
        meta = event.setdefault("metadata", {})
        if meta.get("namespace", ns) != ns:
            raise HttpError(400, "BadRequest", "the namespace of the provided object does not "
                            "match the namespace sent on the request")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = str(meta["generateName"]) + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise Invalid("metadata.name: Required value: name or generateName is required")
        if version == EVENTS_V1:
            check_v1_create(event, ns)
        else:
            check_legacy(event, ns)
        if any(e["metadata"]["name"] == meta["name"] and e["metadata"].get("namespace") == ns
               for e in self.cluster.events):
            raise HttpError(409, "AlreadyExists", f'events "{meta["name"]}" already exists')
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now(),
                    resourceVersion=self.store.next_rv())
        event["apiVersion"], event["kind"] = EVENTS_V1, "Event"
        self.cluster.events.append(event)
        return self._out(version, event)

    def _patch(self, version: str, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        old = self.store.find(self.cluster.events, ns, name)
        current = old if version == EVENTS_V1 else to_core(old)
        merged = merge_patch(current, patch)
        new = merged if version == EVENTS_V1 else to_v1(merged)
        new_meta, old_meta = new.get("metadata") or {}, old["metadata"]
        for key in ("name", "namespace", "uid"):
            if new_meta.get(key) != old_meta.get(key):
                raise Invalid(f"metadata.{key}: Invalid value: {new_meta.get(key)!r}: field "
                              "is immutable")
        if version == EVENTS_V1:
            check_v1_update(new, old, ns)
        else:
            check_legacy(new, ns)
        new["apiVersion"], new["kind"] = EVENTS_V1, "Event"
        if new != old:
            new["metadata"]["resourceVersion"] = self.store.next_rv()
        self.cluster.events[self.cluster.events.index(old)] = new
        return self._out(version, new)
