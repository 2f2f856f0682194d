"""The cluster view of ``rdma-hca doctor``: is the plugin installed, running and advertising,
do the DRA driver's ResourceSlices match the nodes, and are the fabric's cables right
(``fabric.py``, from what the daemons heard by LLDP)?

Fetching (``clusterfetch.py``: three reads, and one or two for DRA) is kept apart from
judging (:func:`evaluate`, a pure function of what the API server returned and the current
time), so every verdict can be tested on objects shaped like real API objects.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from rdma_hca.tools.doctor import classes, fabric, hcaparams
from rdma_hca.tools.doctor import slices as dra
from rdma_hca.tools.doctor.clusterdata import ClusterData, ClusterReport, DaemonSetRow, NodeRow
from rdma_hca.tools.doctor.clusternodes import CHART_DIR, daemonset_row, judge_node
from rdma_hca.tools.doctor.result import Check
from rdma_hca.tools.doctor.workloads import Pod


def evaluate(data: ClusterData, resource: str, now: dt.datetime) -> ClusterReport:
    """Judge the cluster: one check for the DaemonSet, one or more for every RDMA node."""
    checks: list[Check] = []
    ds_ref = f"ds/{data.name}"
    kns = f"kubectl -n {data.namespace}"
    row = daemonset_row(data.daemonset, now) if data.daemonset is not None else None
    if not data.nodes:
        checks.append(Check(
            "cluster", "nodes", False, "the API server lists 0 nodes",
            "join the RDMA nodes to the cluster and wait until kubectl get nodes shows them",
        ))
    ds_selector = data.daemonset.node_selector if data.daemonset is not None else {}
    pods_by_node: dict[str, list[Pod]] = {}
    for pod in data.pods:
        if pod.node_name and not pod.deleting:
            pods_by_node.setdefault(pod.node_name, []).append(pod)
    judge_dra = data.dra is not None and data.dra.slices is not None and dra.in_use(data.dra)[0]
    slices_by_node = dra.by_node(data.dra.slices or []) if data.dra is not None else {}
    rows: list[NodeRow] = []
    dra_rows: list[dra.NodeSlices] = []
    for node in sorted(data.nodes, key=lambda n: n.name):
        name = node.name
        node_slices = slices_by_node.get(name, [])
        node_row, node_checks = judge_node(
            node, pods_by_node, resource, ds_selector, data, kns, ds_ref, bool(node_slices)
        )
        if judge_dra and data.dra is not None and (node_row.ok is not None or node_slices):
            slice_row, slice_checks = dra.judge_node(
                name, node_slices, driver=data.dra.driver, in_use=True,
                pod_ready=node_row.pod_ready is True, **_commands(kns, ds_ref, node_row))
            dra_rows.append(slice_row)
            node_checks.extend(slice_checks)
            node_row = dataclasses.replace(node_row, ok=all(c.ok for c in node_checks))
        rows.append(node_row)
        checks.extend(node_checks)
    dra_report = None
    if data.dra is not None:
        use, because = dra.in_use(data.dra)
        stale: tuple[dra.StaleSlice, ...] = ()
        if judge_dra:
            stale = dra.stale(data.dra, {n.name for n in rows})
            checks.append(dra.stale_check(data.dra, stale, len(slices_by_node) - len(
                {s.node_name for s in stale})))
            trap = _class_trap(data.dra)
            if trap is not None:
                checks.append(trap)
        elif data.dra.error is not None:
            checks.append(Check(
                "cluster", f"ResourceSlices of {data.dra.driver}", False,
                f"could not be listed: {data.dra.error}",
                "run the doctor again; if it keeps failing, read the API server's log"))
        dra_report = dra.DraReport(
            data.dra.driver, data.dra.available, use and data.dra.slices is not None, because,
            dra.note(data.dra), tuple(dra_rows), stale)
    if data.params is not None and data.dra is not None:
        found = hcaparams.check(data.params, data.dra.driver)
        if found is not None:
            checks.append(found)
    # Nodes that should run a plugin pod (they have one, or an RDMA label or count) but have
    # no ready one: named on the DaemonSet's line so the first failure says where to look.
    lacking = [n.name for n in rows if n.ok is False and n.pod_ready is not True]
    checks.insert(0, _daemonset_check(data, row, kns, ds_ref, lacking))
    published = [f for f in (fabric.read_node(n.name, n.labels, n.annotations)
                             for n in data.nodes) if f is not None]
    fabric_report = fabric.evaluate(
        published, None if data.daemonset is None else data.daemonset.net_raw)
    checks.extend(fabric_report.checks)
    return ClusterReport(data.namespace, data.name, resource, row, tuple(rows), tuple(checks),
                         dra_report, fabric_report)


def _class_trap(data: dra.DraData) -> Check | None:
    """The DeviceClasses that would give a claim the node-wide device unawares; asked only
    where a slice publishes that device (without it, such a class matches HCAs alone)."""
    if data.device_classes is None or not dra.has_node_wide(data.slices or [], data.driver):
        return None
    return classes.trap_check(data.device_classes, data.driver)


def _commands(kns: str, ds_ref: str, row: NodeRow) -> dict[str, str]:
    """The log to read and the node doctor to run for a node, through its pod if it has one."""
    if row.pod is None:
        return {"logs": f"{kns} logs {ds_ref}",
                "node_doctor": f"rdma-hca doctor --node on node {row.name}"}
    return {"logs": f"{kns} logs {row.pod}",
            "node_doctor": f"{kns} exec {row.pod} -- rdma-hca doctor --node"}


def _daemonset_check(
    data: ClusterData, row: DaemonSetRow | None, kns: str, ds_ref: str, lacking: list[str]
) -> Check:
    title = f"DaemonSet {data.namespace}/{data.name}"
    without = f"; nodes without a ready pod: {', '.join(lacking)}" if lacking else ""
    if row is None:
        return Check(
            "cluster", title, False, "not found (HTTP 404)",
            f"is the chart installed? helm install ack-rdma-device-plugin {CHART_DIR} "
            f"-n {data.namespace}",
        )
    if row.desired == 0:
        return Check(
            "cluster", title, False,
            f"schedules no pods (DESIRED 0, node selector {row.node_selector})",
            "label the RDMA nodes so the node selector matches, e.g. kubectl label node "
            "<node> rdma.hca/enabled=true",
        )
    if row.ready < row.desired or row.available < row.desired:
        return Check(
            "cluster", title, False,
            f"{row.ready} of {row.desired} pods ready, {row.available} available{without}",
            f"{kns} describe {ds_ref} and {kns} logs {ds_ref}",
        )
    if lacking:
        return Check(
            "cluster", title, False,
            f"{row.ready} of {row.desired} pods ready{without}",
            "the DaemonSet does not cover these nodes: see their checks below",
        )
    return Check("cluster", title, True, f"{row.ready} of {row.desired} pods ready")


