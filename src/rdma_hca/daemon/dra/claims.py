"""A ResourceClaim as the driver reads it: typed records, parsed at the API edge.

The kubelet names a claim (:class:`ClaimRef`); the helper fetches the API server's
ResourceClaim and parses it into a :class:`Claim` here. Nothing past :func:`parse_claim`
indexes the object; only the status writer and the Events, which start from the object
as read, get it whole (``Claim.source``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rdma_hca.daemon.dra.metadata import pod_claim_name
from rdma_hca.kit.text import short_repr

MAX_CLAIM_FIELD = 320  # a namespace (63) and a name (253), and the slash


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it in a call."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One entry of ``status.allocation.devices.results``."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    # consumedCapacity: what this share takes of the device's capacities, by name.
    consumed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Claim:
    """A ResourceClaim, as far as the driver reads it."""

    namespace: str
    name: str
    uid: str
    devices: tuple[AllocatedDevice, ...]  # every driver's
    # The name the pod gives a claim made from its template; None for a named claim.
    pod_claim: str | None = None
    allocated: bool = True  # the scheduler wrote status.allocation
    # The object as read: what a status write starts from, saving a read of its own.
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def of(self, driver: str) -> tuple[AllocatedDevice, ...]:
        return tuple(d for d in self.devices if d.driver == driver)

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.namespace, self.uid, self.name)


class ClaimError(ValueError):
    """The claim cannot be prepared here; the message says why."""


def _text(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise ClaimError(f"{where} has no {key}")
    return value


def parse_claim(obj: object) -> Claim:
    """The API server's ResourceClaim object as a :class:`Claim`."""
    if not isinstance(obj, Mapping):
        raise ClaimError(f"the API server answered {short_repr(obj)}, not a ResourceClaim")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ClaimError("the ResourceClaim has no metadata")
    namespace = str(meta.get("namespace") or "")
    name = _text(meta, "name", "the ResourceClaim")
    uid = _text(meta, "uid", f"ResourceClaim {namespace}/{name}")
    status = obj.get("status") or {}
    allocation = (status.get("allocation") or {}) if isinstance(status, Mapping) else {}
    results = ((allocation.get("devices") or {}).get("results") or []
               if isinstance(allocation, Mapping) else [])
    devices = []
    for r in results if isinstance(results, list) else []:
        if not isinstance(r, Mapping):
            continue
        share = r.get("shareID")
        consumed = r.get("consumedCapacity")
        devices.append(AllocatedDevice(
            str(r.get("request", "")), str(r.get("driver", "")), str(r.get("pool", "")),
            str(r.get("device", "")), str(share) if share else None,
            {str(k): str(v) for k, v in consumed.items()}
            if isinstance(consumed, Mapping) else {}))
    return Claim(namespace, name, uid, tuple(devices), pod_claim_name(obj),
                 isinstance(allocation, Mapping) and bool(allocation), obj)


def claim_field(ref: ClaimRef) -> str:
    """``namespace/name`` for the logs' claim field, bounded: the kubelet's call is input."""
    return f"{ref.namespace}/{ref.name}"[:MAX_CLAIM_FIELD]
