"""The cluster view of ``rdma-hca doctor``: is the plugin installed, running and advertising,
and do the DRA driver's ResourceSlices match the nodes?

Fetching (three reads, and one or two for DRA) is kept apart from judging (:func:`evaluate`,
a pure function of the JSON the API server returned and the current time), so every verdict
can be tested on plain dictionaries shaped like real API objects.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rdma_hca.contract.dra import GROUP
from rdma_hca.kit.quantity import QuantityError, format_quantity, parse_quantity
from rdma_hca.settings.config import BY_KEY, ConfigError, flags_in, given_value
from rdma_hca.tools.doctor import slices as dra
from rdma_hca.tools.doctor.kubeapi import ApiError, KubeClient, KubeError, NotFoundError
from rdma_hca.tools.doctor.result import Check

T = TypeVar("T")

__all__ = ["AccessError", "Check", "ClusterData", "ClusterReport", "evaluate", "fetch"]

RDMA_LABELS: tuple[tuple[str, str], ...] = (
    ("feature.node.kubernetes.io/rdma.available", "true"),
    ("feature.node.kubernetes.io/rdma.capable", "true"),
    ("rdma.hca/enabled", "true"),
)
CHART_DIR = "deploy/helm/ack-rdma-device-plugin"
_DEVICE_PLUGIN = BY_KEY["devicePlugin.enabled"]
RBAC_FIX = (
    "kubectl create clusterrole rdma-hca-doctor --verb=get,list "
    "--resource=nodes,pods,daemonsets.apps && kubectl create clusterrolebinding "
    "rdma-hca-doctor --clusterrole=rdma-hca-doctor --user=<you>"
)


class AccessError(KubeError):
    """401/403: the credentials work at the network level but are refused."""


@dataclass(frozen=True, slots=True)
class DaemonSetRow:
    """The columns of ``kubectl get ds``, as kubectl prints them."""

    name: str
    desired: int
    current: int
    ready: int
    up_to_date: int
    available: int
    node_selector: str
    age: str


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    pod: str | None  # our plugin pod on the node (a ready one if any)
    pod_ready: bool | None  # None when there is no pod
    capacity: str | None  # kubectl form of status.capacity[resource]
    allocatable: str | None
    rdma_labelled: bool
    ok: bool | None  # None: not an RDMA node, nothing to judge


@dataclass(frozen=True, slots=True)
class ClusterData:
    """What the API server returned; ``daemonset`` is None when it does not exist."""

    namespace: str
    name: str
    daemonset: Mapping[str, Any] | None
    nodes: Sequence[Mapping[str, Any]]
    pods: Sequence[Mapping[str, Any]]
    dra: dra.DraData | None = None  # None: DRA was not looked at


@dataclass(frozen=True, slots=True)
class ClusterReport:
    namespace: str
    name: str
    resource: str
    daemonset: DaemonSetRow | None
    nodes: tuple[NodeRow, ...]
    checks: tuple[Check, ...] = field(default=())
    dra: dra.DraReport | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


# ---------------------------------------------------------------------------------- fetching


def fetch(
    client: KubeClient, namespace: str, name: str, driver: str | None = dra.DEFAULT_DRIVER
) -> ClusterData:
    """Read the DaemonSet, every node, the DaemonSet's pods and (unless ``driver`` is None)
    the DRA driver's ResourceSlices."""
    daemonset: Mapping[str, Any] | None = _read(
        client, lambda: client.daemonset(namespace, name), "get", "daemonsets", "apps",
        namespace)
    nodes = _read(client, client.nodes, "list", "nodes", "", None)
    pods: list[dict[str, Any]] = []
    if daemonset is not None:
        selector = daemonset.get("spec", {}).get("selector") or {}
        pods = _read(client, lambda: client.pods(namespace, selector), "list", "pods", "",
                     namespace)
    dra_data = fetch_dra(client, driver) if driver is not None else None
    return ClusterData(namespace, name, daemonset, nodes, pods, dra_data)


def fetch_dra(client: KubeClient, driver: str) -> dra.DraData:
    """The driver's slices (one list, all nodes, so stale ones show too); the DeviceClasses
    only when no slice exists, to tell "DRA not in use" from "no node publishes".

    404 means the API server has no resource.k8s.io/v1 and 403 that we may not look: both
    are reported on one line instead of failing the whole doctor."""
    try:
        slices = _read(client, lambda: client.resource_slices(driver), "list",
                       "resourceslices", GROUP, None)
    except NotFoundError:
        return dra.DraData(driver, available=False, slices=None)
    except AccessError as exc:
        if not isinstance(exc.__cause__, ApiError) or exc.__cause__.status != 403:
            raise
        return dra.DraData(driver, available=True, slices=None, denied=_denied(exc.__cause__))
    except ApiError as exc:  # e.g. 500: the DRA part fails, the rest is still reported
        return dra.DraData(driver, available=True, slices=None, error=str(exc))
    if slices:
        return dra.DraData(driver, available=True, slices=slices)
    try:
        classes = _read(client, client.device_classes, "list", "deviceclasses", GROUP,
                        None)
    except NotFoundError:
        classes = []
    except AccessError as exc:
        if not isinstance(exc.__cause__, ApiError) or exc.__cause__.status != 403:
            raise
        return dra.DraData(driver, available=True, slices=slices, device_classes=None)
    names = [str(c.get("metadata", {}).get("name", "")) for c in classes
             if dra.selects_driver(c, driver)]
    return dra.DraData(driver, available=True, slices=slices, device_classes=names)


def _denied(exc: ApiError) -> str:
    return f"RBAC denied list resourceslices.{GROUP} at cluster scope ({exc})"


def _read(
    client: KubeClient,
    request: Callable[[], T],
    verb: str,
    resource: str,
    group: str,
    namespace: str | None,
) -> T:
    try:
        return request()
    except ApiError as exc:
        if exc.status == 401:
            raise AccessError(
                f"the API server {client.server} rejected our credentials (HTTP 401 "
                "Unauthorized): the token or client certificate is wrong or expired; "
                "get a fresh kubeconfig"
            ) from exc
        if exc.status == 403:
            scope = f"in namespace {namespace}" if namespace else "at cluster scope"
            full = f"{resource}.{group}" if group else resource
            raise AccessError(
                f"RBAC denied {verb} {full} {scope} ({exc}): rdma-hca doctor needs get/list "
                f"on nodes, pods and daemonsets.apps, e.g. {RBAC_FIX}"
            ) from exc
        raise


# ---------------------------------------------------------------------------------- judging


def human_duration(seconds: float) -> str:
    """An age as kubectl prints it: "42s", "7m12s", "42m", "5h3m", "17h", "5d3h", "20d", "2y"."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes, hours = s // 60, s // 3600
    if minutes < 10:
        return _pair(minutes, "m", s % 60, "s")
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return _pair(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return _pair(days, "d", hours % 24, "h")
    if hours < 24 * 365 * 2:
        return f"{days}d"
    if hours < 24 * 365 * 8:
        return _pair(days // 365, "y", days % 365, "d")
    return f"{days // 365}y"


def _pair(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big}{big_unit}" + (f"{small}{small_unit}" if small else "")


def _parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def daemonset_row(ds: Mapping[str, Any], now: dt.datetime) -> DaemonSetRow:
    meta, spec, status = ds.get("metadata", {}), ds.get("spec", {}), ds.get("status", {})
    node_selector = (spec.get("template", {}).get("spec", {}) or {}).get("nodeSelector") or {}
    created = _parse_time(meta.get("creationTimestamp"))
    age = human_duration((now - created).total_seconds()) if created else "<unknown>"
    return DaemonSetRow(
        name=str(meta.get("name", "")),
        desired=_int(status.get("desiredNumberScheduled")),
        current=_int(status.get("currentNumberScheduled")),
        ready=_int(status.get("numberReady")),
        up_to_date=_int(status.get("updatedNumberScheduled")),
        available=_int(status.get("numberAvailable")),
        node_selector=",".join(f"{k}={v}" for k, v in sorted(node_selector.items())) or "<none>",
        age=age,
    )


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _pod_problem(pod: Mapping[str, Any]) -> str:
    """The most telling reason a pod is not ready, e.g. "CrashLoopBackOff"."""
    status = pod.get("status", {})
    for cs in status.get("containerStatuses") or []:
        for key in ("waiting", "terminated"):
            reason = (cs.get("state", {}).get(key) or {}).get("reason")
            if reason:
                return str(reason)
    return str(status.get("phase") or "not ready")


def _node_ready(node: Mapping[str, Any]) -> bool:
    for cond in node.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _quantity(node: Mapping[str, Any], section: str, resource: str) -> tuple[str | None, Any]:
    """``(kubectl text, exact value)`` of a resource in status.capacity/allocatable."""
    raw = (node.get("status", {}).get(section) or {}).get(resource)
    if raw is None:
        return None, None
    try:
        q = parse_quantity(str(raw))
    except QuantityError:
        return str(raw), None
    return format_quantity(q), q.value


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
    ds_selector: Mapping[str, str] = {}
    if data.daemonset is not None:
        tmpl = data.daemonset.get("spec", {}).get("template", {}).get("spec", {}) or {}
        ds_selector = tmpl.get("nodeSelector") or {}
    pods_by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in data.pods:
        node_name = pod.get("spec", {}).get("nodeName")
        if node_name and not pod.get("metadata", {}).get("deletionTimestamp"):
            pods_by_node.setdefault(str(node_name), []).append(pod)
    judge_dra = data.dra is not None and data.dra.slices is not None and dra.in_use(data.dra)[0]
    slices_by_node = dra.by_node(data.dra.slices or []) if data.dra is not None else {}
    rows: list[NodeRow] = []
    dra_rows: list[dra.NodeSlices] = []
    for node in sorted(data.nodes, key=lambda n: str(n.get("metadata", {}).get("name", ""))):
        name = str(node.get("metadata", {}).get("name", ""))
        node_slices = slices_by_node.get(name, [])
        node_row, node_checks = _judge_node(
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
        elif data.dra.error is not None:
            checks.append(Check(
                "cluster", f"ResourceSlices of {data.dra.driver}", False,
                f"could not be listed: {data.dra.error}",
                "run the doctor again; if it keeps failing, read the API server's log"))
        dra_report = dra.DraReport(
            data.dra.driver, data.dra.available, use and data.dra.slices is not None, because,
            dra.note(data.dra), tuple(dra_rows), stale)
    # Nodes that should run a plugin pod (they have one, or an RDMA label or count) but have
    # no ready one: named on the DaemonSet's line so the first failure says where to look.
    lacking = [n.name for n in rows if n.ok is False and n.pod_ready is not True]
    checks.insert(0, _daemonset_check(data, row, kns, ds_ref, lacking))
    return ClusterReport(data.namespace, data.name, resource, row, tuple(rows), tuple(checks),
                         dra_report)


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


def _judge_node(
    node: Mapping[str, Any],
    pods_by_node: Mapping[str, list[Mapping[str, Any]]],
    resource: str,
    ds_selector: Mapping[str, str],
    data: ClusterData,
    kns: str,
    ds_ref: str,
    has_slices: bool = False,
) -> tuple[NodeRow, list[Check]]:
    meta = node.get("metadata", {})
    name = str(meta.get("name", ""))
    labels: Mapping[str, str] = meta.get("labels") or {}
    labelled = any(labels.get(k) == v for k, v in RDMA_LABELS)
    cap_text, cap = _quantity(node, "capacity", resource)
    alloc_text, alloc = _quantity(node, "allocatable", resource)
    pods = pods_by_node.get(name, [])
    ready_pods = [p for p in pods if _pod_ready(p)]
    chosen = ready_pods or pods
    pod = chosen[0] if chosen else None
    pod_name = str(pod.get("metadata", {}).get("name", "")) if pod is not None else None
    checks: list[Check] = []
    if pod is not None and pod_name is not None:
        checks.append(_pod_check(name, node, pod, bool(ready_pods), kns))
        try:
            plugin_off = device_plugin_enabled(pod) is False
        except (ConfigError, argparse.ArgumentError) as exc:
            plugin_off = False
            checks.append(Check(name, "plugin settings", False, f"{pod_name}: {exc}",
                                "rdma-hca serve refuses it and exits at start: set "
                                f"{_DEVICE_PLUGIN.key} to true or false (the chart's value "
                                "of the same name)"))
        if cap_text is None and has_slices:
            # No extended resource but the driver's slice: a node served by DRA only.
            checks.append(Check(name, f"{resource} advertised", True,
                                "not advertised: the node offers its HCAs through DRA only"))
        elif has_slices and alloc == 0 and plugin_off:
            # The kubelet keeps a device plugin's resource after the plugin went away, at 0
            # allocatable: a node moved to DRA looks like one whose HCAs are all down.
            checks.append(Check(
                name, f"{resource} advertised", True,
                f"capacity {cap_text} at 0 allocatable is left from the device plugin (the "
                "kubelet keeps it); the node now offers its HCAs through DRA. To drop it: "
                f"kubectl patch node {name} --subresource=status --type=json -p "
                f"'[{{\"op\":\"remove\",\"path\":\"/status/capacity/"
                f"{resource.replace('/', '~1')}\"}}]'"))
        else:
            checks.append(_resource_check(name, resource, (cap_text, cap),
                                          (alloc_text, alloc), kns, pod_name))
    else:
        missing = _missing_pod_check(name, labels, labelled, ds_selector, resource, cap, data,
                                     kns, ds_ref, has_slices)
        if missing is not None:
            checks.append(missing)
    row = NodeRow(
        name=name,
        pod=pod_name,
        pod_ready=bool(ready_pods) if pod is not None else None,
        capacity=cap_text,
        allocatable=alloc_text,
        rdma_labelled=labelled,
        ok=all(c.ok for c in checks) if checks else None,
    )
    return row, checks


def device_plugin_enabled(pod: Mapping[str, Any]) -> bool | None:
    """Whether the pod serves the device plugin (False: the DRA driver alone, the chart's
    devicePlugin.enabled=false), read from a container's flags and variables as serve reads
    them; None when none sets it (the config file, out of doctor's sight, or the default
    decides). A value serve refuses raises what serve says of it."""
    for container in pod.get("spec", {}).get("containers") or []:
        words = [str(w) for w in [*(container.get("command") or []),
                                  *(container.get("args") or [])]]
        # A variable taken from a ConfigMap or Secret is out of sight too.
        env = {str(e.get("name")): str(e.get("value", "")) for e in container.get("env") or []
               if isinstance(e, dict) and "valueFrom" not in e}
        enabled = given_value(_DEVICE_PLUGIN.key, env, flags_in(words, [_DEVICE_PLUGIN]))
        if enabled is not None:
            return bool(enabled)
    return None


def _pod_check(
    name: str, node: Mapping[str, Any], pod: Mapping[str, Any], ready: bool, kns: str
) -> Check:
    pod_name = pod.get("metadata", {}).get("name", "")
    title = "plugin pod"
    if ready:
        return Check(name, title, True, f"{pod_name} ready")
    fix = f"{kns} logs {pod_name} and {kns} describe pod {pod_name}"
    if not _node_ready(node):
        fix = f"the node is NotReady, fix it first: kubectl describe node {name}; then {fix}"
    return Check(name, title, False, f"{pod_name} not ready ({_pod_problem(pod)})", fix)


def _resource_check(
    name: str,
    resource: str,
    capacity: tuple[str | None, Any],
    allocatable: tuple[str | None, Any],
    kns: str,
    pod_name: str,
) -> Check:
    """A running plugin must advertise a non-zero count, all of it allocatable."""
    (cap_text, cap), (alloc_text, alloc) = capacity, allocatable
    node_doctor = f"{kns} exec {pod_name} -- rdma-hca doctor --node"
    title = f"{resource} advertised"
    if cap is None or cap == 0:
        shown = cap_text if cap_text is not None else "nothing"
        return Check(
            name, title, False, f"the plugin pod runs but the node shows {shown}",
            f"{kns} logs {pod_name} (did it register with the kubelet?) and check the "
            f"node's HCAs: {node_doctor}",
        )
    if alloc is None or alloc < cap:
        return Check(
            name, title, False,
            f"allocatable {alloc_text or 'nothing'} < capacity {cap_text}: some HCA is "
            "unhealthy",
            f"check the node's HCA ports: {node_doctor}",
        )
    return Check(name, title, True, f"capacity {cap_text}, allocatable {alloc_text}")


def _missing_pod_check(
    name: str,
    labels: Mapping[str, str],
    labelled: bool,
    ds_selector: Mapping[str, str],
    resource: str,
    cap: Any,
    data: ClusterData,
    kns: str,
    ds_ref: str,
    has_slices: bool = False,
) -> Check | None:
    """A node without our pod is only wrong if something says it is an RDMA node."""
    selected = bool(ds_selector) and all(labels.get(k) == v for k, v in ds_selector.items())
    advertises = cap is not None and cap > 0
    if not (labelled or selected or advertises or has_slices):
        return None
    if labelled:
        why = f"has an RDMA label but no pod of {data.name}"
    elif selected:
        why = f"matches the node selector of {data.name} but has no pod of it"
    elif advertises:
        why = f"advertises {resource} but no pod of {data.name} runs there (stale count)"
    else:
        driver = data.dra.driver if data.dra is not None else "the driver"
        why = f"has ResourceSlices of {driver} but no pod of {data.name} runs there"
    if data.daemonset is None:
        fix = (f"install the chart: helm install ack-rdma-device-plugin {CHART_DIR} "
               f"-n {data.namespace}")
    elif ds_selector and not selected:
        wanted = " ".join(f"{k}={v}" for k, v in sorted(ds_selector.items()))
        fix = f"label the node so the DaemonSet selects it: kubectl label node {name} {wanted}"
    else:
        fix = (f"compare the node's taints (kubectl describe node {name}) with the "
               f"DaemonSet's tolerations and read its events ({kns} describe {ds_ref})")
    return Check(name, "plugin pod", False, why, fix)
