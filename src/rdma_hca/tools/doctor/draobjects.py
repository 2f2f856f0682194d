"""The DRA objects doctor reads, parsed once where the API server's JSON comes in.

ResourceSlices and DeviceClasses become frozen records holding what the doctor judges and
nothing else; everything past this module works on them, never on the JSON. Parsing is
lenient as ``kubectl get`` is: a field the server left out (or an object of another
shape, from a proxy or an older server) reads as empty, so one odd object is reported on,
not a crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rdma_hca.contract.dra import qualified

# A device attribute's value as the API types it: {"string": ...}, {"int": ...}, ...
AttributeValue = tuple[str, object]  # (type, value)


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of a ResourceSlice."""

    name: str
    attributes: Mapping[str, AttributeValue]  # name as published -> (type, value)
    taints: tuple[str, ...]  # the taints' keys

    def attribute(self, driver: str, name: str, kind: str) -> object:
        """The driver's attribute ``name`` (qualified or not) when it is of type ``kind``,
        else None."""
        for key in (qualified(driver, name), name):
            found = self.attributes.get(key)
            if found is not None:
                return found[1] if found[0] == kind else None
        return None


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    name: str
    node_name: str | None  # None: the slice is for several nodes (nodeSelector)
    pool: str
    generation: int
    slice_count: int  # resourceSliceCount, at least 1
    devices: tuple[SliceDevice, ...]


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    expressions: tuple[str, ...]  # the CEL of its selectors


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _name(obj: Mapping[str, Any]) -> str:
    return str(_map(obj.get("metadata")).get("name", ""))


def parse_device(obj: Mapping[str, Any]) -> SliceDevice:
    attributes: dict[str, AttributeValue] = {}
    for key, value in _map(obj.get("attributes")).items():
        typed = _map(value)
        if len(typed) == 1:
            ((kind, inner),) = typed.items()
            attributes[str(key)] = (str(kind), inner)
    taints = tuple(str(_map(t).get("key", "")) for t in _list(obj.get("taints")))
    return SliceDevice(str(obj.get("name", "?")), attributes, taints)


def parse_slice(obj: Mapping[str, Any]) -> ResourceSlice:
    spec = _map(obj.get("spec"))
    pool = _map(spec.get("pool"))
    generation = pool.get("generation")
    count = pool.get("resourceSliceCount")
    node = spec.get("nodeName")
    return ResourceSlice(
        name=_name(obj),
        node_name=str(node) if node else None,
        pool=str(pool.get("name", "")),
        generation=generation if isinstance(generation, int) else 0,
        slice_count=count if isinstance(count, int) and count > 0 else 1,
        devices=tuple(parse_device(_map(d)) for d in _list(spec.get("devices"))),
    )


def parse_device_class(obj: Mapping[str, Any]) -> DeviceClass:
    expressions = []
    for selector in _list(_map(obj.get("spec")).get("selectors")):
        expression = _map(_map(selector).get("cel")).get("expression")
        if isinstance(expression, str):
            expressions.append(expression)
    return DeviceClass(_name(obj), tuple(expressions))
