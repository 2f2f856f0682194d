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
scheduler stops at its filter timeout), never with a wrong "Pending".

A ``firstAvailable`` request (a prioritized list) takes the first of its subrequests, in
order, that can be met with the rest of the claim, and names its devices
``<request>/<subrequest>`` as the scheduler's results do; a constraint naming the request
covers its subrequest. An ``exactly`` request with ``adminAccess`` takes its devices even
when other claims (``in_use``) or other requests of the claim hold them, and holds
nothing itself. ``allocationMode: All`` takes every device the request selects, and
fails when one cannot be had. Anything else in a claim (tolerations, All of no device)
is refused rather than guessed.
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


# The request's name as the results give it (<request>/<subrequest> for a prioritized
# list) -> its devices.
Allocation = dict[str, list[Published]]
BUDGET = 200_000


class SearchTooLong(AssertionError):
    """The search gave up: the claim needs a smaller node or a smaller claim to decide."""


def _selected(exactly: Mapping[str, Any], classes: Mapping[str, Any],
              device: Published) -> bool:
    selectors = [*classes[exactly["deviceClassName"]]["spec"].get("selectors", []),
                 *exactly.get("selectors", [])]
    return all(device_selected(s["cel"]["expression"], device.driver, device.device)
               for s in selectors)


def _tainted(device: Published) -> bool:
    return any(t.get("effect") in {"NoSchedule", "NoExecute"}
               for t in device.device.get("taints") or [])


def _consumed(exactly: Mapping[str, Any], device: Published) -> dict[str, int]:
    if exactly.get("adminAccess"):
        return {}
    asked = (exactly.get("capacity") or {}).get("requests") or {}
    used: dict[str, int] = {}
    for name, cap in (device.device.get("capacity") or {}).items():
        policy = cap.get("requestPolicy") or {}
        value = asked.get(name, policy.get("default", cap["value"]))
        used[name] = int(parse_quantity(value).value)
    return used


class Search:
    def __init__(self, claim: Mapping[str, Any], classes: Mapping[str, Any],
                 devices: Sequence[Published], budget: int = BUDGET,
                 in_use: Mapping[str, Mapping[str, int]] | None = None) -> None:
        self.budget = budget
        self.in_use = in_use or {}
        spec = claim["devices"]
        self.requests = list(spec["requests"])
        self.constraints = list(spec.get("constraints") or [])
        # Each request's options in order: (result name, its exactly-like part).
        self.options: list[list[tuple[str, Mapping[str, Any]]]] = []
        for request in self.requests:
            exactly, first = request.get("exactly"), request.get("firstAvailable")
            options = ([(request["name"], exactly)] if exactly is not None else
                       [(f"{request['name']}/{sub['name']}", sub) for sub in first or []])
            if not options or any(
                    o.get("allocationMode", "ExactCount") not in ("ExactCount", "All")
                    or o.get("tolerations") for _, o in options):
                raise NotImplementedError(f"request {request['name']}: not emulated")
            self.options.append(options)
        self.candidates = {name: [d for d in devices
                                  if not _tainted(d) and _selected(o, classes, d)]
                           for options in self.options for name, o in options}
        for options in self.options:
            for name, o in options:
                if o.get("allocationMode") == "All" and not self.candidates[name]:
                    raise NotImplementedError(f"request {name}: All of no device")
        self.names = [r["name"] for r in self.requests]

    def _constraint_holds(self, constraint: Mapping[str, Any], chosen: Allocation) -> bool:
        names = constraint.get("requests") or self.names
        devices = [d for key, ds in chosen.items() for d in ds
                   if any(key == n or key.startswith(n + "/") for n in names)]
        if "matchAttribute" in constraint:
            values = [d.attribute(constraint["matchAttribute"]) for d in devices]
            return None not in values and len(set(map(repr, values))) <= 1
        if "distinctAttribute" in constraint:
            values = [d.attribute(constraint["distinctAttribute"]) for d in devices]
            return None not in values and len(set(map(repr, values))) == len(values)
        raise NotImplementedError(f"constraint {constraint}: not emulated")

    def _fits(self, name: str, exactly: Mapping[str, Any], device: Published,
              chosen: Allocation, used: dict[str, dict[str, int]]) -> bool:
        if device in chosen.get(name, []):
            return False  # one request's devices are different devices
        asked = (exactly.get("capacity") or {}).get("requests") or {}
        if any(cap not in (device.device.get("capacity") or {}) for cap in asked):
            return False  # a capacity the device does not have
        if exactly.get("adminAccess"):
            return True  # beside whoever holds it
        taken = device.name in self.in_use or any(
            device in ds for key, ds in chosen.items() if not self._admin(key))
        if taken and not device.device.get("allowMultipleAllocations"):
            return False
        for cap, amount in _consumed(exactly, device).items():
            total = int(parse_quantity(device.device["capacity"][cap]["value"]).value)
            if used.get(device.name, {}).get(cap, 0) + amount > total:
                return False
        return True

    def _admin(self, key: str) -> bool:
        return any(bool(o.get("adminAccess")) for options in self.options
                   for name, o in options if name == key)

    def first(self) -> Allocation | None:
        """The first allocation in the allocator's order, or None: the pod stays Pending."""
        chosen: Allocation = {}
        used: dict[str, dict[str, int]] = {n: dict(c) for n, c in self.in_use.items()}

        def place(i: int, option: int, k: int) -> bool:
            """Request ``i`` with its option ``option`` has ``k`` devices placed."""
            if i == len(self.options):
                return True
            name, exactly = self.options[i][option]
            wanted = (len(self.candidates[name]) if exactly.get("allocationMode") == "All"
                      else exactly.get("count", 1))
            if k == wanted:
                return next_request(i + 1)
            for device in self.candidates[name]:
                if not self._fits(name, exactly, device, chosen, used):
                    continue
                self.budget -= 1
                if self.budget < 0:
                    raise SearchTooLong(f"no answer within {BUDGET} placements")
                chosen.setdefault(name, []).append(device)
                consumed = _consumed(exactly, device)
                for cap, amount in consumed.items():
                    used.setdefault(device.name, {})[cap] = \
                        used.get(device.name, {}).get(cap, 0) + amount
                if all(self._constraint_holds(c, chosen) for c in self.constraints) \
                        and place(i, option, k + 1):
                    return True
                chosen[name].pop()
                if not chosen[name]:
                    del chosen[name]
                for cap, amount in consumed.items():
                    used[device.name][cap] -= amount
            return False

        def next_request(i: int) -> bool:
            if i == len(self.options):
                return True
            return any(place(i, option, 0) for option in range(len(self.options[i])))

        return {n: list(ds) for n, ds in chosen.items()} if next_request(0) else None


def allocate(claim: Mapping[str, Any], classes: Mapping[str, Any],
             devices: Sequence[Published], budget: int = BUDGET,
             in_use: Mapping[str, Mapping[str, int]] | None = None) -> Allocation | None:
    """``claim`` (a ResourceClaim's spec) on a node publishing ``devices``; ``in_use``:
    the devices other claims hold, by name, with the capacity they consume."""
    return Search(claim, classes, devices, budget, in_use).first()
