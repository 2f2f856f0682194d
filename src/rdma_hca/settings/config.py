"""One typed settings object from the config file, ``RDMA_HCA_*`` variables and flags.

Layers are merged as raw values first (file, then environment, then flags) and only
then validated, so that an error can always say which field was wrong, what value it
had, where that value came from and what is allowed. The daemon turns a
:class:`ConfigError` into exit status 2 before it registers anything.

What each setting is (key, variable, flag, type, range, default, help) is declared once in
``settings_decl``; the records are in ``settings_model``, the bounded file reader in
``settings_file`` and the checks against the machine and between pools and DRA in
``settings_checks``. Everything is importable from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rdma_hca.kit.names import is_dns_subdomain, resource_name_problem
from rdma_hca.kit.quantity import QuantityError, parse_quantity
from rdma_hca.kit.text import closest
from rdma_hca.settings.checks import (
    ROOT_KEYS,
    check_roots,
    exclusive_first,
    held_text,
    kubelet_root_problem,
    names_both_select,
    overlapping_hcas,
    pools_sharing,
    root_problem,
    selected_hcas,
    setting_source,
    surely_shared,
)
from rdma_hca.settings.decl import (
    BY_KEY,
    LINK_LAYERS,
    OTHER_ENV,
    POOL_KEYS,
    SELECTOR_KEYS,
    SETTINGS,
    Kind,
    Scope,
    Setting,
    add_flags,
    allowed_text,
    docs_table,
    file_groups,
    flag_values,
    flags_in,
    known_env,
    top_file_keys,
    with_docs_table,
)
from rdma_hca.settings.file import MAX_FILE_BYTES, read_config_file
from rdma_hca.settings.model import (
    BANDWIDTH_STEP,
    DEFAULT_DRA_DRIVER_NAME,
    DEFAULT_HEALTH_POLL_SECONDS,
    DEFAULT_HTTP_MAX_CONNECTIONS,
    DEFAULT_KUBELET_DIR,
    DEFAULT_KUBELET_ROOT,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_RDMA_HCA_MAX,
    DEFAULT_READ_DEADLINE_SECONDS,
    DEFAULT_RESEND_SECONDS,
    DEFAULT_RESOURCE_NAME,
    ENV_PREFIX,
    CdiConfig,
    ConfigError,
    DeviceMetadata,
    DraConfig,
    HttpConfig,
    LogFormat,
    LogLevel,
    Mode,
    NcclEnv,
    PoolConfig,
    Selectors,
    Settings,
    UnhealthyWhen,
)

__all__ = [
    "BY_KEY",
    "DEFAULT_DRA_DRIVER_NAME",
    "DEFAULT_HEALTH_POLL_SECONDS",
    "DEFAULT_HTTP_MAX_CONNECTIONS",
    "DEFAULT_KUBELET_DIR",
    "DEFAULT_KUBELET_ROOT",
    "DEFAULT_METRICS_ADDRESS",
    "DEFAULT_RDMA_HCA_MAX",
    "DEFAULT_READ_DEADLINE_SECONDS",
    "DEFAULT_RESEND_SECONDS",
    "DEFAULT_RESOURCE_NAME",
    "ENV_PREFIX",
    "MAX_FILE_BYTES",
    "OTHER_ENV",
    "ROOT_KEYS",
    "SETTINGS",
    "CdiConfig",
    "ConfigError",
    "DeviceMetadata",
    "DraConfig",
    "HttpConfig",
    "Kind",
    "LogFormat",
    "LogLevel",
    "Mode",
    "NcclEnv",
    "PoolConfig",
    "Scope",
    "Selectors",
    "Setting",
    "Settings",
    "UnhealthyWhen",
    "add_flags",
    "check_roots",
    "docs_table",
    "env_warnings",
    "exclusive_first",
    "flag_values",
    "flags_in",
    "given_value",
    "held_text",
    "kubelet_root_problem",
    "load_settings",
    "overlapping_hcas",
    "pools_sharing",
    "read_config_file",
    "root_problem",
    "selected_hcas",
    "setting_source",
    "validate_resource_name",
    "with_docs_table",
]

validate_resource_name = resource_name_problem


@dataclass(slots=True)
class _Value:
    value: Any
    source: str
    # What gave it: "file" (typed YAML values), "env" (always text) or "flag".
    layer: str = "flag"


def _flag_source(s: Setting) -> str:
    return f"flag {s.flag}"


def load_settings(
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> Settings:
    """Merge file, environment and flags (in that order of precedence, lowest first).

    ``flags`` maps YAML-style keys (``resourceName``, ``sysfsRoot``, ``cdi.enabled`` ...)
    to values; ``None`` means "not given". Things that work but are probably not what was
    meant (an unknown ``RDMA_HCA_*`` variable, a top-level value every pool overrides) come
    back as ``Settings.warnings``, one line each.
    """
    env = dict(env or {})
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    config_name = "--config"
    if config_file is None and env.get(ENV_PREFIX + "CONFIG"):
        config_file = env[ENV_PREFIX + "CONFIG"]
        config_name = ENV_PREFIX + "CONFIG"
    file_data: dict[Any, Any] = (read_config_file(config_file, config_name) if config_file
                                 else {})
    file_src = f"config file {config_file}"

    merged: dict[str, _Value] = {}
    top_keys = top_file_keys()
    groups = file_groups()
    for key, value in file_data.items():
        name = str(key)
        if name not in top_keys:
            raise ConfigError(name, value, _unknown_key(name, top_keys), file_src)
        if name in groups:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(name, value, "a mapping with " + ", ".join(groups[name]),
                                  file_src)
            for sub, subval in value.items():
                if str(sub) not in groups[name]:
                    raise ConfigError(f"{name}.{sub}", subval, "unknown key; allowed: "
                                      + ", ".join(groups[name]), file_src)
                merged[f"{name}.{sub}"] = _Value(subval, file_src, "file")
        else:
            merged[name] = _Value(value, file_src, "file")
    for s in SETTINGS:
        from_env = _env_value(s, env)
        if from_env is not None:
            merged[s.key] = from_env
    for key, value in flags.items():
        declared = BY_KEY.get(key)
        if declared is None or declared.flag is None:
            raise ConfigError(key, value, "not a known setting")
        merged[key] = _Value(value, _flag_source(declared))
    warnings = env_warnings(env)
    settings = _build(merged, config_file, warnings)
    _check_static_overlap(settings, merged)
    return settings


def _env_value(s: Setting, env: Mapping[str, str]) -> _Value | None:
    """The variable of ``s`` that ``env`` sets (the first declared wins), as text."""
    for var in s.env:
        if var in env:
            return _Value(env[var], f"environment variable {var}", "env")
    return None


def given_value(key: str, env: Mapping[str, str], flags: Mapping[str, object]) -> Any:
    """One setting as ``load_settings`` reads it from its flag (first) or its variable, or
    None when neither is given; a value ``serve`` refuses raises the same ConfigError.

    For a caller that sees only these layers of a daemon, e.g. doctor reading a pod's spec.
    """
    s = BY_KEY[key]
    flag = flags.get(key)
    v = _Value(flag, _flag_source(s)) if flag is not None else _env_value(s, env)
    return None if v is None else _value(s, v, key)


def _unknown_key(name: str, allowed: Sequence[str]) -> str:
    """What to say of a key the file may not hold here."""
    declared = BY_KEY.get(name)
    if declared is not None and declared.scope is Scope.MACHINE:
        how = " or ".join(([f"flag {declared.flag}"] if declared.flag else [])
                          + [f"variable {e}" for e in declared.env])
        return (f"set by flag or variable only ({how}), not in the config file: it differs "
                "from node to node")
    hint = closest(name, allowed)
    return (f"unknown key; did you mean {hint}?" if hint else
            "unknown key; allowed keys are " + ", ".join(sorted(allowed)))


def env_warnings(env: Mapping[str, str]) -> list[str]:
    """One line per ``RDMA_HCA_*`` variable that no setting reads, naming the likely one."""
    known = known_env()
    out = []
    for name in sorted(env):
        if name.startswith(ENV_PREFIX) and name not in known:
            hint = closest(name, known)
            out.append(f"unknown environment variable {name} is ignored"
                       + (f"; did you mean {hint}?" if hint else
                          "; docs/configuration.md lists the variables"))
    return out


# --- values ------------------------------------------------------------------------------


def _str(v: _Value, key: str) -> str:
    if isinstance(v.value, bool) or not isinstance(v.value, str | int | float):
        raise ConfigError(key, v.value, "a string", v.source)
    return str(v.value)


def _bool(v: _Value, key: str) -> bool:
    if isinstance(v.value, bool):
        return v.value
    if isinstance(v.value, str) and v.layer != "file":
        # A variable is text: the same two words a YAML boolean is written with.
        low = v.value.strip().lower()
        if low in {"true", "false"}:
            return low == "true"
    allowed = ("true or false, a YAML boolean without quotes" if v.layer == "file"
               else "true or false")
    raise ConfigError(key, v.value, allowed, v.source)


def _int(v: _Value, key: str, s: Setting) -> int:
    raw = v.value
    lo, hi = int(s.minimum or 0), int(s.maximum or 0)
    allowed = allowed_text(s)
    if isinstance(raw, bool):
        raise ConfigError(key, raw, allowed, v.source)
    num: object = raw
    if isinstance(raw, str):
        text = raw.strip()
        # int() of thousands of digits is slow and refused by Python: no setting needs that.
        num = int(text) if len(text) <= 20 and text.lstrip("+-").isdigit() else None
    if not isinstance(num, int) or not lo <= num <= hi:
        raise ConfigError(key, raw, allowed, v.source)
    return num


def _float(v: _Value, key: str, s: Setting) -> float:
    raw = v.value
    allowed = allowed_text(s) + " (seconds)"
    if isinstance(raw, bool) or (isinstance(raw, str) and len(raw) > 40):
        raise ConfigError(key, raw, allowed, v.source)
    try:
        num = float(raw.strip()) if isinstance(raw, str) else float(raw)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(key, raw, allowed, v.source) from None
    lo, hi = float(s.minimum or 0), float(s.maximum or 0)
    if math.isnan(num) or not ((s.zero_off and num == 0) or lo <= num <= hi):
        raise ConfigError(key, raw, allowed, v.source)
    return num


def _bandwidth(v: _Value, key: str, s: Setting) -> int:
    raw = v.value
    allowed = allowed_text(s)
    if isinstance(raw, bool) or not isinstance(raw, str | int) or len(str(raw)) > 40:
        raise ConfigError(key, raw, allowed, v.source)
    try:
        bits = parse_quantity(str(raw).strip()).value
    except QuantityError:
        raise ConfigError(key, raw, allowed, v.source) from None
    if bits < 0:
        raise ConfigError(key, raw, allowed, v.source)
    if bits % BANDWIDTH_STEP:
        # The request policy's step: the API server refuses a default between steps.
        raise ConfigError(key, raw, f"{allowed}; this is not a whole number of G (Gi and "
                          "Ti are binary: write G or T)", v.source)
    return int(bits)


def _enum(v: _Value, key: str, s: Setting) -> StrEnum:
    raw = v.value
    assert s.enum is not None, f"{s.key} is declared ENUM without its enum type"
    # An older spelling may be a YAML boolean (ncclEnv: true).
    text = ("true" if raw else "false") if isinstance(raw, bool) and s.aliases else raw
    if isinstance(text, str):
        text = dict(s.aliases).get(text, text)
        if text in s.choices:
            return s.enum(text)
    allowed = allowed_text(s)
    if isinstance(raw, str) and raw.strip().lower() in s.choices:
        # Written as documented, exactly: `Shared` would read as a different value elsewhere.
        allowed += f", written exactly so: did you mean {raw.strip().lower()}?"
    raise ConfigError(key, raw, allowed, v.source)


def _metrics_address(v: _Value, key: str) -> str:
    raw = _str(v, key).strip()
    if raw == "":
        return ""
    host, sep, port = raw.rpartition(":")
    if not sep or not port.isdigit() or len(port) > 5 or not 1 <= int(port) <= 65535:
        raise ConfigError(key, raw, "HOST:PORT or :PORT with a port from 1 to 65535, or empty "
                          "to turn the HTTP endpoints off", v.source)
    if host.startswith("[") != host.endswith("]"):
        raise ConfigError(key, raw, "an IPv6 host must be written in brackets, e.g. [::1]:9478",
                          v.source)
    return raw


def _path(v: _Value, key: str, s: Setting) -> str:
    path = _str(v, key).strip()
    if not path or "\0" in path:
        raise ConfigError(key, path, allowed_text(s), v.source)
    if s.absolute and not path.startswith("/"):
        raise ConfigError(key, path, allowed_text(s), v.source)
    return path


def _dns_name(v: _Value, key: str, s: Setting) -> str:
    name = _str(v, key).strip()
    if name == "" and s.default == "":
        return ""
    if not is_dns_subdomain(name) or (s.max_length and len(name) > s.max_length):
        raise ConfigError(key, name, allowed_text(s), v.source)
    return name


def _selectors(v: _Value, key: str) -> Selectors:
    raw = v.value
    if raw is None:
        return Selectors()
    if not isinstance(raw, dict):
        raise ConfigError(key, raw, "a mapping of " + ", ".join(SELECTOR_KEYS) + " to lists",
                          v.source)
    out: dict[str, tuple[str, ...]] = {}
    for sub, items in raw.items():
        if sub not in SELECTOR_KEYS:
            raise ConfigError(f"{key}.{sub}", items,
                              "unknown selector; allowed: " + ", ".join(SELECTOR_KEYS), v.source)
        if isinstance(items, str) and items:
            raise ConfigError(f"{key}.{sub}", items, f"a list of non-empty strings: write "
                              f"[{items}]", v.source)
        if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
            raise ConfigError(f"{key}.{sub}", items, "a list of non-empty strings", v.source)
        if sub == "linkLayers":
            for i in items:
                if i.lower() not in {x.lower() for x in LINK_LAYERS}:
                    raise ConfigError(f"{key}.{sub}", i, " or ".join(LINK_LAYERS), v.source)
        out[SELECTOR_KEYS[sub]] = tuple(items)
    return Selectors(**out)


def _value(s: Setting, v: _Value, key: str) -> Any:
    """The typed value of one declared setting (``key`` is how errors name it)."""
    kind = s.kind
    if kind is Kind.BOOL:
        return _bool(v, key)
    if kind is Kind.INT:
        return _int(v, key, s)
    if kind is Kind.FLOAT:
        return _float(v, key, s)
    if kind is Kind.ENUM:
        return _enum(v, key, s)
    if kind is Kind.ADDRESS:
        return _metrics_address(v, key)
    if kind is Kind.PATH:
        return _path(v, key, s)
    if kind is Kind.DNS_NAME:
        return _dns_name(v, key, s)
    if kind is Kind.SELECTORS:
        return _selectors(v, key)
    if kind is Kind.BANDWIDTH:
        return _bandwidth(v, key, s)
    if kind is Kind.RESOURCE_NAME:
        name = _str(v, key).strip()
        why = validate_resource_name(name)
        if why:
            raise ConfigError(key, name, why, v.source)
        return name
    return _str(v, key)


# --- pools -------------------------------------------------------------------------------


def _pool(values: Mapping[str, _Value], prefix: str) -> PoolConfig:
    kw = {BY_KEY[k].attr: _value(BY_KEY[k], v, prefix + k) for k, v in values.items()}
    return PoolConfig(**kw)


def _pools(merged: Mapping[str, _Value], warnings: list[str]) -> tuple[PoolConfig, ...]:
    top = {k: merged[k] for k in POOL_KEYS if k in merged}
    if "pools" not in merged or merged["pools"].value is None:
        return (_pool(top, ""),)
    raw = merged["pools"]
    if not isinstance(raw.value, list) or not raw.value:
        raise ConfigError("pools", raw.value, "a non-empty list of pools (to serve no "
                          "device-plugin pool, set devicePlugin.enabled: false)", raw.source)
    pools: list[PoolConfig] = []
    entries: list[dict[Any, Any]] = []
    for i, entry in enumerate(raw.value):
        prefix = f"pools[{i}]."
        if not isinstance(entry, dict):
            raise ConfigError(f"pools[{i}]", entry, "a mapping with resourceName and more",
                              raw.source)
        for k in entry:
            if k not in POOL_KEYS:
                raise ConfigError(prefix + str(k), entry[k], _unknown_key(str(k), POOL_KEYS),
                                  raw.source)
        if "resourceName" not in entry:
            raise ConfigError(prefix + "resourceName", None,
                              "every pool needs its own resourceName", raw.source)
        # Top-level pool keys are defaults that every pool may override.
        values = dict(top)
        values.update({k: _Value(v, raw.source, raw.layer) for k, v in entry.items()})
        pools.append(_pool(values, prefix))
        entries.append(entry)
    names = [p.resource_name for p in pools]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError("pools", name, "each pool needs a different resourceName",
                              raw.source)
    warnings.extend(_override_warnings(top, entries))
    return tuple(pools)


def _override_warnings(top: Mapping[str, _Value], entries: Sequence[dict[Any, Any]]) -> list[str]:
    """A top-level value no pool uses, or one from the environment or a flag that a pool's
    own value beats: both look like they apply and do not."""
    out = []
    for key, v in top.items():
        overriding = [f"pools[{i}].{key}" for i, e in enumerate(entries) if key in e]
        if not overriding:
            continue
        shown = f"{key}={v.value!s:.60} (from {v.source})"
        if len(overriding) == len(entries):
            out.append(f"{shown} has no effect: every pool sets its own {key}; "
                       "remove it or set it in the pools")
        elif not v.source.startswith("config file"):
            out.append(f"{shown} does not apply to {', '.join(overriding)}, which set "
                       f"{key} in the config file")
    return out


# --- the whole -----------------------------------------------------------------------------


def _build(merged: Mapping[str, _Value], config_file: str | None,
           warnings: list[str]) -> Settings:
    kw: dict[str, Any] = {"config_file": config_file}
    grouped: dict[str, dict[str, Any]] = {"cdi": {}, "dra": {}, "http": {}}
    for s in SETTINGS:
        if s.key not in merged or s.scope is Scope.POOL or s.kind is Kind.POOLS:
            continue
        value = _value(s, merged[s.key], s.key)
        group, _, attr = s.attr.rpartition(".")
        (grouped[group] if group else kw)[attr] = value
    device_plugin = kw.get("device_plugin_enabled", True)
    if device_plugin:
        kw["pools"] = _pools(merged, warnings)
    elif "pools" in merged and merged["pools"].value:
        warnings.append(f"pools (from {merged['pools'].source}) are not served: "
                        "devicePlugin.enabled is false")
    kw["cdi"] = CdiConfig(**grouped["cdi"])
    kw["dra"] = DraConfig(**grouped["dra"])
    kw["http"] = HttpConfig(**grouped["http"])
    kw["warnings"] = tuple(warnings)
    kw["sources"] = {key: v.source for key, v in merged.items()}
    settings = Settings(**kw)
    if not settings.device_plugin_enabled and not settings.dra.enabled:
        v = merged["devicePlugin.enabled"]
        raise ConfigError("devicePlugin.enabled", v.value, "with dra.enabled false too, "
                          "nothing would be offered: turn one of them on", v.source)
    return settings


# --- the same HCA offered twice ------------------------------------------------------------


def _check_static_overlap(settings: Settings, merged: Mapping[str, _Value]) -> None:
    _check_exclusive_pools(settings, merged)
    if not settings.dra.enabled:
        return
    dra = settings.dra.selectors
    fix = ("give the pools and dra.selectors names that do not overlap (e.g. pools "
           "names: [mlx5_0, mlx5_1], dra names: [mlx5_2, mlx5_3]), or set "
           "devicePlugin.enabled: false (--no-device-plugin) to run DRA alone")
    for pool in settings.pools:
        if not surely_shared(pool.selectors, dra):
            continue
        if pool.selectors.takes_all:
            why = f"the pool {pool.resource_name} takes every HCA"
        elif dra.takes_all:
            why = ("dra.selectors is empty, so DRA takes every HCA, also those of "
                   f"{pool.resource_name}")
        else:
            why = f"the pool {pool.resource_name} and dra.selectors select the same HCA names"
        v = merged.get("dra.enabled", _Value(True, ""))
        raise ConfigError("dra.enabled", v.value,
                          f"{why}, so it would be offered twice: {fix}", v.source)


def _check_exclusive_pools(settings: Settings, merged: Mapping[str, _Value]) -> None:
    """Two pools known from the config alone to hold a same HCA, one of them exclusive.

    An exclusive pool hands each HCA to one pod; another pool would hand it out again.
    Shared pools may overlap (the daemon says so once, naming the HCAs, after discovery).
    """
    pools = settings.pools
    for i, a in enumerate(pools):
        for b in pools[i + 1:]:
            pair = exclusive_first(a, b)
            if pair is None or not surely_shared(a.selectors, b.selectors):
                continue
            ex, other = pair
            if ex.selectors.takes_all or other.selectors.takes_all:
                whole = ex if ex.selectors.takes_all else other
                why = f"the pool {whole.resource_name} takes every HCA"
            else:
                why = "both select the same HCA names"
            held = held_text(names_both_select(ex.selectors, other.selectors))
            v = merged.get("pools", _Value(None, ""))
            raise ConfigError(
                "pools", f"{ex.resource_name}, {other.resource_name}",
                f"the exclusive pool {ex.resource_name} and the pool {other.resource_name} "
                f"would both hold {held} ({why}): an exclusive pool gives each HCA to one "
                "pod only; give the pools selectors that keep their HCAs apart", v.source)
