"""Field and label selectors, matched as the API server matches them on lists."""

from __future__ import annotations

import re
from typing import Any

from rdma_hca.devkit.kube.errors import HttpError

SLICE_FIELDS = ("metadata.name", "spec.nodeName", "spec.driver")


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def field_selector_matches(selector: str, obj: dict[str, Any],
                           allowed: tuple[str, ...] = SLICE_FIELDS) -> bool:
    """``a=b``, ``a==b`` and ``a!=b`` terms; a field the resource does not index is a 400."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        key, _, value = term.partition("!=" if negate else "=")
        value = value.removeprefix("=")
        if key not in allowed:
            raise HttpError(400, "BadRequest", f"field label not supported: {key}")
        if (_field(obj, key) == value) == negate:
            return False
    return True


def label_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality, ``in``/``notin``, existence and ``!key`` terms, as kubectl sends them."""
    for term in re.findall(r"[^,(]+(?:\([^)]*\))?", selector):
        term = term.strip()
        if not term:
            continue
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            if (labels.get(m.group(1)) in values) != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            key, _, value = term.partition("!=")
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, _, value = term.partition("=")
            if labels.get(key) != value.removeprefix("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True
