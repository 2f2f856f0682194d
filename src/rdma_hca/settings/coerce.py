"""Typed values from the raw ones a layer gives: text, YAML scalars and mappings.

Each setting's raw value comes with where it came from (file, variable or flag), so that a
refusal names the field, the value, its source and what is allowed
(:class:`~rdma_hca.settings.model.ConfigError`). A variable is always text; the config file
gives YAML's own types, and a boolean there is written without quotes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rdma_hca.kit.names import is_dns_subdomain, resource_name_problem
from rdma_hca.kit.quantity import QuantityError, parse_quantity
from rdma_hca.settings.decl import LINK_LAYERS, SELECTOR_KEYS, Kind, Setting, allowed_text
from rdma_hca.settings.model import BANDWIDTH_STEP, ConfigError, Selectors


@dataclass(slots=True)
class RawValue:
    """One setting's value as a layer gave it, before it is checked."""

    value: Any
    source: str
    # What gave it: "file" (typed YAML values), "env" (always text) or "flag".
    layer: str = "flag"


def _str(v: RawValue, key: str) -> str:
    if isinstance(v.value, bool) or not isinstance(v.value, str | int | float):
        raise ConfigError(key, v.value, "a string", v.source)
    return str(v.value)


def _bool(v: RawValue, key: str) -> bool:
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


def _int(v: RawValue, key: str, s: Setting) -> int:
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


def _float(v: RawValue, key: str, s: Setting) -> float:
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


def _bandwidth(v: RawValue, key: str, s: Setting) -> int:
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


def _enum(v: RawValue, key: str, s: Setting) -> StrEnum:
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


def _metrics_address(v: RawValue, key: str) -> str:
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


def _path(v: RawValue, key: str, s: Setting) -> str:
    path = _str(v, key).strip()
    if not path or "\0" in path:
        raise ConfigError(key, path, allowed_text(s), v.source)
    if s.absolute and not path.startswith("/"):
        raise ConfigError(key, path, allowed_text(s), v.source)
    return path


def _dns_name(v: RawValue, key: str, s: Setting) -> str:
    name = _str(v, key).strip()
    if name == "" and s.default == "":
        return ""
    if not is_dns_subdomain(name) or (s.max_length and len(name) > s.max_length):
        raise ConfigError(key, name, allowed_text(s), v.source)
    return name


def _selectors(v: RawValue, key: str) -> Selectors:
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


def typed_value(s: Setting, v: RawValue, key: str) -> Any:
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
        why = resource_name_problem(name)
        if why:
            raise ConfigError(key, name, why, v.source)
        return name
    return _str(v, key)
