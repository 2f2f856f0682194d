"""The records of the cluster view: what the API server returned, and the report made of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rdma_hca.tools.doctor.fabric import FabricReport
from rdma_hca.tools.doctor.hcaparams import ParamsData
from rdma_hca.tools.doctor.result import Check
from rdma_hca.tools.doctor.slices import DraData, DraReport
from rdma_hca.tools.doctor.workloads import DaemonSet, Node, Pod


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
    daemonset: DaemonSet | None
    nodes: Sequence[Node]
    pods: Sequence[Pod]
    dra: DraData | None = None  # None: DRA was not looked at
    params: ParamsData | None = None  # claims' HcaConfig; None: not looked at


@dataclass(frozen=True, slots=True)
class ClusterReport:
    namespace: str
    name: str
    resource: str
    daemonset: DaemonSetRow | None
    nodes: tuple[NodeRow, ...]
    checks: tuple[Check, ...] = field(default=())
    dra: DraReport | None = None
    fabric: FabricReport | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

