"""What an Event says and how each API spells it: ``events.k8s.io/v1`` (``regarding``,
``note``, ``series``) or the older core ``v1`` (``involvedObject``, ``message``, ``count``).

Fields are cut to the API server's limits here (reason, action and reporting instance 128
characters, the note 1 kB), so an Event is never refused for its length.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

EVENTS_V1 = "events.k8s.io/v1"
CORE_V1 = "v1"
NORMAL = "Normal"
WARNING = "Warning"
FIELD_MAX = 128  # reason, action, reportingInstance
NOTE_MAX = 1024  # bytes, as the server counts them
NAME_PREFIX_MAX = 200  # the object's name in the Event's name, leaving room for the suffix
# Events about cluster-scoped objects (a Node) live here, as the kubelet's do.
CLUSTER_EVENTS_NAMESPACE = "default"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (``regarding``) or also concerns (``related``)."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"

    def as_dict(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One thing to tell; equal specs are one series (a repeat counts, it is no new Event)."""

    regarding: ObjectRef
    reason: str  # UpperCamelCase, what `kubectl get events` sorts by
    note: str  # what went wrong and what to do
    type: str = WARNING
    action: str = ""  # what the reporter was doing (Prepare, Watch, Start)
    related: ObjectRef | None = None


def micro_time(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def seconds_time(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cut(text: str, most: int = FIELD_MAX) -> str:
    return text if len(text) <= most else text[:most]


def cut_note(note: str) -> str:
    data = note.encode()
    if len(data) <= NOTE_MAX:
        return note
    return data[:NOTE_MAX - 3].decode(errors="ignore") + "..."


def event_name(ref: ObjectRef, wall_ns: int) -> str:
    """``<object>.<hex time>``, as client-go names them: unique, and sorted by time."""
    return f"{ref.name[:NAME_PREFIX_MAX].rstrip('.-')}.{wall_ns:x}"


def event_namespace(ref: ObjectRef) -> str:
    return ref.namespace or CLUSTER_EVENTS_NAMESPACE


def create_body(api: str, spec: EventSpec, *, name: str, controller: str, instance: str,
                first: float, last: float, count: int) -> dict[str, Any]:
    """The new Event in ``api``'s shape; ``count`` > 1 when repeats came before it was sent."""
    meta = {"name": name, "namespace": event_namespace(spec.regarding)}
    action = cut(spec.action or spec.reason)
    if api == EVENTS_V1:
        body: dict[str, Any] = {
            "apiVersion": EVENTS_V1, "kind": "Event", "metadata": meta,
            "eventTime": micro_time(first), "reportingController": controller,
            "reportingInstance": cut(instance), "action": action,
            "reason": cut(spec.reason), "type": spec.type,
            "regarding": spec.regarding.as_dict(), "note": cut_note(spec.note)}
        if spec.related is not None:
            body["related"] = spec.related.as_dict()
        if count > 1:
            body["series"] = {"count": count, "lastObservedTime": micro_time(last)}
        return body
    body = {
        "apiVersion": CORE_V1, "kind": "Event", "metadata": meta,
        "involvedObject": spec.regarding.as_dict(), "reason": cut(spec.reason),
        "message": cut_note(spec.note), "type": spec.type, "action": action,
        "source": {"component": controller.rpartition("/")[2], "host": cut(instance)},
        "reportingComponent": controller, "reportingInstance": cut(instance),
        "firstTimestamp": seconds_time(first), "lastTimestamp": seconds_time(last),
        "count": count}
    if spec.related is not None:
        body["related"] = spec.related.as_dict()
    return body


def repeat_patch(api: str, *, count: int, last: float) -> dict[str, Any]:
    """The merge patch that counts repeats on the first Event of a series."""
    if api == EVENTS_V1:
        return {"series": {"count": count, "lastObservedTime": micro_time(last)}}
    return {"count": count, "lastTimestamp": seconds_time(last)}


def event_path(api: str, namespace: str, name: str | None = None) -> str:
    base = "/apis/events.k8s.io/v1" if api == EVENTS_V1 else "/api/v1"
    return f"{base}/namespaces/{namespace}/events" + (f"/{name}" if name else "")
