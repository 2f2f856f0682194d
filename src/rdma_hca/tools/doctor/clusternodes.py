"""Judging one node of the cluster view: its plugin pod and the extended resource it
advertises, and whether a node without a pod should have one. Pure functions of the API
server's JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Mapping
from fractions import Fraction

from rdma_hca.kit.quantity import QuantityError, format_quantity, parse_quantity
from rdma_hca.settings.config import given_value
from rdma_hca.settings.decl import BY_KEY, flags_in
from rdma_hca.settings.model import ConfigError
from rdma_hca.tools.doctor.clusterdata import ClusterData, DaemonSetRow, NodeRow
from rdma_hca.tools.doctor.result import Check
from rdma_hca.tools.doctor.workloads import DaemonSet, Node, Pod

RDMA_LABELS: tuple[tuple[str, str], ...] = (
    ("feature.node.kubernetes.io/rdma.available", "true"),
    ("feature.node.kubernetes.io/rdma.capable", "true"),
    ("rdma.hca/enabled", "true"),
)
CHART_DIR = "deploy/helm/ack-rdma-device-plugin"
_DEVICE_PLUGIN = BY_KEY["devicePlugin.enabled"]


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


def daemonset_row(ds: DaemonSet, now: dt.datetime) -> DaemonSetRow:
    created = _parse_time(ds.created)
    age = human_duration((now - created).total_seconds()) if created else "<unknown>"
    return DaemonSetRow(
        name=ds.name,
        desired=ds.desired,
        current=ds.current,
        ready=ds.ready,
        up_to_date=ds.up_to_date,
        available=ds.available,
        node_selector=",".join(f"{k}={v}" for k, v in sorted(ds.node_selector.items()))
        or "<none>",
        age=age,
    )


def _quantity(quantities: Mapping[str, str], resource: str) -> tuple[str | None, Fraction | None]:
    """``(kubectl text, exact value)`` of a resource in status.capacity/allocatable."""
    raw = quantities.get(resource)
    if raw is None:
        return None, None
    try:
        q = parse_quantity(str(raw))
    except QuantityError:
        return str(raw), None
    return format_quantity(q), q.value



def judge_node(
    node: Node,
    pods_by_node: Mapping[str, list[Pod]],
    resource: str,
    ds_selector: Mapping[str, str],
    data: ClusterData,
    kns: str,
    ds_ref: str,
    has_slices: bool = False,
) -> tuple[NodeRow, list[Check]]:
    name, labels = node.name, node.labels
    labelled = any(labels.get(k) == v for k, v in RDMA_LABELS)
    cap_text, cap = _quantity(node.capacity, resource)
    alloc_text, alloc = _quantity(node.allocatable, resource)
    pods = pods_by_node.get(name, [])
    ready_pods = [p for p in pods if p.ready]
    chosen = ready_pods or pods
    pod = chosen[0] if chosen else None
    pod_name = pod.name if pod is not None else None
    checks: list[Check] = []
    if pod is not None and pod_name is not None:
        checks.append(_pod_check(node, pod, kns))
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


def device_plugin_enabled(pod: Pod) -> bool | None:
    """Whether the pod serves the device plugin (False: the DRA driver alone, the chart's
    devicePlugin.enabled=false), read from a container's flags and variables as serve reads
    them; None when none sets it (the config file, out of doctor's sight, or the default
    decides). A value serve refuses raises what serve says of it."""
    for container in pod.containers:
        enabled = given_value(_DEVICE_PLUGIN.key, container.env,
                              flags_in(list(container.words), [_DEVICE_PLUGIN]))
        if enabled is not None:
            return bool(enabled)
    return None


def _pod_check(node: Node, pod: Pod, kns: str) -> Check:
    name, pod_name = node.name, pod.name
    title = "plugin pod"
    if pod.ready:
        return Check(name, title, True, f"{pod_name} ready")
    fix = f"{kns} logs {pod_name} and {kns} describe pod {pod_name}"
    if not node.ready:
        fix = f"the node is NotReady, fix it first: kubectl describe node {name}; then {fix}"
    return Check(name, title, False, f"{pod_name} not ready ({pod.problem})", fix)


def _resource_check(
    name: str,
    resource: str,
    capacity: tuple[str | None, Fraction | None],
    allocatable: tuple[str | None, Fraction | None],
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
    cap: Fraction | None,
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
