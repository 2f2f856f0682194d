"""One typed settings object from the config file, ``RDMA_HCA_*`` variables and flags.

Layers are merged as raw values first (file, then environment, then flags) and only
then validated, so that an error can always say which field was wrong, what value it
had, where that value came from and what is allowed. The daemon turns a
:class:`~rdma_hca.settings.model.ConfigError` into exit status 2 before it registers anything.

What each setting is (key, variable, flag, type, range, default, help) is declared once in
:mod:`rdma_hca.settings.decl`; the records are in :mod:`rdma_hca.settings.model`, the
bounded file reader in :mod:`rdma_hca.settings.file`, the typing of one raw value in
:mod:`rdma_hca.settings.coerce` and the checks against the machine and between pools and
DRA in :mod:`rdma_hca.settings.checks`. This module merges the layers and builds the whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rdma_hca.kit.text import closest
from rdma_hca.settings.checks import check_static_overlap
from rdma_hca.settings.coerce import RawValue, typed_value
from rdma_hca.settings.decl import (
    BY_KEY,
    POOL_KEYS,
    SETTINGS,
    Kind,
    Scope,
    Setting,
    file_groups,
    known_env,
    top_file_keys,
)
from rdma_hca.settings.file import read_config_file
from rdma_hca.settings.model import (
    ENV_PREFIX,
    CdiConfig,
    ConfigError,
    DraConfig,
    FabricConfig,
    HttpConfig,
    PoolConfig,
    Settings,
)


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

    merged: dict[str, RawValue] = {}
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
                merged[f"{name}.{sub}"] = RawValue(subval, file_src, "file")
        else:
            merged[name] = RawValue(value, file_src, "file")
    for s in SETTINGS:
        from_env = _env_value(s, env)
        if from_env is not None:
            merged[s.key] = from_env
    for key, value in flags.items():
        declared = BY_KEY.get(key)
        if declared is None or declared.flag is None:
            raise ConfigError(key, value, "not a known setting")
        merged[key] = RawValue(value, _flag_source(declared))
    warnings = env_warnings(env)
    settings = _build(merged, config_file, warnings)
    check_static_overlap(settings, merged)
    return settings


def _env_value(s: Setting, env: Mapping[str, str]) -> RawValue | None:
    """The variable of ``s`` that ``env`` sets (the first declared wins), as text."""
    for var in s.env:
        if var in env:
            return RawValue(env[var], f"environment variable {var}", "env")
    return None


def given_value(key: str, env: Mapping[str, str], flags: Mapping[str, object]) -> Any:
    """One setting as ``load_settings`` reads it from its flag (first) or its variable, or
    None when neither is given; a value ``serve`` refuses raises the same ConfigError.

    For a caller that sees only these layers of a daemon, e.g. doctor reading a pod's spec.
    """
    s = BY_KEY[key]
    flag = flags.get(key)
    v = RawValue(flag, _flag_source(s)) if flag is not None else _env_value(s, env)
    return None if v is None else typed_value(s, v, key)


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



# --- pools -------------------------------------------------------------------------------


def _pool(values: Mapping[str, RawValue], prefix: str) -> PoolConfig:
    kw = {BY_KEY[k].attr: typed_value(BY_KEY[k], v, prefix + k) for k, v in values.items()}
    return PoolConfig(**kw)


def _pools(merged: Mapping[str, RawValue], warnings: list[str]) -> tuple[PoolConfig, ...]:
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
        values.update({k: RawValue(v, raw.source, raw.layer) for k, v in entry.items()})
        pools.append(_pool(values, prefix))
        entries.append(entry)
    names = [p.resource_name for p in pools]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError("pools", name, "each pool needs a different resourceName",
                              raw.source)
    warnings.extend(_override_warnings(top, entries))
    return tuple(pools)


def _override_warnings(top: Mapping[str, RawValue], entries: Sequence[dict[Any, Any]]) -> list[str]:
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


def _build(merged: Mapping[str, RawValue], config_file: str | None,
           warnings: list[str]) -> Settings:
    kw: dict[str, Any] = {"config_file": config_file}
    grouped: dict[str, dict[str, Any]] = {"cdi": {}, "dra": {}, "http": {}, "fabric": {}}
    for s in SETTINGS:
        if s.key not in merged or s.scope is Scope.POOL or s.kind is Kind.POOLS:
            continue
        value = typed_value(s, merged[s.key], s.key)
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
    kw["fabric"] = FabricConfig(**grouped["fabric"])
    kw["warnings"] = tuple(warnings)
    kw["sources"] = {key: v.source for key, v in merged.items()}
    settings = Settings(**kw)
    if not settings.device_plugin_enabled and not settings.dra.enabled:
        v = merged["devicePlugin.enabled"]
        raise ConfigError("devicePlugin.enabled", v.value, "with dra.enabled false too, "
                          "nothing would be offered: turn one of them on", v.source)
    return settings
