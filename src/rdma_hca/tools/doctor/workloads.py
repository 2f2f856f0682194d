"""The core and apps objects the cluster view reads (Nodes, the DaemonSet, its Pods),
parsed once where the API server's JSON comes in.

Each record holds what the doctor judges and nothing else. Parsing is lenient as
``kubectl get`` is: a field the server left out reads as empty, so an odd object is
reported on, not a crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class DaemonSet:
    name: str
    created: str | None  # metadata.creationTimestamp
    selector: Mapping[str, Any]  # spec.selector, the LabelSelector its pods are listed by
    node_selector: Mapping[str, str]  # of its pod template
    desired: int
    current: int
    ready: int
    up_to_date: int
    available: int
    # A container of its pod template holds CAP_NET_RAW (fabric.lldp adds it): whether
    # its daemons can listen for LLDP.
    net_raw: bool = False


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    labels: Mapping[str, str]
    ready: bool  # its Ready condition is True
    capacity: Mapping[str, str]  # status.capacity, quantities as the server wrote them
    allocatable: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Container:
    words: tuple[str, ...]  # its command, then its args
    # Its variables with a literal value; one taken from a ConfigMap or Secret (valueFrom)
    # is out of the doctor's sight.
    env: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    node_name: str | None
    deleting: bool  # metadata.deletionTimestamp is set
    ready: bool  # its Ready condition is True
    problem: str  # the most telling reason it is not ready, e.g. "CrashLoopBackOff"
    containers: tuple[Container, ...]


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _strings(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in _map(value).items()}


def _ready(status: Mapping[str, Any]) -> bool:
    for cond in _list(status.get("conditions")):
        if _map(cond).get("type") == "Ready":
            return bool(_map(cond).get("status") == "True")
    return False


def parse_daemonset(obj: Mapping[str, Any]) -> DaemonSet:
    meta, spec, status = _map(obj.get("metadata")), _map(obj.get("spec")), _map(obj.get("status"))
    created = meta.get("creationTimestamp")
    return DaemonSet(
        name=str(meta.get("name", "")),
        created=created if isinstance(created, str) and created else None,
        selector=_map(spec.get("selector")),
        node_selector=_strings(_map(_map(spec.get("template")).get("spec")).get("nodeSelector")),
        desired=_int(status.get("desiredNumberScheduled")),
        current=_int(status.get("currentNumberScheduled")),
        ready=_int(status.get("numberReady")),
        up_to_date=_int(status.get("updatedNumberScheduled")),
        available=_int(status.get("numberAvailable")),
        net_raw=any(_net_raw(_map(c)) for c in _list(
            _map(_map(spec.get("template")).get("spec")).get("containers"))),
    )


def _net_raw(container: Mapping[str, Any]) -> bool:
    context = _map(container.get("securityContext"))
    added = {str(c).upper().removeprefix("CAP_")
             for c in _list(_map(context.get("capabilities")).get("add"))}
    return context.get("privileged") is True or bool(added & {"NET_RAW", "ALL"})


def parse_node(obj: Mapping[str, Any]) -> Node:
    meta, status = _map(obj.get("metadata")), _map(obj.get("status"))
    return Node(str(meta.get("name", "")), _strings(meta.get("labels")), _ready(status),
                _strings(status.get("capacity")), _strings(status.get("allocatable")),
                _strings(meta.get("annotations")))


def _problem(status: Mapping[str, Any]) -> str:
    for cs in _list(status.get("containerStatuses")):
        for key in ("waiting", "terminated"):
            reason = _map(_map(_map(cs).get("state")).get(key)).get("reason")
            if reason:
                return str(reason)
    return str(status.get("phase") or "not ready")


def parse_container(obj: Mapping[str, Any]) -> Container:
    words = tuple(str(w) for w in [*_list(obj.get("command")), *_list(obj.get("args"))])
    env = {str(e.get("name")): str(e.get("value", "")) for e in _list(obj.get("env"))
           if isinstance(e, Mapping) and "valueFrom" not in e}
    return Container(words, env)


def parse_pod(obj: Mapping[str, Any]) -> Pod:
    meta, spec, status = _map(obj.get("metadata")), _map(obj.get("spec")), _map(obj.get("status"))
    node = spec.get("nodeName")
    return Pod(
        name=str(meta.get("name", "")),
        node_name=str(node) if node else None,
        deleting=bool(meta.get("deletionTimestamp")),
        ready=_ready(status),
        problem=_problem(status),
        containers=tuple(parse_container(_map(c)) for c in _list(spec.get("containers"))),
    )
