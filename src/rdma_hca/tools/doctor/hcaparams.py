"""ResourceClaims and ResourceClaimTemplates whose parameters for the driver (HcaConfig)
the driver would refuse at Prepare: their pods would be scheduled, then fail to start.

Judged with the driver's own checks (``contract/hcaconfig.py``), so the doctor says what
the driver and the chart's admission policy say. Objects made before the policy was
installed, or in a cluster without it, are the ones found here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rdma_hca.contract.hcaconfig import FIX, problems, read_entries
from rdma_hca.tools.doctor.result import Check

TITLE = "HcaConfig parameters of {driver}"
SHOWN = 5  # objects named on the line


@dataclass(frozen=True, slots=True)
class Refused:
    kind: str  # ResourceClaim or ResourceClaimTemplate
    namespace: str
    name: str
    problem: str  # the driver's line for the first entry it refuses


@dataclass(frozen=True, slots=True)
class ParamsData:
    """What was found; ``error``: the claims or templates could not be listed."""

    refused: tuple[Refused, ...] = ()
    error: str | None = None


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _devices(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    spec = _map(obj.get("spec"))
    return _map(_map(spec.get("spec")).get("devices") if kind == "ResourceClaimTemplate"
                else spec.get("devices"))


def refused(claims: Sequence[Mapping[str, Any]], templates: Sequence[Mapping[str, Any]],
            driver: str) -> tuple[Refused, ...]:
    out = []
    for kind, objects in (("ResourceClaim", claims), ("ResourceClaimTemplate", templates)):
        for obj in objects:
            found = problems(read_entries(_devices(obj, kind).get("config")), driver)
            if found:
                meta = _map(obj.get("metadata"))
                out.append(Refused(kind, str(meta.get("namespace") or ""),
                                   str(meta.get("name") or ""), found[0]))
    return tuple(sorted(out, key=lambda r: (r.kind, r.namespace, r.name)))


def check(data: ParamsData, driver: str) -> Check | None:
    """A failed check naming the objects, a note when they could not be listed, or None
    when every object's parameters would be taken."""
    title = TITLE.format(driver=driver)
    if data.error is not None:
        return Check("cluster", title, True, f"not checked: {data.error}")
    if not data.refused:
        return None
    named = "; ".join(f"{r.kind} {r.namespace}/{r.name}: {r.problem}"
                      for r in data.refused[:SHOWN])
    more = f" (and {len(data.refused) - SHOWN} more)" \
        if len(data.refused) > SHOWN else ""
    return Check(
        "cluster", title, False,
        f"{len(data.refused)} object(s) pass parameters the driver refuses, so their pods "
        f"fail to start (ClaimPrepareFailed): {named}{more}", FIX)
