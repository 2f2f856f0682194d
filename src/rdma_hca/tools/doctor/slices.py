"""The DRA part of the cluster view: do the driver's ResourceSlices match the nodes?

The driver publishes one pool per node, named after it, in as many ResourceSlices as the
API's limits need (``resourceSliceCount`` of them at the pool's current generation).
Judged here, as a pure function of what the API server listed (the cluster view does the
reads):

- DRA is *in use* when at least one ResourceSlice of the driver exists in the cluster, or,
  when none does, a DeviceClass selects the driver (its CEL compares ``device.driver``
  with the driver's name, as the chart's DeviceClass does). A cluster that merely serves
  ``resource.k8s.io/v1`` is not using DRA for HCAs.
- A node whose plugin pod is ready must then have a slice; a node has one pool, all of
  its slices at one generation and as many as the pool says, no device twice; a slice
  naming a node that does not exist is stale; a tainted or ``linkState: down`` device is
  a port down on that node.
- The node-wide device (attribute ``kind: node``, named ``all-hcas``: what ``rdma/hca``
  through DRA's extended DeviceClass gets) is not an HCA: it is reported on its own, with
  its ``hcaCount``, and fails only when it carries a taint, which the driver sets only
  when no HCA of the node is up. A device without ``kind`` (an older driver) is an HCA.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rdma_hca.contract.dra import (
    GROUP,
    HCA_COUNT,
    HCA_NAME,
    KIND,
    KIND_NODE,
    LINK_STATE,
    RESYNC_SECONDS,
)
from rdma_hca.settings.model import DEFAULT_DRA_DRIVER_NAME
from rdma_hca.tools.doctor.draobjects import DeviceClass, ResourceSlice, SliceDevice
from rdma_hca.tools.doctor.result import Check

DEFAULT_DRIVER = DEFAULT_DRA_DRIVER_NAME
RBAC_FIX = (
    "kubectl create clusterrole rdma-hca-doctor-dra --verb=list "
    f"--resource=resourceslices.{GROUP},deviceclasses.{GROUP} && kubectl create "
    "clusterrolebinding rdma-hca-doctor-dra --clusterrole=rdma-hca-doctor-dra --user=<you>"
)
NODE_WIDE = "the node-wide device (rdma/hca through DRA)"


@dataclass(frozen=True, slots=True)
class DraData:
    """What the API server said about DRA.

    ``slices`` is None when they could not be listed (``available`` False: no
    resource.k8s.io/v1; ``denied``: RBAC; ``error``: another failure). ``device_classes``
    holds the DeviceClasses selecting the driver, None when they were not or could not be
    listed (they are asked for when no slice exists, to tell whether DRA is in use, and
    when a slice holds the node-wide device, to find the classes it traps).
    """

    driver: str
    available: bool
    slices: Sequence[ResourceSlice] | None
    device_classes: Sequence[DeviceClass] | None = None
    denied: str | None = None
    error: str | None = None  # listing the slices failed otherwise (e.g. HTTP 500)


@dataclass(frozen=True, slots=True)
class NodeWide:
    """The node-wide device of a node's current slices."""

    name: str
    hca_count: int | None  # its hcaCount attribute: the HCAs a claim of it gets
    link_state: str | None
    taints: tuple[str, ...]  # the taints' keys

    @property
    def tainted(self) -> bool:
        return bool(self.taints)


@dataclass(frozen=True, slots=True)
class NodeSlices:
    """One node's slices of the driver, as the text table and the JSON show them."""

    node: str
    slices: tuple[str, ...]
    pools: tuple[str, ...]
    generation: int | None  # the highest pool generation among them
    devices: int  # HCA devices in the current slices (the highest generation of each pool)
    tainted: int
    link_down: int
    ok: bool | None  # None: nothing judged (DRA not in use and no slice)
    node_device: NodeWide | None = None  # None: the slices have none (exclusive mode)


@dataclass(frozen=True, slots=True)
class StaleSlice:
    name: str
    node_name: str


@dataclass(frozen=True, slots=True)
class DraReport:
    driver: str
    available: bool
    in_use: bool
    in_use_because: str | None  # "2 ResourceSlices", "DeviceClass rdma-hca.io"
    note: str | None  # one line when DRA could not be checked or is not in use
    nodes: tuple[NodeSlices, ...]
    stale_slices: tuple[StaleSlice, ...]


def _quoted(driver: str) -> str:
    return rf"""(?:"{re.escape(driver)}"|'{re.escape(driver)}')"""


def selects_driver(device_class: DeviceClass, driver: str) -> bool:
    """Whether a DeviceClass's CEL selectors compare ``device.driver`` with ``driver``."""
    quoted = _quoted(driver)
    pattern = re.compile(rf"device\.driver\s*==\s*{quoted}|{quoted}\s*==\s*device\.driver")
    return any(pattern.search(e) for e in device_class.expressions)


def by_node(slices: Sequence[ResourceSlice]) -> dict[str, list[ResourceSlice]]:
    """Slices by ``spec.nodeName``; slices for several nodes (nodeSelector) are left out."""
    out: dict[str, list[ResourceSlice]] = {}
    for s in slices:
        if s.node_name:
            out.setdefault(s.node_name, []).append(s)
    return out


def is_node_wide(device: SliceDevice, driver: str) -> bool:
    """Whether a device is the node-wide one; without ``kind`` (an older driver) it is an
    HCA."""
    return device.attribute(driver, KIND, "string") == KIND_NODE


def _devices(slices: Sequence[ResourceSlice]) -> list[SliceDevice]:
    return [d for s in slices for d in s.devices]


def _hca_devices(slices: Sequence[ResourceSlice], driver: str) -> list[SliceDevice]:
    return [d for d in _devices(slices) if not is_node_wide(d, driver)]


def has_node_wide(slices: Sequence[ResourceSlice], driver: str) -> bool:
    """Whether any of ``slices`` publishes the node-wide device."""
    return any(is_node_wide(d, driver) for d in _devices(slices))


def _node_wide(slices: Sequence[ResourceSlice], driver: str) -> NodeWide | None:
    for device in _devices(slices):
        if is_node_wide(device, driver):
            count = device.attribute(driver, HCA_COUNT, "int")
            state = device.attribute(driver, LINK_STATE, "string")
            return NodeWide(device.name, count if isinstance(count, int) else None,
                            state if isinstance(state, str) else None, device.taints)
    return None


def _down_devices(slices: Sequence[ResourceSlice], driver: str) -> tuple[
        list[str], int, int]:
    """``(descriptions, tainted, link down)`` of the HCA devices of ``slices`` not fit for
    use."""
    described: list[str] = []
    tainted = link_down = 0
    for s in slices:
        for device in _hca_devices([s], driver):
            hca = device.attribute(driver, HCA_NAME, "string")
            state = device.attribute(driver, LINK_STATE, "string")
            taints = list(device.taints)
            down = state == "down"
            tainted += bool(taints)
            link_down += down
            if taints or down:
                why = [f"tainted {', '.join(taints)}"] if taints else []
                why += ["linkState down"] if down else []
                name = device.name + (f" ({hca})" if hca else "")
                described.append(f"{name} {' and '.join(why)}")
    return described, tainted, link_down


def _current(slices: Sequence[ResourceSlice]) -> list[ResourceSlice]:
    """The slices the scheduler uses: those at the highest generation of their pool."""
    top: dict[str, int] = {}
    for s in slices:
        top[s.pool] = max(top.get(s.pool, 0), s.generation)
    return [s for s in slices if s.generation == top[s.pool]]


def _node_pool(node: str, slices: Sequence[ResourceSlice]) -> tuple[
        str, list[ResourceSlice], list[ResourceSlice]]:
    """``(pool, its slices at its highest generation, every other slice)``: the pool is
    the one named after the node, else the one with the highest generation."""
    names = {s.pool for s in slices}
    pool = node if node in names else max(slices, key=lambda s: s.generation).pool
    mine = [s for s in slices if s.pool == pool]
    top = max(s.generation for s in mine)
    current = [s for s in mine if s.generation == top]
    return pool, current, [s for s in slices if not any(s is c for c in current)]


def _devices_twice(slices: Sequence[ResourceSlice]) -> list[str]:
    seen: set[str] = set()
    twice: set[str] = set()
    for s in slices:
        for device in s.devices:
            (twice if device.name in seen else seen).add(device.name)
    return sorted(twice)


def judge_node(
    node: str,
    slices: Sequence[ResourceSlice],
    *,
    driver: str,
    in_use: bool,
    pod_ready: bool,
    logs: str,
    node_doctor: str,
) -> tuple[NodeSlices, list[Check]]:
    """The node's row and its checks. ``logs`` and ``node_doctor`` are the commands a fix
    line names (the plugin pod's log, ``rdma-hca doctor --node`` on that node)."""
    title = "ResourceSlice"
    names = tuple(sorted(s.name for s in slices))
    pools = tuple(sorted({s.pool for s in slices}))
    current = _current(slices)
    described, tainted, link_down = _down_devices(current, driver)
    devices = len(_hca_devices(current, driver))
    wide = _node_wide(current, driver)
    generation = max((s.generation for s in slices), default=None)
    checks: list[Check] = []
    if not slices:
        if in_use and pod_ready:
            checks.append(Check(
                node, title, False,
                f"none of driver {driver} although DRA is in use and the plugin pod is ready",
                f"is dra.enabled set in the daemon's config? the driver publishes its slice "
                f"once the kubelet registered it: {logs}, and {node_doctor}",
            ))
    else:
        pool, current, extra = _node_pool(node, slices)
        count = max((c.slice_count for c in current), default=1)
        if extra:
            gone = " ".join(sorted(s.name for s in extra))
            checks.append(Check(
                node, title, False,
                f"{len(slices)} slices ({', '.join(names)}) in {len(pools)} pool(s) "
                f"({', '.join(pools)}): the driver keeps one pool per node, {count} slice(s) "
                f"at its current generation",
                f"the driver deletes the others within {RESYNC_SECONDS:g} s; if they stay, read "
                f"{logs} or delete them: kubectl delete resourceslice {gone}",
            ))
        elif len(current) > count:
            checks.append(Check(
                node, title, False,
                f"pool {pool} has {len(current)} slices at generation {generation} but says "
                f"{count} ({', '.join(names)})",
                f"read {logs}; the driver rewrites its slices when it restarts",
            ))
        elif len(current) < count:
            checks.append(Check(
                node, title, False,
                f"pool {pool} is incomplete: {len(current)} of {count} slices at generation "
                f"{generation} (the scheduler waits for the rest)",
                f"the driver is writing them or cannot: read {logs}",
            ))
        twice = _devices_twice(current)
        if twice:
            checks.append(Check(
                node, title, False,
                f"device(s) {', '.join(twice)} in more than one slice of pool {pool}",
                f"read {logs}; the driver rewrites its slices when it restarts",
            ))
        if described:
            still = (f"; {NODE_WIDE} is not tainted: pods asking for rdma/hca are still "
                     "placed here" if wide is not None and not wide.tainted else "")
            checks.append(Check(
                node, "DRA devices", False,
                f"{len(described)} of {devices} down: {'; '.join(described)} (no new claim "
                f"is placed on a tainted device){still}",
                f"check the HCA ports on the node: {node_doctor}",
            ))
        if wide is not None and wide.tainted:
            checks.append(Check(
                node, "DRA node-wide device", False,
                f"{NODE_WIDE} {wide.name}{_hca_count(wide)} is tainted "
                f"{', '.join(wide.taints)}: no HCA of the node is up, so no pod asking for "
                "rdma/hca through DRA is placed here",
                f"bring an HCA port up on the node: {node_doctor}",
            ))
        if not checks:
            what = names[0] if len(names) == 1 else f"{len(names)} slices"
            also = (f", and {NODE_WIDE} {wide.name}{_hca_count(wide)}"
                    if wide is not None else "")
            checks.append(Check(
                node, title, True,
                f"{what}: pool {pools[0]} generation {generation}, {devices} device(s), "
                f"none tainted or down{also}",
            ))
    row = NodeSlices(node, names, pools, generation, devices, tainted, link_down,
                     all(c.ok for c in checks) if checks else None, wide)
    return row, checks


def _hca_count(wide: NodeWide) -> str:
    return "" if wide.hca_count is None else f" (hcaCount {wide.hca_count})"


def in_use(data: DraData) -> tuple[bool, str | None]:
    if data.slices:
        return True, f"{len(data.slices)} ResourceSlice(s) of {data.driver}"
    if data.device_classes:
        return True, f"DeviceClass {', '.join(sorted(c.name for c in data.device_classes))}"
    return False, None


def note(data: DraData) -> str | None:
    """One line when DRA cannot be judged or is not in use; None when it is judged."""
    if not data.available:
        return (f"DRA is not available on this cluster (the API server does not serve "
                f"{GROUP}/v1, Kubernetes 1.34 and later do): no ResourceSlices to check")
    if data.denied is not None:
        return (f"ResourceSlices not checked: {data.denied}; this needs list on "
                f"resourceslices.{GROUP} and deviceclasses.{GROUP}, e.g. {RBAC_FIX}")
    if in_use(data)[0] or data.error is not None:
        return None
    if data.device_classes is None:
        return (f"no ResourceSlice of driver {data.driver}, and DeviceClasses could not be "
                f"listed (RBAC) to tell whether DRA is in use; that needs list on "
                f"deviceclasses.{GROUP}, e.g. {RBAC_FIX}")
    return (f"DRA is not in use for driver {data.driver}: no ResourceSlice of it and no "
            "DeviceClass selecting it (--dra-driver names another driver)")


def stale(data: DraData, nodes: set[str]) -> tuple[StaleSlice, ...]:
    return tuple(sorted(
        (StaleSlice(s.name, n) for n, found in by_node(data.slices or []).items()
         if n not in nodes for s in found),
        key=lambda st: (st.node_name, st.name)))


def stale_check(data: DraData, found: Sequence[StaleSlice], node_count: int) -> Check:
    title = f"ResourceSlices of {data.driver}"
    if found:
        gone = sorted({s.node_name for s in found})
        return Check(
            "cluster", title, False,
            f"{len(found)} stale: they name node(s) that do not exist ({', '.join(gone)})",
            "no driver is left to delete them: kubectl delete resourceslice "
            + " ".join(s.name for s in found),
        )
    return Check("cluster", title, True,
                 f"{len(data.slices or [])} slice(s) on {node_count} node(s), none stale")
