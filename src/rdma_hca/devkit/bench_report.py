"""The benchmark's figures and how they are written: a markdown table and a JSON document.

Kept apart from the measuring code so the rendering can be checked on made-up numbers
without starting a daemon, and so the table and the JSON always carry the same values:
both are produced from one list of :class:`Figure` records.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rdma_hca.devkit.bench_notes import NOTES
from rdma_hca.kit.text import markdown_table, text_table

JSON_VERSION = 1
NO_VALUE = "—"


@dataclass(frozen=True)
class Target:
    """An upper bound on either our figure itself or on the ratio ours/baseline."""

    limit: float
    on_ratio: bool = False

    def text(self, unit: str) -> str:
        if self.on_ratio:
            return f"≤ {self.limit:g}× baseline"
        return f"≤ {_number(self.limit, unit)} {unit}"

    def met(self, ours: float | None, ratio: float | None) -> bool | None:
        value = ratio if self.on_ratio else ours
        if value is None or math.isnan(value):
            return None
        return value <= self.limit


@dataclass(frozen=True)
class Figure:
    """One row of the table.

    ``key`` is the stable JSON name; ``ours``/``baseline`` are None when the measurement
    failed or there is no baseline, and ``note`` says how the number was taken (or why it
    is missing).
    """

    key: str
    label: str
    unit: str
    ours: float | None
    baseline: float | None = None
    baseline_label: str = ""
    target: Target | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.ours is None or self.baseline is None or self.baseline <= 0:
            return None
        return self.ours / self.baseline

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self.ours, self.ratio)


@dataclass
class Report:
    figures: list[Figure]
    machine: dict[str, str]
    quick: bool
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)

    def misses(self) -> list[Figure]:
        return [f for f in self.figures if f.met is False]

    def failures(self) -> list[Figure]:
        return [f for f in self.figures if f.ours is None]


# --- statistics -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """What a row is, independent of whether its measurement succeeds."""

    key: str
    label: str
    unit: str
    target: Target | None = None
    baseline_label: str = ""

    def figure(self, ours: float, baseline: float | None = None, note: str = "") -> Figure:
        return Figure(self.key, self.label, self.unit, ours, baseline,
                      self.baseline_label if baseline is not None else "", self.target, note)

    def failed(self, why: str) -> Figure:
        return Figure(self.key, self.label, self.unit, None, None, "", self.target,
                      f"not measured: {why}")


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile: an observed sample, never an interpolation between two."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 < pct <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {pct}")
    ordered = sorted(samples)
    rank = math.ceil(pct / 100 * len(ordered))
    return ordered[max(rank, 1) - 1]


def median(samples: Sequence[float]) -> float:
    if not samples:
        raise ValueError("median of no samples")
    return statistics.median(samples)


# --- rendering ------------------------------------------------------------------------------


def _number(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:.2f}"
    if unit in ("count", "req/s"):
        return f"{value:.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"


def _cell(value: float | None, unit: str) -> str:
    return NO_VALUE if value is None else f"{_number(value, unit)} {unit}"


def _met_text(met: bool | None) -> str:
    return {True: "yes", False: "**NO**", None: NO_VALUE}[met]


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_rows(figures: Sequence[Figure]) -> list[list[str]]:
    """Header plus one row per figure, as plain cells (shared by the markdown and the console)."""
    rows = [["figure", "ours", "baseline", "ratio", "target", "met?"]]
    for f in figures:
        base = _cell(f.baseline, f.unit)
        if f.baseline is not None and f.baseline_label:
            base = f"{base} ({f.baseline_label})"
        ratio = NO_VALUE if f.ratio is None else f"{f.ratio:.2f}×"
        target = NO_VALUE if f.target is None else f.target.text(f.unit)
        rows.append([f.label, _cell(f.ours, f.unit), base, ratio, target, _met_text(f.met)])
    return rows


# The numeric columns (ours, baseline, ratio) right-aligned, the verdict centred.
_ALIGN = ("", "right", "right", "right", "", "center")


def render_table(figures: Sequence[Figure]) -> str:
    """The markdown table: figure | ours | baseline | ratio | target | met?"""
    header, *rows = table_rows(figures)
    return markdown_table(header, rows, align=_ALIGN)


def render_console(figures: Sequence[Figure]) -> str:
    """The same rows aligned for a terminal."""
    rows = [[c.replace("**", "") for c in row] for row in table_rows(figures)]
    return "\n".join(text_table(rows, rule="-"))


def render_markdown(report: Report) -> str:
    m = report.machine
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`rdma-hca bench --out-dir .`); the same numbers are in "
        "`benchmarks.json`. Every figure comes from one run on one machine, so they can be "
        "compared side by side; a ratio is ours / baseline.",
        "",
        render_table(report.figures),
        "",
        "## Machine",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in m.items()]
    lines += [
        f"- run: {'quick (--quick, fewer iterations)' if report.quick else 'full'}, "
        f"{report.seconds:.0f} s",
        "",
    ]
    notes = [(f.label, f.note) for f in report.figures if f.note]
    if notes:
        lines += ["## How each figure was taken", ""]
        lines += [f"- **{_escape(label)}**: {note}" for label, note in notes]
        lines.append("")
    misses = report.misses()
    if misses:
        lines += ["## Targets missed", ""]
        lines += [f"- {f.label}: {_cell(f.ours, f.unit)}"
                  + (f" ({f.ratio:.2f}× baseline)" if f.ratio is not None else "")
                  + f", target {f.target.text(f.unit) if f.target else ''}" for f in misses]
        lines.append("")
    lines.append(NOTES)
    return "\n".join(lines)


def _target_json(target: Target | None) -> dict[str, Any] | None:
    if target is None:
        return None
    return {"max": target.limit, "of": "ratio" if target.on_ratio else "ours"}


def report_json(report: Report) -> dict[str, Any]:
    """The JSON document: the table's numbers, unrounded, plus machine info and raw details."""
    return {
        "version": JSON_VERSION,
        "machine": dict(report.machine),
        "quick": report.quick,
        "seconds": round(report.seconds, 3),
        "figures": [
            {
                "key": f.key,
                "label": f.label,
                "unit": f.unit,
                "ours": f.ours,
                "baseline": f.baseline,
                "baselineLabel": f.baseline_label or None,
                "ratio": f.ratio,
                "target": _target_json(f.target),
                "met": f.met,
                "note": f.note or None,
            }
            for f in report.figures
        ],
        "details": report.details,
    }


# --- machine --------------------------------------------------------------------------------


def _cpu_model(proc_root: str) -> str:
    try:
        with open(os.path.join(proc_root, "cpuinfo"), encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _load_average() -> str:
    # Other work on the machine moves the latency figures; the reader should see how much.
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def machine_info(tree_location: str, proc_root: str = "/proc") -> dict[str, str]:
    """What a reader needs to compare runs: cores, CPU, Python, grpcio, kernel, date."""
    import grpc

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "nproc": str(os.cpu_count() or "unknown"),
        "cpu": _cpu_model(proc_root),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "kernel": platform.release(),
        "load average at start (1, 5, 15 min)": _load_average(),
        "simulated trees on": tree_location,
    }
