"""From the Mellanox k8s-rdma-shared-dev-plugin's config to rdma-hca's.

That plugin reads a JSON file (``config.json`` in its ConfigMap): ``periodicUpdateInterval``
and a ``configList`` of resources, each with ``resourceName``, ``resourcePrefix`` (default
``rdma``), ``rdmaHcaMax``, and either ``devices`` (netdev names) or ``selectors``
(``vendors``, ``deviceIDs``, ``drivers``, ``ifNames``, ``linkTypes``: every list given must
match, any entry within one). Each resource is advertised as ``<resourcePrefix>/<resourceName>``
with ``rdmaHcaMax`` slots, every pod getting every selected HCA: one shared pool here.

Anything this cannot carry over exactly (an unknown key, a link type other than ``ether`` or
``infiniband``, a value the plugin itself refuses) is refused, naming it: a migration must not
change which HCAs a resource holds without saying so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from rdma_hca.kit.names import resource_name_problem
from rdma_hca.settings.decl import BY_KEY
from rdma_hca.settings.file import parse_config_text, read_config_file
from rdma_hca.settings.model import ConfigError

TOP_KEYS = ("periodicUpdateInterval", "configList")
ENTRY_KEYS = ("resourceName", "resourcePrefix", "rdmaHcaMax", "devices", "selectors")
# Their selector -> ours. ifNames (and devices) name netdevs, compared exactly there; our
# netdevs compare as globs, and a netdev name holds no glob character.
SELECTORS = {
    "vendors": "pciVendors",
    "deviceIDs": "pciDevices",
    "drivers": "drivers",
    "ifNames": "netdevs",
    "linkTypes": "linkLayers",
}
# The netdev's link type as netlink names it (what linkTypes compares) -> our link layer.
LINK_TYPES = {"ether": "Ethernet", "infiniband": "InfiniBand"}
DEFAULT_PREFIX = "rdma"
# The plugin's own rule for resourceName.
_NAME = re.compile(r"[A-Za-z0-9_]+")
_GLOB = re.compile(r"[*?\[]")
_HEX4 = re.compile(r"[0-9a-f]{4}")
CONFIG_MAP_KEY = "config.json"


@dataclass(frozen=True, slots=True)
class Converted:
    """rdma-hca pools (as config-file mappings) and what the reader should know."""

    pools: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]


class _Where:
    def __init__(self, path: str) -> None:
        self.source = f"k8s-rdma-shared-dev-plugin config {path}"

    def error(self, field: str, value: object, why: str) -> ConfigError:
        return ConfigError(field, value, why, self.source)


def read(path: str) -> dict[str, Any]:
    """The plugin's config from its JSON file, from a ConfigMap manifest holding it, or from
    the NVIDIA Network Operator's NicClusterPolicy that deploys the plugin."""
    data = read_config_file(path, "FILE")
    where = _Where(path)
    if data.get("kind") == "ConfigMap":
        inner = (data.get("data") or {}).get(CONFIG_MAP_KEY)
        if not isinstance(inner, str):
            raise where.error("data", data.get("data"), f"a ConfigMap of the plugin holds "
                              f"its config as data.{CONFIG_MAP_KEY}")
        return parse_config_text(path, inner)
    if data.get("kind") == "NicClusterPolicy":
        spec = data.get("spec") or {}
        plugin = spec.get("rdmaSharedDevicePlugin") if isinstance(spec, dict) else None
        inner = plugin.get("config") if isinstance(plugin, dict) else None
        if not isinstance(inner, str):
            raise where.error("spec.rdmaSharedDevicePlugin.config", inner, "the plugin's "
                              "config, as the NicClusterPolicy gives it (a JSON string)")
        return parse_config_text(path, inner)
    return data


def convert(data: Mapping[Any, Any], path: str) -> Converted:
    where = _Where(path)
    for key in data:
        if key not in TOP_KEYS:
            raise where.error(str(key), data[key], _unknown(TOP_KEYS))
    notes: list[str] = []
    interval = data.get("periodicUpdateInterval")
    if interval is not None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
            raise where.error("periodicUpdateInterval", interval,
                              "a number of seconds, 0 or more (as the plugin takes it)")
        notes.append(f"periodicUpdateInterval ({interval} s) has no equivalent: rdma-hca "
                     "watches the node all the time (netlink events, and port state every "
                     "healthPollSeconds)")
    entries = data.get("configList")
    if not isinstance(entries, list) or not entries:
        raise where.error("configList", entries, "a non-empty list of resources (the plugin "
                          "refuses a config without one too)")
    pools = tuple(_pool(entry, f"configList[{i}]", where) for i, entry in enumerate(entries))
    names = [p["resourceName"] for p in pools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise where.error(f"configList[{i}].resourceName", name,
                              "each resource needs a different name (the plugin refuses this "
                              "too)")
    return Converted(pools, tuple(notes))


def _unknown(allowed: Sequence[str]) -> str:
    return ("unknown or unsupported key of the k8s-rdma-shared-dev-plugin config; known: "
            + ", ".join(allowed))


def _strings(value: object, field: str, where: _Where) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise where.error(field, value, "a list of non-empty strings")
    return list(value)


def _pool(entry: object, field: str, where: _Where) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise where.error(field, entry, "a mapping with resourceName, rdmaHcaMax and "
                                        "selectors (or devices)")
    for key in entry:
        if key not in ENTRY_KEYS:
            raise where.error(f"{field}.{key}", entry[key], _unknown(ENTRY_KEYS))
    name = entry.get("resourceName")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise where.error(f"{field}.resourceName", name, "letters, digits and '_' (the "
                          "plugin's rule), e.g. hca_shared_devices_a")
    prefix = entry.get("resourcePrefix", DEFAULT_PREFIX)
    if prefix == "":
        prefix = DEFAULT_PREFIX  # the plugin takes an empty prefix as its default
    if not isinstance(prefix, str):
        raise where.error(f"{field}.resourcePrefix", prefix, "a string, e.g. rdma")
    resource = f"{prefix}/{name}"
    why = resource_name_problem(resource)
    if why:
        raise where.error(f"{field}.resourcePrefix", prefix,
                          f"{resource} is not an extended resource name: {why}")
    slots = entry.get("rdmaHcaMax")
    spec = BY_KEY["rdmaHcaMax"]
    lo, hi = int(spec.minimum or 1), int(spec.maximum or 1)
    if isinstance(slots, bool) or not isinstance(slots, int) or not lo <= slots <= hi:
        raise where.error(f"{field}.rdmaHcaMax", slots,
                          f"an integer from {lo} to {hi} (0 would advertise no device)")
    return {"resourceName": resource, "rdmaHcaMax": slots, "mode": "shared",
            "selectors": _selectors(entry, field, where)}


def _selectors(entry: Mapping[str, Any], field: str, where: _Where) -> dict[str, list[str]]:
    raw = entry.get("selectors")
    if raw is not None and not isinstance(raw, dict):
        raise where.error(f"{field}.selectors", raw, "a mapping of " + ", ".join(SELECTORS)
                          + " to lists")
    given = {k: v for k, v in (raw or {}).items() if v not in (None, [])}
    devices = entry.get("devices")
    if devices not in (None, []):
        if given:
            raise where.error(f"{field}.devices", devices, "either devices or selectors, not "
                              "both (the plugin refuses both too)")
        given = {"ifNames": devices}
        field_of = {"ifNames": f"{field}.devices"}
    else:
        field_of = {k: f"{field}.selectors.{k}" for k in given}
    if not given:
        raise where.error(f"{field}.selectors", raw, "selectors or devices must name the HCAs "
                          "(the plugin refuses a resource without either)")
    out: dict[str, list[str]] = {}
    for key, value in given.items():
        if key not in SELECTORS:
            raise where.error(f"{field}.selectors.{key}", value, _unknown(tuple(SELECTORS)))
        items = _strings(value, field_of[key], where)
        if key == "linkTypes":
            bad = [t for t in items if t not in LINK_TYPES]
            if bad:
                raise where.error(field_of[key], bad[0], "ether or infiniband: an RDMA "
                                  "netdev has no other link type rdma-hca can select by")
            items = list(dict.fromkeys(LINK_TYPES[t] for t in items))
        elif key in ("vendors", "deviceIDs"):
            # The plugin compares the PCI id as sysfs shows it without 0x; the chart and
            # the docs write it 0x-prefixed.
            bad = [v for v in items if not _HEX4.fullmatch(v)]
            if bad:
                raise where.error(field_of[key], bad[0], "4 lower-case hex digits, as the "
                                  "plugin compares them (e.g. 15b3); it would match no device")
            items = ["0x" + v for v in items]
        elif key == "ifNames":
            globbed = [n for n in items if _GLOB.search(n)]
            if globbed:
                raise where.error(field_of[key], globbed[0], "a netdev name (the plugin "
                                  "compares names exactly; *, ? and [ would be patterns here)")
        out[SELECTORS[key]] = items
    return out


def config_yaml(converted: Converted, path: str) -> str:
    """rdma-hca's config file: one pool at the top level, several under ``pools``."""
    doc: dict[str, Any] = {"nonHostNetwork": True}
    if len(converted.pools) == 1:
        doc.update(converted.pools[0])
    else:
        doc["pools"] = list(converted.pools)
    return _header(converted, path, values=False) + _dump(doc)


def values_yaml(converted: Converted, path: str) -> str:
    """Helm values of the ack-rdma-device-plugin chart: one resource at the top level,
    several as the chart's ``pools``."""
    doc: dict[str, Any] = {"nonHostNetwork": {"enabled": True}}
    if len(converted.pools) == 1:
        doc.update(converted.pools[0])
    else:
        doc["pools"] = list(converted.pools)
    return _header(converted, path, values=True) + _dump(doc)


def _header(converted: Converted, path: str, *, values: bool) -> str:
    what = "Helm values of the ack-rdma-device-plugin chart" if values else \
        "rdma-hca config"
    lines = [
        f"{what}, converted from the k8s-rdma-shared-dev-plugin config {path}",
        "by `rdma-hca config from-msdp`. Each resource keeps the name the plugin advertised",
        "and its slots; every pod gets every HCA the selectors match (shared mode).",
        "nonHostNetwork is on: the plugin serves pods whatever their network. Turn it off",
        "if only hostNetwork pods use RDMA (the admission policy then refuses the others).",
        *converted.notes,
    ]
    return "".join(f"# {line}\n" for line in lines)


def _dump(doc: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=None,
                          allow_unicode=True)
