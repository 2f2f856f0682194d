"""Why a claim was not prepared, where its user looks: a Warning Event about the Pod the
claim is reserved for (``kubectl describe pod``) and one about the claim, each with the
error and what to do about it.

The Pod comes from the claim's ``status.reservedFor`` as the Prepare read it: no read of
its own, so Events cost the driver's API budget nothing. A claim that could not be read
(the API server did not answer, or refused) has its Event on the claim alone, and the
Pods a claim was once read with are remembered for its later failures. The kubelet's
retries of one claim are repeats of the same Events, which the recorder counts into their
series.

A status write the API server refuses (a 4xx that trying again cannot change) leaves a
Warning Event on the claim: the pod runs, its claim just lacks our ``status.devices``
entries, and the claim is where a user looking for them looks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rdma_hca.contract.dra import GROUP_VERSION
from rdma_hca.contract.hcaconfig import KIND, HcaConfigError
from rdma_hca.daemon.dra.claims import ClaimRef
from rdma_hca.kube.eventbody import WARNING, EventSpec, ObjectRef
from rdma_hca.kube.events import EventRecorder

PREPARE_FAILED = "ClaimPrepareFailed"
ACTION = "PrepareResourceClaim"
STATUS_REFUSED = "ClaimStatusRefused"
STATUS_ACTION = "WriteResourceClaimStatus"
KNOWN = 1024  # claims whose Pods are remembered

# What to do, by what the error says (the first that matches); the last one always does.
_FIXES: tuple[tuple[tuple[str, ...], str], ...] = (
    ((KIND,), HcaConfigError.fix),
    (("no longer on this node",),
     "the HCA left this node after the claim was allocated; the node's Events "
     "(HcaDeviceGone, HcaPortDown) say why. Delete the pod so the scheduler allocates "
     "another device"),
    (("cannot be used",),
     "the HCA is on the node but not usable (its problem is above); fix the HCA, or delete "
     "the pod so the scheduler allocates another device"),
    (("was deleted and created again",),
     "the claim was re-created; delete the pod so it is scheduled with the new claim"),
    (("allocated from pool", "has no device of driver"),
     "the claim was not allocated on this node for this driver; delete the pod so the "
     "scheduler allocates it again"),
    (("another instance of the driver",),
     "a rolling update of the driver is under way; the kubelet tries again, nothing to do "
     "unless it lasts"),
    (("cannot write the CDI spec",),
     "the node's CDI directory cannot be written; check the disk and the driver's "
     "cdi mount, then the kubelet tries again"),
    (("HTTP 403", "forbidden"),
     "the driver may not read the claim: give its service account get on "
     "resourceclaims (the chart does)"),
    (("API server", "HTTP "),
     "the driver could not read the claim from the API server; the kubelet tries again. "
     "If it lasts, check the API server and the driver's log"),
    ((), "see the log of the RDMA HCA driver on this node"),
)


def prepare_fix(error: str) -> str:
    for needles, fix in _FIXES:
        if not needles or any(n in error for n in needles):
            return fix
    return _FIXES[-1][1]


def reserved_pods(claim: Mapping[str, Any], namespace: str) -> tuple[ObjectRef, ...]:
    """The Pods of ``status.reservedFor`` (other consumers are not Pods)."""
    status = claim.get("status") or {}
    out = []
    for r in status.get("reservedFor") or [] if isinstance(status, dict) else []:
        if isinstance(r, dict) and r.get("resource") == "pods" and not r.get("apiGroup") \
                and r.get("name"):
            out.append(ObjectRef("Pod", str(r["name"]), namespace, str(r.get("uid") or "")))
    return tuple(out)


class ClaimEvents:
    """``prepare_failed(ref, error, claim)`` is the claim keeper's hook: it never waits."""

    def __init__(self, recorder: EventRecorder, node: str) -> None:
        self.recorder = recorder
        self.node = node
        self._pods: dict[str, tuple[ObjectRef, ...]] = {}  # claim UID -> its Pods

    def prepare_failed(self, ref: ClaimRef, error: str,
                       claim: Mapping[str, Any] | None = None) -> None:
        if claim is not None and (claim.get("metadata") or {}).get("uid") == ref.uid:
            if len(self._pods) >= KNOWN and ref.uid not in self._pods:
                self._pods.pop(next(iter(self._pods)))
            self._pods[ref.uid] = reserved_pods(claim, ref.namespace)
        pods = self._pods.get(ref.uid, ())
        about = ObjectRef("ResourceClaim", ref.name, ref.namespace, ref.uid, GROUP_VERSION)
        note = (f"claim {ref.namespace}/{ref.name} was not prepared on node {self.node}: "
                f"{error}. To fix: {prepare_fix(error)}")
        for pod in pods:
            self.recorder.record(EventSpec(pod, PREPARE_FAILED, note, type=WARNING,
                                           action=ACTION, related=about))
        self.recorder.record(EventSpec(about, PREPARE_FAILED, note, type=WARNING,
                                       action=ACTION))

    def status_refused(self, ref: ClaimRef, error: str) -> None:
        about = ObjectRef("ResourceClaim", ref.name, ref.namespace, ref.uid, GROUP_VERSION)
        fix = ("give the driver's service account patch on resourceclaims/status and (1.36) "
               "associated-node:patch on resourceclaims/driver (the chart does)"
               if "HTTP 403" in error else
               "the pod runs without it; the driver's log says more, and a report of this "
               "error to the driver's maintainers helps")
        note = (f"the status.devices entries of claim {ref.namespace}/{ref.name} on node "
                f"{self.node} were refused by the API server: {error}. To fix: {fix}")
        self.recorder.record(EventSpec(about, STATUS_REFUSED, note, type=WARNING,
                                       action=STATUS_ACTION))
