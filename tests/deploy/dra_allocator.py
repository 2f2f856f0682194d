"""What the scheduler's DRA allocator decides for one claim on one node, done by search.

Only what the examples use, and as strict as upstream where they touch it
(k8s.io/dynamic-resource-allocation/structured): each ``exactly`` request takes ``count``
devices (ExactCount, 1 by default) that its DeviceClass's selectors and its own select;
a device with a NoSchedule or NoExecute taint is never taken (no tolerations here); a device
goes to one request only unless it has ``allowMultipleAllocations``, and then each request
consumes its capacity (what it asks, else the request policy's default) within the
device's value; ``matchAttribute`` needs the attribute on every device of its requests, one
value for all; ``distinctAttribute`` needs it on every one, a different value each. The
search tries devices in the order given and backtracks, as the allocator does; a selector
that errs aborts, as it does. The search is exhaustive, so a claim that cannot be met on a
large node may take long: past ``budget`` placements it stops with SearchTooLong (the
scheduler stops at its filter timeout), never with a wrong "Pending". Anything else in a
claim (``firstAvailable``, ``All``, tolerations, admin access) is refused rather than
guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vap_emulator import device_selected

from rdma_hca.kit.quantity import parse_quantity


@dataclass(frozen=True)
class Published:
    """A device as a ResourceSlice holds it, with its driver."""

    driver: str
    device: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.device["name"])

    def attribute(self, name: str) -> object | None:
        value = (self.device.get("attributes") or {}).get(name)
        if value is None:
            return None
        (kind,) = value
        return (kind, value[kind])


Allocation = dict[str, list[Published]]  # request name -> its devices
BUDGET = 200_000


class SearchTooLong(AssertionError):
    """The search gave up: the claim needs a smaller node or a smaller claim to decide."""


def _selected(request: Mapping[str, Any], classes: Mapping[str, Any],
              device: Published) -> bool:
    exactly = request["exactly"]
    selectors = [*classes[exactly["deviceClassName"]]["spec"].get("selectors", []),
                 *exactly.get("selectors", [])]
    return all(device_selected(s["cel"]["expression"], device.driver, device.device)
               for s in selectors)


def _tainted(device: Published) -> bool:
    return any(t.get("effect") in {"NoSchedule", "NoExecute"}
               for t in device.device.get("taints") or [])


def _consumed(request: Mapping[str, Any], device: Published) -> dict[str, int]:
    asked = (request["exactly"].get("capacity") or {}).get("requests") or {}
    used: dict[str, int] = {}
    for name, cap in (device.device.get("capacity") or {}).items():
        policy = cap.get("requestPolicy") or {}
        value = asked.get(name, policy.get("default", cap["value"]))
        used[name] = int(parse_quantity(value).value)
    return used


class Search:
    def __init__(self, claim: Mapping[str, Any], classes: Mapping[str, Any],
                 devices: Sequence[Published], budget: int = BUDGET) -> None:
        self.budget = budget
        spec = claim["devices"]
        self.requests = list(spec["requests"])
        self.constraints = list(spec.get("constraints") or [])
        for request in self.requests:
            exactly = request.get("exactly")
            if exactly is None or exactly.get("allocationMode", "ExactCount") != "ExactCount" \
                    or exactly.get("tolerations") or exactly.get("adminAccess"):
                raise NotImplementedError(f"request {request['name']}: not emulated")
        self.slots = [(r["name"], r) for r in self.requests
                      for _ in range(r["exactly"].get("count", 1))]
        self.candidates = {r["name"]: [d for d in devices
                                       if not _tainted(d) and _selected(r, classes, d)]
                           for r in self.requests}
        self.names = [r["name"] for r in self.requests]

    def _constraint_holds(self, constraint: Mapping[str, Any], chosen: Allocation) -> bool:
        names = constraint.get("requests") or self.names
        devices = [d for n in names for d in chosen.get(n, [])]
        if "matchAttribute" in constraint:
            values = [d.attribute(constraint["matchAttribute"]) for d in devices]
            return None not in values and len(set(map(repr, values))) <= 1
        if "distinctAttribute" in constraint:
            values = [d.attribute(constraint["distinctAttribute"]) for d in devices]
            return None not in values and len(set(map(repr, values))) == len(values)
        raise NotImplementedError(f"constraint {constraint}: not emulated")

    def _fits(self, request: Mapping[str, Any], device: Published, chosen: Allocation,
              used: dict[str, dict[str, int]]) -> bool:
        taken = any(device in ds for ds in chosen.values())
        if taken and not device.device.get("allowMultipleAllocations"):
            return False
        if device in chosen.get(request["name"], []):
            return False  # one request's devices are different devices
        for name, amount in _consumed(request, device).items():
            total = int(parse_quantity(device.device["capacity"][name]["value"]).value)
            if used.get(device.name, {}).get(name, 0) + amount > total:
                return False
        return True

    def first(self) -> Allocation | None:
        """The first allocation in the allocator's order, or None: the pod stays Pending."""
        chosen: Allocation = {}
        used: dict[str, dict[str, int]] = {}

        def place(i: int) -> bool:
            if i == len(self.slots):
                return True
            name, request = self.slots[i]
            for device in self.candidates[name]:
                if not self._fits(request, device, chosen, used):
                    continue
                self.budget -= 1
                if self.budget < 0:
                    raise SearchTooLong(f"no answer within {BUDGET} placements")
                chosen.setdefault(name, []).append(device)
                consumed = _consumed(request, device)
                for cap, amount in consumed.items():
                    used.setdefault(device.name, {})[cap] = \
                        used.get(device.name, {}).get(cap, 0) + amount
                if all(self._constraint_holds(c, chosen) for c in self.constraints) \
                        and place(i + 1):
                    return True
                chosen[name].pop()
                for cap, amount in consumed.items():
                    used[device.name][cap] -= amount
            return False

        return {n: list(ds) for n, ds in chosen.items()} if place(0) else None


def allocate(claim: Mapping[str, Any], classes: Mapping[str, Any],
             devices: Sequence[Published], budget: int = BUDGET) -> Allocation | None:
    """``claim`` (a ResourceClaim's spec) on a node publishing ``devices``."""
    return Search(claim, classes, devices, budget).first()
