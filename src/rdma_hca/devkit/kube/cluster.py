"""What the fake API server holds: the cluster state tests seed and read, the faults they
inject, and the record of every request it answered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rdma_hca.devkit.kube.faults import Fault

TOKEN = "test-token-0123456789"
DRA = "resource.k8s.io/v1"


@dataclass(frozen=True, slots=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str | None = None
    client_cn: str | None = None  # the common name of a verified TLS client certificate
    user_agent: str | None = None


@dataclass
class FakeCluster:
    """The state the fake server serves; tests change it between requests."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    daemonsets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    # None: the API server has no resource.k8s.io/v1 (before 1.34, or DRA off): 404.
    resource_slices: list[dict[str, Any]] | None = None
    resource_claims: list[dict[str, Any]] = field(default_factory=list)
    device_classes: list[dict[str, Any]] = field(default_factory=list)
    resource_claim_templates: list[dict[str, Any]] = field(default_factory=list)  # read-only
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)  # their labels
    forbidden: set[str] = field(default_factory=set)  # resources answered with 403
    broken: set[str] = field(default_factory=set)  # resources answered with 500
    plain_404: bool = False  # unknown paths get a text 404, as from a proxy in front
    token: str | None = TOKEN  # None: accept any caller (TLS client certificates)
    taints_allowed: bool = True  # the DRADeviceTaints feature gate
    # DRAResourceClaimDeviceStatus: off, the server drops status.devices from writes.
    claim_device_status: bool = True
    # The versions of resource.k8s.io served over one store. v1beta2 has v1's shape (v1 is
    # v1beta2 graduated); v1beta1 (devices under "basic") is not served here.
    dra_versions: tuple[str, ...] = ("v1", "v1beta2")
    # Events, stored in the events.k8s.io/v1 shape (core v1 requests see them renamed).
    events: list[dict[str, Any]] = field(default_factory=list)
    events_v1: bool = True  # False: events.k8s.io/v1 is not served (404), only core v1
    requests: list[Recorded] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
