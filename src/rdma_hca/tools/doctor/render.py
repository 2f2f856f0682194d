"""Text and JSON output of the doctor reports.

Tables are laid out as kubectl lays out ``kubectl get`` (columns left-aligned, three spaces
between them, no trailing padding) so the DaemonSet line reads exactly like the one in the
installation guide and can be compared by eye.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from rdma_hca.kit.text import text_table
from rdma_hca.tools.doctor.clusterdata import ClusterReport
from rdma_hca.tools.doctor.result import Check
from rdma_hca.tools.doctor.slices import NodeSlices

OK, FAIL = "✓", "✗"
# Subjects that need no "node X:" prefix: the whole cluster, this node, this container.
_GLOBAL_SUBJECTS = frozenset({"cluster", "node", "container"})


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to the widest cell plus three spaces, like kubectl's tabwriter."""
    return "\n".join(text_table([list(headers), *(list(r) for r in rows)], gap=3))


def mark(ok: bool | None) -> str:
    return "-" if ok is None else (OK if ok else FAIL)


def checks_text(checks: Sequence[Check]) -> str:
    """One line per check, and an indented "how to fix" line under every failure."""
    lines = []
    for c in checks:
        subject = "" if c.subject in _GLOBAL_SUBJECTS else f"node {c.subject}: "
        lines.append(f"{mark(c.ok)} {subject}{c.name}: {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"    how to fix: {c.fix}")
    return "\n".join(lines)


def summary(checks: Sequence[Check]) -> str:
    failed = sum(1 for c in checks if not c.ok)
    if failed == 0:
        return f"{OK} all {len(checks)} checks passed"
    return f"{FAIL} {failed} of {len(checks)} checks failed"


def cluster_text(report: ClusterReport) -> str:
    parts: list[str] = []
    if report.daemonset is not None:
        d = report.daemonset
        parts.append(table(
            ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR",
             "AGE"],
            [[d.name, str(d.desired), str(d.current), str(d.ready), str(d.up_to_date),
              str(d.available), d.node_selector, d.age]],
        ))
    if report.nodes:
        parts.append(table(
            ["NODE", "PLUGIN POD", "POD READY", "CAPACITY", "ALLOCATABLE", "RDMA LABEL", "OK"],
            [[n.name, n.pod or "<none>", mark(n.pod_ready), n.capacity or "<none>",
              n.allocatable or "<none>", "yes" if n.rdma_labelled else "no", mark(n.ok)]
             for n in report.nodes],
        ))
    if report.dra is not None and report.dra.nodes:
        # The node-wide column only where some node has that device (shared mode).
        wide = any(n.node_device is not None for n in report.dra.nodes)
        parts.append(table(
            ["NODE", "RESOURCESLICES", "POOL", "GENERATION", "DEVICES", "TAINTED", "LINK DOWN",
             *(["NODE-WIDE"] if wide else []), "OK"],
            [[n.node, str(len(n.slices)), ",".join(n.pools) or "<none>",
              "<none>" if n.generation is None else str(n.generation), str(n.devices),
              str(n.tainted), str(n.link_down), *([_node_wide(n)] if wide else []),
              mark(n.ok)] for n in report.dra.nodes],
        ))
    if report.dra is not None and report.dra.note:
        parts.append(f"{mark(None)} {report.dra.note}")
    if report.fabric is not None and report.fabric.blocks:
        parts.append(table(
            ["FABRIC BLOCK", "NODES", "SWITCHES", "OK"],
            [[b.block, str(len(b.nodes)), ",".join(b.switches) or "<none>", mark(b.ok)]
             for b in report.fabric.blocks]))
    if report.fabric is not None and report.fabric.note:
        parts.append(f"{mark(None)} {report.fabric.note}")
    parts.append(checks_text(report.checks))
    parts.append(summary(report.checks))
    return "\n\n".join(parts) + "\n"


def _node_wide(row: NodeSlices) -> str:
    """The NODE-WIDE cell: how many HCAs the node-wide device gives, and its taint."""
    d = row.node_device
    if d is None:
        return "<none>"
    count = "?" if d.hca_count is None else str(d.hca_count)
    return f"{count} HCAs" + (", tainted" if d.tainted else "")


def camel(record: Any) -> dict[str, Any]:
    """A dataclass as a JSON object with camelCase keys, the convention of Kubernetes JSON."""
    def key(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(part.title() for part in rest)

    return {key(k): v for k, v in dataclasses.asdict(record).items()}


def checks_json(checks: Sequence[Check]) -> list[dict[str, Any]]:
    return [camel(c) for c in checks]


def cluster_json(report: ClusterReport) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "namespace": report.namespace,
        "daemonSet": camel(report.daemonset) if report.daemonset else None,
        "daemonSetName": report.name,
        "resource": report.resource,
        "nodes": [camel(n) for n in report.nodes],
        "dra": dra_json(report),
        "fabric": fabric_json(report),
        "checks": checks_json(report.checks),
        "error": None,
    }


def dra_json(report: ClusterReport) -> dict[str, Any] | None:
    d = report.dra
    if d is None:
        return None
    return {
        "driver": d.driver,
        "available": d.available,
        "inUse": d.in_use,
        "inUseBecause": d.in_use_because,
        "note": d.note,
        "nodes": [_slices_json(n) for n in d.nodes],
        "staleSlices": [camel(s) for s in d.stale_slices],
    }


def fabric_json(report: ClusterReport) -> dict[str, Any] | None:
    f = report.fabric
    if f is None:
        return None
    return {
        "note": f.note,
        "blocks": [camel(b) for b in f.blocks],
        "miscabled": [camel(m) for m in f.miscabled],
        "silentPorts": [{"node": node, "hca": p.hca, "port": p.port, "netdev": p.netdev}
                        for node, p in f.silent],
    }


def _slices_json(row: NodeSlices) -> dict[str, Any]:
    doc = camel(row)
    wide = row.node_device
    doc["nodeDevice"] = None if wide is None else {**camel(wide), "tainted": wide.tainted}
    return doc
