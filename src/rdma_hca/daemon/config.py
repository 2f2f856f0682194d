"""One typed settings object from the config file, ``RDMA_HCA_*`` variables and flags.

Layers are merged as raw values first (file, then environment, then flags) and only
then validated, so that an error can always say which field was wrong, what value it
had, where that value came from and what is allowed. The daemon turns a
:class:`ConfigError` into exit status 2 before it registers anything.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rdma_hca.node.model import Hca

DEFAULT_RESOURCE_NAME = "rdma/hca"
DEFAULT_RDMA_HCA_MAX = 1000
DEFAULT_METRICS_ADDRESS = ":9478"
DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"
ENV_PREFIX = "RDMA_HCA_"

_E = TypeVar("_E", bound=StrEnum)


class ConfigError(ValueError):
    """A setting that cannot be used; the message names field, value and what is allowed."""

    def __init__(self, field_name: str, value: object, allowed: str, source: str = "") -> None:
        where = f" (from {source})" if source else ""
        super().__init__(f"{field_name}: {value!r}{where} is not valid: {allowed}")
        self.field_name = field_name
        self.value = value
        self.allowed = allowed
        self.source = source


class Mode(StrEnum):
    SHARED = "shared"
    EXCLUSIVE = "exclusive"


class UnhealthyWhen(StrEnum):
    ANY = "any"
    ALL = "all"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


@dataclass(frozen=True, slots=True)
class Selectors:
    """Which HCAs a pool holds; every non-empty list must match, any entry within it."""

    names: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    link_layers: tuple[str, ...] = ()
    netdevs: tuple[str, ...] = ()
    pci_vendors: tuple[str, ...] = ()
    pci_devices: tuple[str, ...] = ()

    def matches(self, hca: Hca) -> bool:
        if self.names and not _any_glob(self.names, [hca.name]):
            return False
        if self.drivers and not _any_glob(self.drivers, [hca.driver or ""]):
            return False
        if self.link_layers and not any(
            p.link_layer.value.lower() in {x.lower() for x in self.link_layers} for p in hca.ports
        ):
            return False
        if self.netdevs and not _any_glob(self.netdevs, hca.netdevs):
            return False
        if self.pci_vendors and _norm_hex(hca.pci_vendor) not in {
            _norm_hex(v) for v in self.pci_vendors
        }:
            return False
        return not (
            self.pci_devices
            and _norm_hex(hca.pci_device) not in {_norm_hex(v) for v in self.pci_devices}
        )


def _any_glob(patterns: Sequence[str], values: Sequence[str]) -> bool:
    # fnmatchcase, never substring: "mlx5_1" must not select "mlx5_10".
    return any(fnmatch.fnmatchcase(v, p) for p in patterns for v in values)


def _norm_hex(value: str | None) -> str:
    if not value:
        return ""
    v = value.strip().lower()
    return v[2:] if v.startswith("0x") else v


@dataclass(frozen=True, slots=True)
class PoolConfig:
    resource_name: str = DEFAULT_RESOURCE_NAME
    rdma_hca_max: int = DEFAULT_RDMA_HCA_MAX
    mode: Mode = Mode.SHARED
    unhealthy_when: UnhealthyWhen = UnhealthyWhen.ANY
    selectors: Selectors = field(default_factory=Selectors)


@dataclass(frozen=True, slots=True)
class CdiConfig:
    enabled: bool = False
    spec_dir: str = "/var/run/cdi"


@dataclass(frozen=True, slots=True)
class Settings:
    pools: tuple[PoolConfig, ...] = (PoolConfig(),)
    non_host_network: bool = False
    nccl_env: bool = False
    health_poll_seconds: float = 0.5
    resend_seconds: float = 30.0
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    log_format: LogFormat = LogFormat.TEXT
    log_level: str = "info"
    cdi: CdiConfig = field(default_factory=CdiConfig)
    sysfs_root: str = "/sys"
    dev_root: str = "/dev"
    kubelet_dir: str = DEFAULT_KUBELET_DIR
    config_file: str | None = None


# --- raw layers -------------------------------------------------------------------------

# Scalar settings that may come from any layer: YAML key -> (env suffix, flag dest).
_SCALARS: dict[str, str] = {
    "resourceName": "RESOURCE_NAME",
    "rdmaHcaMax": "RDMA_HCA_MAX",
    "mode": "MODE",
    "unhealthyWhen": "UNHEALTHY_WHEN",
    "nonHostNetwork": "NON_HOST_NETWORK",
    "ncclEnv": "NCCL_ENV",
    "healthPollSeconds": "HEALTH_POLL_SECONDS",
    "resendSeconds": "RESEND_SECONDS",
    "metricsAddress": "METRICS_ADDRESS",
    "logFormat": "LOG_FORMAT",
    "logLevel": "LOG_LEVEL",
    "cdi.enabled": "CDI_ENABLED",
    "cdi.specDir": "CDI_SPEC_DIR",
}
# Where the daemon looks on the machine: flags and environment only, never the file,
# so that one ConfigMap serves nodes whose paths differ.
_PATHS: dict[str, str] = {
    "sysfsRoot": "SYSFS_ROOT",
    "devRoot": "DEV_ROOT",
    "kubeletDir": "KUBELET_DIR",
}
_TOP_KEYS = {
    "resourceName", "rdmaHcaMax", "mode", "unhealthyWhen", "selectors", "nonHostNetwork",
    "ncclEnv", "healthPollSeconds", "resendSeconds", "metricsAddress", "logFormat", "logLevel",
    "cdi", "pools",
}
_POOL_KEYS = {"resourceName", "rdmaHcaMax", "mode", "unhealthyWhen", "selectors"}
_SELECTOR_KEYS = {
    "names": "names",
    "drivers": "drivers",
    "linkLayers": "link_layers",
    "netdevs": "netdevs",
    "pciVendors": "pci_vendors",
    "pciDevices": "pci_devices",
}
_CDI_KEYS = {"enabled", "specDir"}


@dataclass(slots=True)
class _Value:
    value: Any
    source: str


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Parse the YAML file; an unreadable or malformed file is a ConfigError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            "--config", str(path), f"the file cannot be read ({exc.strerror or exc})"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            "--config", str(path), f"it is not valid YAML{where}: fix the syntax"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            "--config", str(path), "the file must hold a YAML mapping (key: value lines)"
        )
    return data


def load_settings(
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> Settings:
    """Merge file, environment and flags (in that order of precedence, lowest first).

    ``flags`` maps YAML-style keys (``resourceName``, ``sysfsRoot``, ``cdi.enabled`` ...)
    to values; ``None`` means "not given".
    """
    env = dict(env or {})
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    if config_file is None and env.get(ENV_PREFIX + "CONFIG"):
        config_file = env[ENV_PREFIX + "CONFIG"]
    file_data: dict[str, Any] = read_config_file(config_file) if config_file else {}
    file_src = f"config file {config_file}"

    unknown = sorted(set(file_data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(
            unknown[0], file_data[unknown[0]],
            f"unknown key; allowed keys are {', '.join(sorted(_TOP_KEYS))}", file_src,
        )

    merged: dict[str, _Value] = {}
    for key, value in file_data.items():
        if key == "cdi":
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError("cdi", value, "a mapping with enabled and specDir", file_src)
            for sub, subval in value.items():
                if sub not in _CDI_KEYS:
                    raise ConfigError(f"cdi.{sub}", subval,
                                      "unknown key; allowed: enabled, specDir", file_src)
                merged[f"cdi.{sub}"] = _Value(subval, file_src)
        else:
            merged[key] = _Value(value, file_src)
    for key, suffix in {**_SCALARS, **_PATHS}.items():
        name = ENV_PREFIX + suffix
        if name in env:
            merged[key] = _Value(env[name], f"environment variable {name}")
    for key, value in flags.items():
        if key not in _SCALARS and key not in _PATHS:
            raise ConfigError(key, value, "not a known setting")
        merged[key] = _Value(value, f"flag --{_flag_name(key)}")
    return _build(merged, config_file)


def _flag_name(key: str) -> str:
    key = {"cdi.enabled": "cdi", "cdi.specDir": "cdiSpecDir"}.get(key, key)
    return re.sub(r"([A-Z])", lambda m: "-" + m.group(1).lower(), key)


# --- validation -------------------------------------------------------------------------

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def validate_resource_name(name: str) -> str | None:
    """Why ``name`` is not a valid extended resource name, or None when it is."""
    if name.count("/") != 1:
        return "it must be <domain>/<name>, e.g. rdma/hca"
    domain, short = name.split("/")
    if not domain or len(domain) > 253 or not _DNS_SUBDOMAIN.match(domain):
        return "the part before '/' must be a DNS subdomain (lower case letters, digits, '-', '.')"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return "the kubernetes.io domain is reserved for Kubernetes itself"
    if domain.startswith("requests."):
        return "a name starting with 'requests.' is reserved for quotas"
    if not short or len(short) > 63 or not _QUALIFIED_NAME.match(short):
        return (
            "the part after '/' must be 1-63 characters of letters, digits, '-', '_', '.',"
            " starting and ending with a letter or digit"
        )
    return None


def _str(v: _Value, key: str) -> str:
    if isinstance(v.value, bool) or not isinstance(v.value, str | int | float):
        raise ConfigError(key, v.value, "a string", v.source)
    return str(v.value)


def _bool(v: _Value, key: str) -> bool:
    if isinstance(v.value, bool):
        return v.value
    if isinstance(v.value, str):
        low = v.value.strip().lower()
        if low in {"true", "1", "yes", "on"}:
            return True
        if low in {"false", "0", "no", "off", ""}:
            return False
    raise ConfigError(key, v.value, "true or false", v.source)


def _int(v: _Value, key: str, lo: int, hi: int) -> int:
    raw = v.value
    if isinstance(raw, bool):
        raise ConfigError(key, raw, f"an integer from {lo} to {hi}", v.source)
    try:
        num = int(raw.strip()) if isinstance(raw, str) else raw
    except ValueError:
        num = None
    if not isinstance(num, int) or not lo <= num <= hi:
        raise ConfigError(key, raw, f"an integer from {lo} to {hi}", v.source)
    return num


def _float(v: _Value, key: str, lo: float, hi: float, zero_ok: bool = False) -> float:
    raw = v.value
    allowed = f"a number of seconds from {lo:g} to {hi:g}" + (" (or 0 to turn it off)" if zero_ok
                                                             else "")
    if isinstance(raw, bool):
        raise ConfigError(key, raw, allowed, v.source)
    try:
        num = float(raw.strip()) if isinstance(raw, str) else float(raw)
    except (TypeError, ValueError):
        raise ConfigError(key, raw, allowed, v.source) from None
    if math.isnan(num) or not ((zero_ok and num == 0) or lo <= num <= hi):
        raise ConfigError(key, raw, allowed, v.source)
    return num


def _enum(v: _Value, key: str, enum: type[_E]) -> _E:
    raw = v.value
    allowed = " or ".join(e.value for e in enum)
    if isinstance(raw, str):
        for e in enum:
            if raw.strip().lower() == e.value:
                return e
    raise ConfigError(key, raw, allowed, v.source)


def _metrics_address(v: _Value, key: str) -> str:
    raw = _str(v, key).strip()
    if raw == "":
        return ""
    host, sep, port = raw.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(key, raw, "HOST:PORT or :PORT with a port from 1 to 65535, or empty "
                          "to turn the HTTP endpoints off", v.source)
    if host.startswith("[") != host.endswith("]"):
        raise ConfigError(key, raw, "an IPv6 host must be written in brackets, e.g. [::1]:9478",
                          v.source)
    return raw


def _selectors(v: _Value, key: str) -> Selectors:
    raw = v.value
    if raw is None:
        return Selectors()
    if not isinstance(raw, dict):
        raise ConfigError(key, raw, "a mapping of " + ", ".join(_SELECTOR_KEYS) + " to lists",
                          v.source)
    out: dict[str, tuple[str, ...]] = {}
    for sub, items in raw.items():
        if sub not in _SELECTOR_KEYS:
            raise ConfigError(f"{key}.{sub}", items,
                              "unknown selector; allowed: " + ", ".join(_SELECTOR_KEYS), v.source)
        if isinstance(items, str):
            items = [items]
        if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
            raise ConfigError(f"{key}.{sub}", items, "a list of non-empty strings", v.source)
        if sub == "linkLayers":
            for i in items:
                if i.lower() not in {"ethernet", "infiniband"}:
                    raise ConfigError(f"{key}.{sub}", i, "Ethernet or InfiniBand", v.source)
        out[_SELECTOR_KEYS[sub]] = tuple(items)
    return Selectors(**out)


def _pool(values: Mapping[str, _Value], prefix: str) -> PoolConfig:
    kw: dict[str, Any] = {}
    if "resourceName" in values:
        name = _str(values["resourceName"], prefix + "resourceName").strip()
        why = validate_resource_name(name)
        if why:
            raise ConfigError(prefix + "resourceName", name, why, values["resourceName"].source)
        kw["resource_name"] = name
    if "rdmaHcaMax" in values:
        kw["rdma_hca_max"] = _int(values["rdmaHcaMax"], prefix + "rdmaHcaMax", 1, 100000)
    if "mode" in values:
        kw["mode"] = _enum(values["mode"], prefix + "mode", Mode)
    if "unhealthyWhen" in values:
        kw["unhealthy_when"] = _enum(values["unhealthyWhen"], prefix + "unhealthyWhen",
                                     UnhealthyWhen)
    if "selectors" in values:
        kw["selectors"] = _selectors(values["selectors"], prefix + "selectors")
    return PoolConfig(**kw)


def _pools(merged: Mapping[str, _Value]) -> tuple[PoolConfig, ...]:
    top = {k: merged[k] for k in _POOL_KEYS if k in merged}
    if "pools" not in merged or merged["pools"].value is None:
        return (_pool(top, ""),)
    raw = merged["pools"]
    if not isinstance(raw.value, list) or not raw.value:
        raise ConfigError("pools", raw.value, "a non-empty list of pools", raw.source)
    pools: list[PoolConfig] = []
    for i, entry in enumerate(raw.value):
        prefix = f"pools[{i}]."
        if not isinstance(entry, dict):
            raise ConfigError(f"pools[{i}]", entry, "a mapping with resourceName and more",
                              raw.source)
        for k in entry:
            if k not in _POOL_KEYS:
                raise ConfigError(prefix + str(k), entry[k],
                                  "unknown key; allowed: " + ", ".join(sorted(_POOL_KEYS)),
                                  raw.source)
        if "resourceName" not in entry:
            raise ConfigError(prefix + "resourceName", None,
                              "every pool needs its own resourceName", raw.source)
        # Top-level pool keys are defaults that every pool may override.
        values = dict(top)
        values.update({k: _Value(v, raw.source) for k, v in entry.items()})
        pools.append(_pool(values, prefix))
    names = [p.resource_name for p in pools]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError("pools", name, "each pool needs a different resourceName",
                              raw.source)
    return tuple(pools)


_CHECKS: dict[str, Callable[[_Value, str], Any]] = {
    "nonHostNetwork": _bool,
    "ncclEnv": _bool,
    "healthPollSeconds": lambda v, k: _float(v, k, 0.05, 60),
    "resendSeconds": lambda v, k: _float(v, k, 1, 3600, zero_ok=True),
    "metricsAddress": _metrics_address,
    "logFormat": lambda v, k: _enum(v, k, LogFormat),
    "cdi.enabled": _bool,
}
_FIELDS = {
    "nonHostNetwork": "non_host_network",
    "ncclEnv": "nccl_env",
    "healthPollSeconds": "health_poll_seconds",
    "resendSeconds": "resend_seconds",
    "metricsAddress": "metrics_address",
    "logFormat": "log_format",
}


def _build(merged: Mapping[str, _Value], config_file: str | None) -> Settings:
    kw: dict[str, Any] = {"pools": _pools(merged), "config_file": config_file}
    for key, attr in _FIELDS.items():
        if key in merged:
            kw[attr] = _CHECKS[key](merged[key], key)
    if "logLevel" in merged:
        level = _str(merged["logLevel"], "logLevel").strip().lower()
        if level not in {"debug", "info", "warning", "error"}:
            raise ConfigError("logLevel", merged["logLevel"].value,
                              "debug, info, warning or error", merged["logLevel"].source)
        kw["log_level"] = level
    cdi = CdiConfig()
    if "cdi.enabled" in merged:
        cdi = CdiConfig(_bool(merged["cdi.enabled"], "cdi.enabled"), cdi.spec_dir)
    if "cdi.specDir" in merged:
        spec_dir = _str(merged["cdi.specDir"], "cdi.specDir").strip()
        if not spec_dir.startswith("/"):
            raise ConfigError("cdi.specDir", spec_dir, "an absolute directory path",
                              merged["cdi.specDir"].source)
        cdi = CdiConfig(cdi.enabled, spec_dir)
    kw["cdi"] = cdi
    for key, attr in (("sysfsRoot", "sysfs_root"), ("devRoot", "dev_root"),
                      ("kubeletDir", "kubelet_dir")):
        if key in merged:
            path = _str(merged[key], key).strip()
            if not path:
                raise ConfigError(key, path, "a directory path", merged[key].source)
            kw[attr] = path
    return Settings(**kw)
