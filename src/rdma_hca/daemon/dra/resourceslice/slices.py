"""A ResourceSlice as this driver writes and reads it: typed records, the API's limits,
and how a pool's devices are cut into slices. Pure, no I/O.

The pool (one per node, named after it) is split over as many slices as the API's limits
need (upstream pkg/apis/resource/types.go: ``ResourceSliceMaxDevices = 128``,
``ResourceSliceMaxDevicesWithTaintsOrConsumesCounters = 64``,
``ResourceSliceMaxAttributesAndCapacitiesPerDevice = 32``). Devices go to slices in name
order, 64 a slice whenever taints may be published (so a port going down never moves a
device to another slice) and 128 otherwise: the same devices always make the same slices,
and one port changing rewrites the one slice that holds its device.

What is written is a :class:`ResourceSlice` (the API's field names, so it is its own JSON
body); what is read back is parsed at once into a :class:`StoredSlice`, the few fields the
publisher decides by.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict, cast

from rdma_hca.contract.dra import LINK_STATE
from rdma_hca.daemon.dra.devices import Device, fit

MAX_DEVICES = 128  # ResourceSliceMaxDevices
MAX_DEVICES_WITH_TAINTS = 64  # ResourceSliceMaxDevicesWithTaintsOrConsumesCounters
MAX_NAME = 253


class OwnerReference(TypedDict):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class SliceMeta(TypedDict):
    annotations: dict[str, str]
    name: NotRequired[str]
    generateName: NotRequired[str]
    resourceVersion: NotRequired[str]
    ownerReferences: NotRequired[list[OwnerReference]]


class SlicePool(TypedDict):
    name: str
    generation: int
    resourceSliceCount: int


class SliceSpec(TypedDict):
    driver: str
    nodeName: str
    pool: SlicePool
    devices: list[Device]


class ResourceSlice(TypedDict):
    apiVersion: str
    kind: str
    metadata: SliceMeta
    spec: SliceSpec


def body(obj: ResourceSlice) -> dict[str, Any]:
    """The slice as the API client sends it: a TypedDict is the JSON object already."""
    return cast(dict[str, Any], obj)


@dataclass(frozen=True, slots=True)
class StoredSlice:
    """What the publisher reads of a slice the server holds (parsed at the edge)."""

    name: str
    resource_version: str
    pool: str
    generation: int
    annotations: Mapping[str, str]
    node_owners: frozenset[str]  # UIDs of the Node objects among its ownerReferences

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> StoredSlice:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        pool = spec.get("pool") or {}
        annotations = meta.get("annotations") or {}
        return cls(
            name=str(meta.get("name", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            pool=str(pool.get("name", "")),
            generation=int(pool.get("generation") or 0),
            annotations={str(k): str(v) for k, v in annotations.items()},
            node_owners=frozenset(str(ref.get("uid")) for ref in
                                  meta.get("ownerReferences") or []
                                  if ref.get("kind") == "Node"))


def node_owner(node: str, obj: Mapping[str, Any]) -> OwnerReference | None:
    """The ownerReference to a Node object read from the API server (None: it has no UID)."""
    uid = (obj.get("metadata") or {}).get("uid")
    if not uid:
        return None
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": str(uid),
            "controller": True}


def fit_device(device: Device) -> Device:
    """The device within the API's 32 attributes and capacities (``devices.fit``): a guard
    for devices that did not come through ``DeviceOffer``, which fits its own and says
    what it left out, so that one device never makes the whole slice fail."""
    return fit(device).device


def split(devices: Sequence[Device], *, taints: bool) -> list[list[Device]]:
    """Devices in name order, cut into slices the API server accepts; at least one slice
    (an empty pool still says so)."""
    ordered = sorted((fit_device(d.copy()) for d in devices), key=lambda d: d["name"])
    tainted = any(d.get("taints") for d in ordered)
    per = MAX_DEVICES_WITH_TAINTS if taints or tainted else MAX_DEVICES
    chunks = [ordered[i:i + per] for i in range(0, len(ordered), per)]
    return chunks or [[]]


def without_taints(devices: Sequence[Device]) -> list[Device]:
    """The devices as an API server that refuses device taints takes them."""
    out = []
    for d in devices:
        d = d.copy()
        d.pop("taints", None)
        out.append(d)
    return out


def content_digest(devices: Sequence[Device], count: int, owner: str) -> str:
    text = json.dumps([devices, count, owner], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def generate_name(node: str, driver: str, index: int) -> str:
    base = re.sub(r"[^a-z0-9.-]+", "-", f"{node}-{driver}".lower()).strip("-.")
    return f"{base[:MAX_NAME - 20]}-{index}-"


def down_devices(devices: Sequence[Device]) -> frozenset[str]:
    """Names of the devices that are tainted or whose linkState says down."""
    out = []
    for d in devices:
        state = next((v.get("string") for k, v in (d.get("attributes") or {}).items()
                      if k.endswith("/" + LINK_STATE)), None)
        if d.get("taints") or state == "down":
            out.append(d["name"])
    return frozenset(out)
