"""The parameters a claim passes to this driver (``HcaConfig``): format, checks, merging.

A ResourceClaim (``spec.devices.config[]``) or a DeviceClass (``spec.config[]``) may carry
``opaque: {driver: <this driver>, parameters: {...}}``; the scheduler copies the entries
into the allocation (``status.allocation.devices.config[]``, the class's first). The
parameters are::

    apiVersion: rdma-hca.io/v1
    kind: HcaConfig
    gidIndex: 3            # the GID to use, by index ...
    gidFamily: ipv4        # ... or by family (the port's RoCE v2 GID of it): one or neither
    trafficClass: 106      # NCCL_IB_TC, UCX_IB_TRAFFIC_CLASS (0-255)
    serviceLevel: 0        # InfiniBand SL: NCCL_IB_SL, UCX_IB_SL (0-15)
    managementDevices: true   # the HCA's umad and issm device nodes, or none of them

The daemon (at Prepare), ``rdma-hca doctor --cluster`` and the chart's admission policy
check them with the same words: each problem is one line naming the field and what is
accepted. Entries apply in order, later wins field by field (the GID, by index or family,
is one choice); an entry naming no request applies to every request, one naming ``hca``
to ``hca`` and its subrequests (``hca/any``), one naming ``hca/any`` only to that one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any

API_VERSION = "rdma-hca.io/v1"
KIND = "HcaConfig"
SECTION = "Parameters a claim passes (HcaConfig)"  # the section of docs/dra.md

GID_INDEX = "gidIndex"
GID_FAMILY = "gidFamily"
TRAFFIC_CLASS = "trafficClass"
SERVICE_LEVEL = "serviceLevel"
MANAGEMENT_DEVICES = "managementDevices"

# Each field and what it accepts, in the order the checks run (and the policy's CEL too).
ACCEPTED: dict[str, str] = {
    "apiVersion": API_VERSION,
    "kind": KIND,
    GID_INDEX: "an integer 0-255",
    GID_FAMILY: "ipv4 or ipv6",
    TRAFFIC_CLASS: "an integer 0-255",
    SERVICE_LEVEL: "an integer 0-15",
    MANAGEMENT_DEVICES: "true or false",
}
SETTINGS = (GID_INDEX, GID_FAMILY, TRAFFIC_CLASS, SERVICE_LEVEL, MANAGEMENT_DEVICES)
RANGES: dict[str, tuple[int, int]] = {GID_INDEX: (0, 255), TRAFFIC_CLASS: (0, 255),
                                      SERVICE_LEVEL: (0, 15)}

FIX = ("correct the HcaConfig parameters this driver was given (the claim's or its "
       "template's spec.devices.config[].opaque.parameters, or the DeviceClass's "
       f"spec.config[]) as the message says (docs/dra.md, \"{SECTION}\"), then create the "
       "claim again: a claim's parameters cannot be changed")


class GidFamily(StrEnum):
    IPV4 = "ipv4"
    IPV6 = "ipv6"


class HcaConfigError(ValueError):
    """Parameters this driver cannot take; the message is one line naming the field."""

    fix = FIX


@dataclass(frozen=True, slots=True)
class HcaConfig:
    """What a claim asked for; None: not asked (the driver's default)."""

    gid_index: int | None = None
    gid_family: GidFamily | None = None
    traffic_class: int | None = None
    service_level: int | None = None
    management_devices: bool | None = None

    def over(self, earlier: HcaConfig) -> HcaConfig:
        """This entry applied after ``earlier``: what this one sets wins."""
        merged = earlier
        if self.gid_index is not None or self.gid_family is not None:
            merged = replace(merged, gid_index=self.gid_index, gid_family=self.gid_family)
        for name in ("traffic_class", "service_level", "management_devices"):
            if getattr(self, name) is not None:
                merged = replace(merged, **{name: getattr(self, name)})
        return merged

    @property
    def empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def as_fields(self) -> dict[str, Any]:
        """The settings asked for, camelCase (as written, without apiVersion and kind)."""
        out: dict[str, Any] = {}
        for key, value in zip(SETTINGS, (self.gid_index, self.gid_family, self.traffic_class,
                                         self.service_level, self.management_devices),
                              strict=True):
            if value is not None:
                out[key] = str(value) if isinstance(value, GidFamily) else value
        return out


def shown(value: object) -> str:
    """A value as the messages show it (the policy's CEL shows it the same way)."""
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return "null"


def not_accepted(key: str, value: object) -> str:
    return f'{KIND} field "{key}": {shown(value)} is not accepted: {ACCEPTED[key]}'


def _integer(key: str, value: object) -> int:
    low, high = RANGES[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise HcaConfigError(not_accepted(key, value))
    return value


def check_fields(parameters: Mapping[str, Any]) -> HcaConfig:
    """The settings of ``parameters`` (apiVersion and kind not looked at)."""
    for key in parameters:
        if key not in ACCEPTED:
            raise HcaConfigError(f'{KIND} field "{key}" is not known: the fields are '
                                 f"{', '.join(ACCEPTED)}")
    out = HcaConfig()
    if GID_INDEX in parameters:
        out = replace(out, gid_index=_integer(GID_INDEX, parameters[GID_INDEX]))
    if GID_FAMILY in parameters:
        family = parameters[GID_FAMILY]
        if not isinstance(family, str) or family not in tuple(GidFamily):
            raise HcaConfigError(not_accepted(GID_FAMILY, family))
        out = replace(out, gid_family=GidFamily(family))
    if GID_INDEX in parameters and GID_FAMILY in parameters:
        raise HcaConfigError(f'{KIND} fields "{GID_INDEX}" and "{GID_FAMILY}" are both set: '
                             "one of them, or neither")
    if TRAFFIC_CLASS in parameters:
        out = replace(out, traffic_class=_integer(TRAFFIC_CLASS, parameters[TRAFFIC_CLASS]))
    if SERVICE_LEVEL in parameters:
        out = replace(out, service_level=_integer(SERVICE_LEVEL, parameters[SERVICE_LEVEL]))
    if MANAGEMENT_DEVICES in parameters:
        value = parameters[MANAGEMENT_DEVICES]
        if not isinstance(value, bool):
            raise HcaConfigError(not_accepted(MANAGEMENT_DEVICES, value))
        out = replace(out, management_devices=value)
    return out


def parse(parameters: object) -> HcaConfig:
    """``opaque.parameters`` of an entry for this driver, checked; HcaConfigError when it
    cannot be taken (the first problem, in the order of :data:`ACCEPTED`)."""
    if not isinstance(parameters, Mapping):
        raise HcaConfigError(f"{KIND} parameters: {shown(parameters)} is not accepted: an "
                             f"object with apiVersion {API_VERSION} and kind {KIND}")
    for key in ("apiVersion", "kind"):
        if key not in parameters:
            raise HcaConfigError(f'{KIND} field "{key}" is missing: {ACCEPTED[key]}')
        if parameters[key] != ACCEPTED[key]:
            raise HcaConfigError(not_accepted(key, parameters[key]))
    return check_fields({k: v for k, v in parameters.items()
                         if k not in ("apiVersion", "kind")})


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One opaque config entry: the requests it names (none: all), whose it is, what."""

    requests: tuple[str, ...]
    driver: str
    parameters: Any
    source: str = ""  # FromClass or FromClaim, in an allocation


def read_entries(value: object) -> tuple[ConfigEntry, ...]:
    """A ``config[]`` list as the API holds it (claim, template, class or allocation);
    entries without ``opaque`` (other kinds of config) are skipped."""
    out = []
    for c in value if isinstance(value, list) else []:
        opaque = c.get("opaque") if isinstance(c, Mapping) else None
        if not isinstance(opaque, Mapping):
            continue
        requests = c.get("requests")
        out.append(ConfigEntry(
            tuple(str(r) for r in requests) if isinstance(requests, list) else (),
            str(opaque.get("driver") or ""), opaque.get("parameters"),
            str(c.get("source") or "")))
    return tuple(out)


def applies(entry: ConfigEntry, request: str) -> bool:
    """Whether ``entry`` applies to ``request`` (``hca`` or ``hca/any``)."""
    if not entry.requests:
        return True
    parent = request.partition("/")[0]
    return request in entry.requests or parent in entry.requests


def problems(entries: Iterable[ConfigEntry], driver: str) -> list[str]:
    """The problem of each of ``driver``'s entries that cannot be taken."""
    out = []
    for e in entries:
        if e.driver != driver:
            continue
        try:
            parse(e.parameters)
        except HcaConfigError as exc:
            out.append(str(exc))
    return out


_ORDER = {"FromClass": 0, "FromClaim": 1}


def merged(entries: Sequence[ConfigEntry], driver: str, request: str) -> HcaConfig:
    """What ``request`` was asked for: ``driver``'s entries that apply to it, the class's
    before the claim's, later wins field by field. HcaConfigError on the first entry of
    ``driver`` that cannot be taken (whatever it names: the claim is wrong either way)."""
    out = HcaConfig()
    ours = sorted((e for e in entries if e.driver == driver),
                  key=lambda e: _ORDER.get(e.source, 1))
    for e in ours:
        parsed = parse(e.parameters)
        if applies(e, request):
            out = parsed.over(out)
    return out
