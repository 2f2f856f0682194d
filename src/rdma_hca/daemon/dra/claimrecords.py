"""The ``status.devices`` entries of a ResourceClaim, as typed records: read with the
claim (``claims.py``) and turned into the body of an apply patch here, at the edge, and
nowhere else.

An entry is keyed as the API keys the list (``+listType=map``, ``+listMapKey`` driver,
pool, device, shareID): that key is what server-side apply merges by, so entries of other
drivers (other field managers) are never part of what we send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EntryKey = tuple[str, str, str, str]  # driver, pool, device, shareID ("" when none)


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str  # RFC 3339, seconds
    observed_generation: int | None = None

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "status": self.status,
                               "reason": self.reason, "message": self.message,
                               "lastTransitionTime": self.last_transition_time}
        if self.observed_generation is not None:
            out["observedGeneration"] = self.observed_generation
        return out

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Condition:
        generation = raw.get("observedGeneration")
        return cls(str(raw.get("type") or ""), str(raw.get("status") or ""),
                   str(raw.get("reason") or ""), str(raw.get("message") or ""),
                   str(raw.get("lastTransitionTime") or ""),
                   generation if isinstance(generation, int) else None)

    def timeless(self) -> Condition:
        """The same condition without its time: what two writes compare."""
        return Condition(self.type, self.status, self.reason, self.message, "",
                         self.observed_generation)


@dataclass(frozen=True, slots=True)
class NetworkData:
    interface_name: str = ""
    hardware_address: str = ""
    ips: tuple[str, ...] = ()

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.interface_name:
            out["interfaceName"] = self.interface_name
        if self.hardware_address:
            out["hardwareAddress"] = self.hardware_address
        if self.ips:
            out["ips"] = list(self.ips)
        return out

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> NetworkData:
        ips = raw.get("ips")
        return cls(str(raw.get("interfaceName") or ""), str(raw.get("hardwareAddress") or ""),
                   tuple(str(ip) for ip in ips) if isinstance(ips, list) else ())


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """One ``status.devices[]`` entry."""

    driver: str
    pool: str
    device: str
    share_id: str = ""
    conditions: tuple[Condition, ...] = ()
    network: NetworkData | None = None

    @property
    def key(self) -> EntryKey:
        return (self.driver, self.pool, self.device, self.share_id)

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": self.driver, "pool": self.pool,
                               "device": self.device}
        if self.share_id:
            out["shareID"] = self.share_id
        if self.conditions:
            out["conditions"] = [c.to_api() for c in self.conditions]
        network = self.network.to_api() if self.network is not None else {}
        if network:
            out["networkData"] = network
        return out

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> DeviceEntry:
        conditions = raw.get("conditions")
        network = raw.get("networkData")
        return cls(str(raw.get("driver") or ""), str(raw.get("pool") or ""),
                   str(raw.get("device") or ""), str(raw.get("shareID") or ""),
                   tuple(Condition.from_api(c) for c in conditions if isinstance(c, dict))
                   if isinstance(conditions, list) else (),
                   NetworkData.from_api(network) if isinstance(network, dict) else None)

    def timeless(self) -> DeviceEntry:
        network = self.network if self.network and self.network.to_api() else None
        return DeviceEntry(self.driver, self.pool, self.device, self.share_id,
                           tuple(c.timeless() for c in self.conditions), network)


def same_entries(a: Sequence[DeviceEntry], b: Sequence[DeviceEntry]) -> bool:
    """The same entries, in any order, whatever their conditions' times say."""
    return sorted((e.timeless() for e in a), key=lambda e: e.key) == \
        sorted((e.timeless() for e in b), key=lambda e: e.key)


def apply_body(namespace: str, name: str, uid: str, entries: Sequence[DeviceEntry],
               api_version: str) -> dict[str, Any]:
    """The apply patch of a claim's ``/status``: only ``entries`` (a field manager's
    whole say: what it applied before and leaves out now is removed). ``uid`` makes a
    claim deleted meanwhile (409) or made again under the name (422) refuse it."""
    return {"apiVersion": api_version, "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "status": {"devices": [e.to_api() for e in entries]}}
