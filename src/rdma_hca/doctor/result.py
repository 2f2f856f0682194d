"""The verdict record every doctor and check report is made of."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Check:
    """One verdict: what was checked, on what, the finding, and the fix when it failed."""

    subject: str  # "cluster", "node", "container" or a node name
    name: str
    ok: bool
    detail: str
    fix: str | None = None
