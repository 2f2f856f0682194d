"""What the real API server refuses of ResourceSlices and ResourceClaim status, for the fake.

The limits are upstream's, from kubernetes/kubernetes pkg/apis/resource/types.go and
pkg/apis/resource/validation/validation.go (1.34 to 1.36 carry the same values):

- ``ResourceSliceMaxDevices = 128``; ``ResourceSliceMaxDevicesWithTaintsOrConsumesCounters
  = 64`` when any device of the slice has taints (validateResourceSliceSpec);
- ``ResourceSliceMaxAttributesAndCapacitiesPerDevice = 32`` (attributes + capacity);
- ``DeviceTaintsMaxLength = 16`` taints per device;
- ``DriverNameMaxLength = 63`` (a DNS subdomain); ``PoolNameMaxLength = 253`` (DNS
  subdomains separated by slashes); a device name is a DNS label (63);
- a qualified attribute name: a C identifier of at most ``DeviceMaxIDLength = 32``, after an
  optional DNS subdomain of at most ``DeviceMaxDomainLength = 63`` and a slash;
- ``DeviceAttributeMaxValueLength = 64`` for a string attribute;
- a capacity (DRAConsumableCapacity) has a quantity ``value``; a ``requestPolicy`` only on
  a device with ``allowMultipleAllocations`` (validateSingleAllocatableDeviceCapacity),
  with ``validValues`` (at most ``CapacityRequestPolicyDiscreteMaxOptions = 10``,
  ascending, none above the value, holding the default) or ``validRange`` (a ``min`` at
  most the value and the default, a ``max`` between min and the value and at least the
  default, a ``step`` with min + step at most the value, default and max whole steps
  from min), never both, and a ``default`` with either (validateRequestPolicy*);
- spec.driver, spec.nodeName and spec.pool.name are immutable (ValidateResourceSliceUpdate);
- a claim's ``spec.devices.config`` (and the allocation's copy): at most
  ``DeviceConfigMaxSize = 32`` entries; each names requests of the claim (``req`` or
  ``req/sub``) at most once; ``opaque.driver`` a driver name and ``opaque.parameters`` a
  JSON object of at most ``OpaqueParametersMaxLength = 10 KiB``; in the allocation each
  has a ``source``, FromClass or FromClaim (validateDeviceConfiguration);
- a claim's status.devices entry names an allocated device (driver, pool, device, shareID)
  once; at most ``AllocatedDeviceStatusMaxConditions = 8`` conditions;
  ``NetworkDeviceDataMaxIPs = 16``, ``NetworkDeviceDataInterfaceNameMaxLength = 256``,
  ``NetworkDeviceDataHardwareAddressMaxLength = 128``;
- a claim's requests have distinct DNS label names, each with exactly one of ``exactly``
  or ``firstAvailable`` (whose subrequests are DNS labels too); ``exactly.adminAccess``
  only in a namespace labelled ``resource.kubernetes.io/admin-access: "true"`` (the
  registry's ``AuthorizedForAdmin``; subrequests carry no adminAccess in v1).
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from rdma_hca.kit.quantity import Quantity, QuantityError, format_quantity, parse_quantity

MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_TAINTS = 16
MAX_DRIVER_NAME = 63
MAX_POOL_NAME = 253
MAX_NAME = 253
MAX_ATTRIBUTE_ID = 32
MAX_ATTRIBUTE_DOMAIN = 63
MAX_STRING_VALUE = 64
MAX_CONDITIONS = 8
MAX_IPS = 16
MAX_INTERFACE_NAME = 256
MAX_HARDWARE_ADDRESS = 128
MAX_VALID_VALUES = 10
MAX_CONFIGS = 32
MAX_PARAMETERS = 10 * 1024

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ATTRIBUTE_KINDS = ("bool", "int", "string", "version")


class Invalid(Exception):
    """422 Invalid, with the field path in the message as the real server words it."""


def _subdomain(value: object, limit: int) -> bool:
    return (isinstance(value, str) and 0 < len(value) <= limit
            and DNS_SUBDOMAIN.match(value) is not None)


def check_name(name: object, where: str = "metadata.name") -> None:
    if not _subdomain(name, MAX_NAME):
        raise Invalid(f"{where}: Invalid value: {name!r}: a lowercase RFC 1123 subdomain "
                      f"of at most {MAX_NAME} characters is required")


def check_owner_references(meta: dict[str, Any]) -> None:
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for key in ("apiVersion", "kind", "name", "uid"):
            if not isinstance(ref, dict) or not ref.get(key):
                raise Invalid(f"metadata.ownerReferences[{i}].{key}: Required value")


def _check_attribute_name(name: str, where: str) -> None:
    domain, slash, ident = name.rpartition("/")
    if slash and not _subdomain(domain, MAX_ATTRIBUTE_DOMAIN):
        raise Invalid(f"{where}: Invalid value: {name!r}: the domain must be a DNS subdomain "
                      f"of at most {MAX_ATTRIBUTE_DOMAIN} characters")
    if len(ident) > MAX_ATTRIBUTE_ID or not C_IDENTIFIER.match(ident):
        raise Invalid(f"{where}: Invalid value: {name!r}: a C identifier of at most "
                      f"{MAX_ATTRIBUTE_ID} characters is required")


def _check_device(d: Any, i: int) -> None:
    where = f"spec.devices[{i}]"
    if not isinstance(d, dict):
        raise Invalid(f"{where}: Invalid value: a device object is required")
    name = d.get("name", "")
    if not isinstance(name, str) or not DNS_LABEL.match(name):
        raise Invalid(f"{where}.name: Invalid value: {name!r}: a lowercase RFC 1123 label "
                      "must consist of lower case alphanumeric characters or '-'")
    attrs = d.get("attributes") or {}
    capacity = d.get("capacity") or {}
    if len(attrs) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise Invalid(f"{where}: Invalid value: {len(attrs) + len(capacity)}: the total "
                      f"number of attributes and capacities must not exceed "
                      f"{MAX_ATTRIBUTES_AND_CAPACITIES}")
    for key, value in attrs.items():
        _check_attribute_name(key, f"{where}.attributes[{key}]")
        if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in \
                ATTRIBUTE_KINDS:
            raise Invalid(f"{where}.attributes[{key}]: Invalid value: exactly one value "
                          "must be specified")
        text = value.get("string")
        if isinstance(text, str) and len(text) > MAX_STRING_VALUE:
            raise Invalid(f"{where}.attributes[{key}].string: Too long: may not be more "
                          f"than {MAX_STRING_VALUE} bytes")
    shared = d.get("allowMultipleAllocations") is True
    for key, value in capacity.items():
        _check_attribute_name(key, f"{where}.capacity[{key}]")
        _check_capacity(value, shared, f"{where}.capacity[{key}]")
    taints = d.get("taints") or []
    if len(taints) > MAX_TAINTS:
        raise Invalid(f"{where}.taints: Too many: {len(taints)}: must have at most "
                      f"{MAX_TAINTS} items")
    for j, t in enumerate(taints):
        if t.get("effect") not in ("NoSchedule", "NoExecute", "None"):
            raise Invalid(f"{where}.taints[{j}].effect: Unsupported value: {t.get('effect')!r}")


def _quantity(value: object, where: str) -> Quantity:
    try:
        if not isinstance(value, str):
            raise QuantityError(f"{value!r} is not a quantity string")
        return parse_quantity(value)
    except QuantityError as exc:
        raise Invalid(f"{where}: Invalid value: {value!r}: quantities must match the regular "
                      f"expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' ({exc})"
                      ) from exc


def _check_capacity(cap: Any, shared: bool, where: str) -> None:
    if not isinstance(cap, dict) or "value" not in cap:
        raise Invalid(f"{where}.value: Required value")
    value = _quantity(cap["value"], f"{where}.value")
    policy = cap.get("requestPolicy")
    if policy is None:
        return
    where = f"{where}.requestPolicy"
    if not shared:
        raise Invalid(f"{where}: Forbidden: allowMultipleAllocations must be true")
    if not isinstance(policy, dict):
        raise Invalid(f"{where}: Invalid value: a request policy object is required")
    values, bounds = policy.get("validValues") or [], policy.get("validRange")
    if values and bounds is not None:
        raise Invalid(f'{where}: Forbidden: exactly one policy can be specified, cannot '
                      f'specify "validValues" and "validRange" at the same time')
    if not values and bounds is None:
        if "default" in policy:
            _quantity(policy["default"], f"{where}.default")
        return
    if policy.get("default") is None:
        raise Invalid(f"{where}.default: Required value: required when "
                      f"{'validValues' if values else 'validRange'} is defined")
    default = _quantity(policy["default"], f"{where}.default")
    if values:
        _check_valid_values(values, default, value, f"{where}.validValues")
    else:
        _check_valid_range(bounds, default, value, f"{where}.validRange")


def _check_valid_values(raw: Any, default: Quantity, value: Quantity, where: str) -> None:
    if not isinstance(raw, list):
        raise Invalid(f"{where}: Invalid value: a list of quantities is required")
    if len(raw) > MAX_VALID_VALUES:
        raise Invalid(f"{where}: Too many: {len(raw)}: must have at most {MAX_VALID_VALUES} "
                      "items")
    options = [_quantity(v, f"{where}[{i}]") for i, v in enumerate(raw)]
    for i in range(1, len(options)):
        if options[i - 1].value > options[i].value:
            raise Invalid(f"{where}[{i}]: Invalid value: {format_quantity(options[i])!r}: "
                          "values must be sorted in ascending order")
    seen: set[int] = set()
    for i, option in enumerate(options):
        if option.value > value.value:
            raise Invalid(f"{where}[{i}]: Invalid value: {format_quantity(option)!r}: option "
                          f"is larger than capacity value: {format_quantity(value)}")
        if int(option) in seen:  # upstream keys the set by Value()
            raise Invalid(f"{where}[{i}]: Duplicate value: {format_quantity(option)!r}")
        seen.add(int(option))
    if not any(o.value == default.value for o in options):
        raise Invalid(f"{where}: Invalid value: {format_quantity(default)!r}: default value "
                      "is not valid according to the requestPolicy")


def _check_valid_range(raw: Any, default: Quantity, value: Quantity, where: str) -> None:
    if not isinstance(raw, dict) or raw.get("min") is None:
        raise Invalid(f"{where}.min: Required value: required when validRange is defined")
    low = _quantity(raw["min"], f"{where}.min")
    text = format_quantity
    if low.value > value.value:
        raise Invalid(f"{where}.min: Invalid value: {text(low)!r}: min is larger than "
                      f"capacity value: {text(value)}")
    if default.value < low.value:
        raise Invalid(f"{where}.min: Invalid value: {text(default)!r}: default is less than "
                      f"min: {text(low)}")
    high = None if raw.get("max") is None else _quantity(raw["max"], f"{where}.max")
    if high is not None:
        if low.value > high.value:
            raise Invalid(f"{where}.max: Invalid value: {text(low)!r}: min is larger than "
                          f"max: {text(high)}")
        if high.value > value.value:
            raise Invalid(f"{where}.max: Invalid value: {text(high)!r}: max is larger than "
                          f"capacity value: {text(value)}")
        if default.value > high.value:
            raise Invalid(f"{where}.max: Invalid value: {text(default)!r}: default is more "
                          f"than max: {text(high)}")
    if raw.get("step") is None:
        return
    step = _quantity(raw["step"], f"{where}.step")
    if step.value <= 0:
        # Upstream divides by the step: a zero step would not get this far there.
        raise Invalid(f"{where}.step: Invalid value: {text(step)!r}: must be greater than "
                      "zero")
    if low.value + step.value > value.value:
        raise Invalid(f"{where}.step: Invalid value: {text(step)!r}: one step "
                      f"{text(Quantity(low.value + step.value, low.format))} is larger than "
                      f"capacity value: {text(value)}")
    # Whole units, as upstream's Value() compares them.
    for checked in (default, *(() if high is None else (high,))):
        if (int(checked) - int(low)) % int(step):
            raise Invalid(f"{where}.step: Invalid value: {text(checked)!r}: value is not a "
                          f"multiple of a given step ({text(step)}) from ({text(low)})")


def check_slice(obj: dict[str, Any], *, taints_allowed: bool) -> None:
    check_name(obj.get("metadata", {}).get("name"))
    check_owner_references(obj.get("metadata") or {})
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise Invalid("spec: Required value")
    if not _subdomain(spec.get("driver"), MAX_DRIVER_NAME):
        raise Invalid(f"spec.driver: Invalid value: {spec.get('driver')!r}: a DNS subdomain "
                      f"of at most {MAX_DRIVER_NAME} characters is required")
    pool = spec.get("pool") or {}
    pool_name = pool.get("name")
    if not isinstance(pool_name, str) or len(pool_name) > MAX_POOL_NAME or not all(
            DNS_SUBDOMAIN.match(p) for p in pool_name.split("/")):
        raise Invalid(f"spec.pool.name: Invalid value: {pool_name!r}")
    if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
        raise Invalid("spec.pool.generation: Invalid value: must be a non-negative integer")
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
        raise Invalid("spec.pool.resourceSliceCount: Invalid value: must be greater than zero")
    where = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
             if spec.get(k)]
    if len(where) != 1:
        raise Invalid("spec: Invalid value: exactly one of `nodeName`, `nodeSelector`, "
                      "`allNodes`, `perDeviceNodeSelection` is required")
    devices = spec.get("devices") or []
    tainted = any(isinstance(d, dict) and d.get("taints") for d in devices)
    if tainted and not taints_allowed:
        raise Invalid("spec.devices[0].taints: Forbidden: disabled by feature gate "
                      "DRADeviceTaints")
    limit = MAX_DEVICES_WITH_TAINTS if tainted else MAX_DEVICES
    if len(devices) > limit:
        raise Invalid(f"spec.devices: Too many: {len(devices)}: must have at most {limit} "
                      "items")
    seen: set[str] = set()
    for i, d in enumerate(devices):
        _check_device(d, i)
        if d["name"] in seen:
            raise Invalid(f"spec.devices[{i}].name: Duplicate value: {d['name']!r}")
        seen.add(d["name"])


def check_slice_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    for path in ("driver", "nodeName", "pool.name"):
        before, after = _get(old["spec"], path), _get(new.get("spec") or {}, path)
        if before != after:
            raise Invalid(f"spec.{path}: Invalid value: {after!r}: field is immutable")


ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"


def check_claim(obj: dict[str, Any], namespace_labels: dict[str, str]) -> None:
    """A new ResourceClaim's requests, in a namespace with ``namespace_labels``."""
    requests = ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []
    seen: set[str] = set()
    for i, r in enumerate(requests):
        where = f"spec.devices.requests[{i}]"
        name = r.get("name")
        if not isinstance(name, str) or not DNS_LABEL.match(name):
            raise Invalid(f"{where}.name: Invalid value: {name!r}: a lowercase RFC 1123 "
                          "label must consist of lower case alphanumeric characters or '-'")
        if name in seen:
            raise Invalid(f"{where}.name: Duplicate value: {name!r}")
        seen.add(name)
        exactly, first = r.get("exactly"), r.get("firstAvailable")
        if (exactly is None) == (first is None):
            raise Invalid(f"{where}: Invalid value: exactly one of `exactly` or "
                          "`firstAvailable` is required")
        for j, sub in enumerate(first or []):
            if not DNS_LABEL.match(str(sub.get("name") or "")):
                raise Invalid(f"{where}.firstAvailable[{j}].name: Invalid value: "
                              f"{sub.get('name')!r}: a lowercase RFC 1123 label must "
                              "consist of lower case alphanumeric characters or '-'")
        if (exactly or {}).get("adminAccess") and \
                namespace_labels.get(ADMIN_NAMESPACE_LABEL) != "true":
            raise Invalid(f"{where}.exactly.adminAccess: Forbidden: admin access to devices "
                          f"requires the `{ADMIN_NAMESPACE_LABEL}: true` label on the "
                          "containing namespace")


def _get(obj: dict[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def check_claim_config(claim: dict[str, Any]) -> None:
    """A claim's config entries and the allocation's copy of them."""
    devices = _get(claim, "spec.devices") or {}
    names: set[str] = set()
    for r in devices.get("requests") or []:
        names.add(str(r.get("name")))
        names.update(f"{r.get('name')}/{s.get('name')}" for s in r.get("firstAvailable") or [])
    for where, entries, allocated in (
            ("spec.devices.config", devices.get("config"), False),
            ("status.allocation.devices.config",
             _get(claim, "status.allocation.devices.config"), True)):
        _check_configs(where, entries or [], names, allocated)


def _check_configs(where: str, entries: list[Any], names: set[str], allocated: bool) -> None:
    if len(entries) > MAX_CONFIGS:
        raise Invalid(f"{where}: Too many: {len(entries)}: must have at most {MAX_CONFIGS} "
                      "items")
    for i, c in enumerate(entries):
        at = f"{where}[{i}]"
        if allocated and c.get("source") not in ("FromClass", "FromClaim"):
            raise Invalid(f'{at}.source: Unsupported value: {c.get("source")!r}: supported '
                          'values: "FromClass", "FromClaim"')
        requests = c.get("requests") or []
        for j, r in enumerate(requests):
            if r not in names:
                raise Invalid(f"{at}.requests[{j}]: Invalid value: {r!r}: must be the name of "
                              "a request in the claim or the name of a request and a "
                              "subrequest in the format <request>/<subrequest>")
            if r in requests[:j]:
                raise Invalid(f"{at}.requests[{j}]: Duplicate value: {r!r}")
        opaque = c.get("opaque")
        if not isinstance(opaque, dict):
            raise Invalid(f"{at}.opaque: Required value")
        if not _subdomain(opaque.get("driver"), MAX_DRIVER_NAME):
            raise Invalid(f"{at}.opaque.driver: Invalid value: {opaque.get('driver')!r}: a "
                          "lowercase RFC 1123 subdomain is required")
        parameters = opaque.get("parameters")
        if not isinstance(parameters, dict):
            raise Invalid(f"{at}.opaque.parameters: Invalid value: must be a valid JSON "
                          "object")
        if len(json.dumps(parameters, separators=(",", ":"))) > MAX_PARAMETERS:
            raise Invalid(f"{at}.opaque.parameters: Too long: may not be more than "
                          f"{MAX_PARAMETERS} bytes")


def check_claim_status(claim: dict[str, Any], status: dict[str, Any]) -> None:
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}) \
        .get("results") or []
    allocated = {(r.get("driver"), r.get("pool"), r.get("device"), r.get("shareID"))
                 for r in results}
    seen: set[tuple[Any, ...]] = set()
    for i, d in enumerate(status.get("devices") or []):
        where = f"status.devices[{i}]"
        key = (d.get("driver"), d.get("pool"), d.get("device"), d.get("shareID"))
        if key not in allocated:
            raise Invalid(f"{where}: Invalid value: {key!r}: must be an allocated device "
                          "in the claim")
        if key in seen:
            raise Invalid(f"{where}: Duplicate value: {key!r}")
        seen.add(key)
        if len(d.get("conditions") or []) > MAX_CONDITIONS:
            raise Invalid(f"{where}.conditions: Too many: must have at most {MAX_CONDITIONS}")
        net = d.get("networkData") or {}
        if len(net.get("interfaceName") or "") > MAX_INTERFACE_NAME:
            raise Invalid(f"{where}.networkData.interfaceName: Too long")
        if len(net.get("hardwareAddress") or "") > MAX_HARDWARE_ADDRESS:
            raise Invalid(f"{where}.networkData.hardwareAddress: Too long")
        ips = net.get("ips") or []
        if len(ips) > MAX_IPS:
            raise Invalid(f"{where}.networkData.ips: Too many: must have at most {MAX_IPS}")
        for j, ip in enumerate(ips):
            try:
                ipaddress.ip_interface(ip)
            except ValueError as exc:
                raise Invalid(f"{where}.networkData.ips[{j}]: Invalid value: {ip!r}: must "
                              "be a valid address in CIDR form") from exc
            if "/" not in str(ip):
                raise Invalid(f"{where}.networkData.ips[{j}]: Invalid value: {ip!r}: must "
                              "be a valid address in CIDR form")
