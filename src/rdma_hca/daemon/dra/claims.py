"""A ResourceClaim as the driver reads it: typed records, parsed at the API edge.

The kubelet names a claim (:class:`ClaimRef`); the helper fetches the API server's
ResourceClaim and parses it into a :class:`Claim` here, once: Prepare and the status
writer read the same record (the allocation's results, the generation, the
``status.devices`` entries already there). The status writer's own reads of the claim
(again, or as an apply answered) come through :func:`read_claim`, which takes what it
finds. Nothing past these two indexes the object; only the Events, which start from the
object as read, get it whole (``Claim.source``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rdma_hca.contract.dra import request_name
from rdma_hca.contract.hcaconfig import (
    KIND,
    ConfigEntry,
    HcaConfig,
    HcaConfigError,
    merged,
    read_entries,
)
from rdma_hca.daemon.dra.claimrecords import DeviceEntry
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
    # adminAccess: the device is given for watching it, beside whatever claims hold it.
    admin_access: bool = False

    @property
    def request_name(self) -> str:
        """The request as the kubelet matches a container's ``request`` against it."""
        return request_name(self.request)


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
    generation: int | None = None  # metadata.generation, which a Ready condition observes
    entries: tuple[DeviceEntry, ...] = ()  # status.devices, every driver's
    # The object as read: what an Event about the claim names.
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    config: tuple[ConfigEntry, ...] = ()  # status.allocation.devices.config, every driver's

    def of(self, driver: str) -> tuple[AllocatedDevice, ...]:
        return tuple(d for d in self.devices if d.driver == driver)

    def entries_of(self, driver: str) -> tuple[DeviceEntry, ...]:
        return tuple(e for e in self.entries if e.driver == driver)

    def hca_config(self, driver: str, request: str) -> HcaConfig:
        """What ``request`` (as the allocation names it: ``hca/any``) was asked for in
        ``driver``'s opaque config; ClaimError when the parameters cannot be taken."""
        try:
            return merged(self.config, driver, request)
        except HcaConfigError as exc:
            raise ClaimConfigError(str(exc)) from exc

    def device_configs(self, driver: str) -> dict[str, HcaConfig]:
        """What each of ``driver``'s devices was asked for: one CDI device carries one
        env, so requests that got the same device must agree (ClaimConfigError if not)."""
        out: dict[str, tuple[str, HcaConfig]] = {}
        for r in self.of(driver):
            asked = self.hca_config(driver, r.request)
            known = out.setdefault(r.device, (r.request, asked))
            if known[1] != asked:
                raise ClaimConfigError(
                    f'requests "{known[0]}" and "{r.request}" got the same device {r.device} '
                    f"and their {KIND} settings differ ({known[1].as_fields()} and "
                    f"{asked.as_fields()}): one device gives one setting")
        return {device: asked for device, (_, asked) in out.items()}

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.namespace, self.uid, self.name)


class ClaimError(ValueError):
    """The claim cannot be prepared here: the message says why, ``fix`` what to do.

    Raised where the problem is found, by a subclass whose ``fix`` fits it; a plain one is
    a claim whose allocation this node cannot give now.
    """

    fix = ("the HCA the claim was given left this node or cannot be used (the node's "
           "Events, HcaDeviceGone and HcaPortDown, say why), or its allocation does not fit "
           "this node; fix the HCA, or delete the pod so the scheduler allocates another "
           "device")


class NotAllocatedHere(ClaimError):
    fix = ("the claim was not allocated on this node for this driver; delete the pod so the "
           "scheduler allocates it again")


class HcaGone(ClaimError):
    fix = ("the HCA left this node after the claim was allocated; the node's Events "
           "(HcaDeviceGone, HcaPortDown) say why. Delete the pod so the scheduler allocates "
           "another device")


class HcaUnusable(ClaimError):
    fix = ("the HCA is on the node but not usable (its problem is above); fix the HCA, or "
           "delete the pod so the scheduler allocates another device")


class AllocationUnreadable(ClaimError):
    fix = ("the claim's allocation says what it consumed of a device in a form the driver "
           "cannot take (the problem is above); delete the pod so the scheduler allocates "
           "the claim again, and report it if it comes back")


class ClaimConfigError(ClaimError, HcaConfigError):
    """The claim's parameters for this driver cannot be taken (its fix: :attr:`fix`)."""

    fix = HcaConfigError.fix  # ClaimError's comes first in the MRO otherwise


def _text(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise ClaimError(f"{where} has no {key}")
    return value


def parse_claim(obj: object) -> Claim:
    """The API server's ResourceClaim object as a :class:`Claim`, for a Prepare: one
    without its name or UID is an error."""
    if not isinstance(obj, Mapping):
        raise ClaimError(f"the API server answered {short_repr(obj)}, not a ResourceClaim")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ClaimError("the ResourceClaim has no metadata")
    name = _text(meta, "name", "the ResourceClaim")
    _text(meta, "uid", f"ResourceClaim {meta.get('namespace') or ''}/{name}")
    return read_claim(obj)


def _dicts(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def read_claim(obj: Mapping[str, Any]) -> Claim:
    """The claim as the API server answered it; missing or malformed parts read as none."""
    meta, status = _dict(obj.get("metadata")), _dict(obj.get("status"))
    allocation = _dict(status.get("allocation"))
    devices = []
    for r in _dicts(_dict(allocation.get("devices")).get("results")):
        share = r.get("shareID")
        consumed = r.get("consumedCapacity")
        devices.append(AllocatedDevice(
            str(r.get("request") or ""), str(r.get("driver") or ""), str(r.get("pool") or ""),
            str(r.get("device") or ""), str(share) if share else None,
            {str(k): str(v) for k, v in consumed.items()}
            if isinstance(consumed, Mapping) else {},
            r.get("adminAccess") is True))
    generation = meta.get("generation")
    return Claim(str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                 str(meta.get("uid") or ""), tuple(devices), pod_claim_name(obj),
                 bool(allocation), generation if isinstance(generation, int) else None,
                 tuple(DeviceEntry.from_api(e) for e in _dicts(status.get("devices"))), obj,
                 read_entries(_dict(allocation.get("devices")).get("config")))


def claim_field(ref: ClaimRef) -> str:
    """``namespace/name`` for the logs' claim field, bounded: the kubelet's call is input."""
    return f"{ref.namespace}/{ref.name}"[:MAX_CLAIM_FIELD]
