"""Why a claim was not prepared, where its user looks: a Warning Event about the Pod the
claim is reserved for (``kubectl describe pod``) and one about the claim, each with the
error and what to do about it.

The Pod comes from the claim's ``status.reservedFor``, read through the recorder's own
client (its budget, not the driver's), once per claim: the kubelet's retries of one claim
are repeats of the same Events, which the recorder counts into their series.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rdma_hca.daemon.dra.claims import ClaimRef
from rdma_hca.daemon.dra.kubeapi import GROUP_VERSION, claim_path
from rdma_hca.kube.errors import KubeError
from rdma_hca.kube.eventbody import WARNING, EventSpec, ObjectRef
from rdma_hca.kube.events import EventRecorder

log = logging.getLogger(__name__)

PREPARE_FAILED = "ClaimPrepareFailed"
ACTION = "PrepareResourceClaim"
LOOKUPS = 8  # claims whose Pods are being looked up at once; more: Events on the claim only
KNOWN = 1024  # claims whose Pods are remembered

# What to do, by what the error says (the first that matches); the last one always does.
_FIXES: tuple[tuple[tuple[str, ...], str], ...] = (
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


def reserved_pods(claim: dict[str, Any], namespace: str) -> tuple[ObjectRef, ...]:
    """The Pods of ``status.reservedFor`` (other consumers are not Pods)."""
    status = claim.get("status") or {}
    out = []
    for r in status.get("reservedFor") or [] if isinstance(status, dict) else []:
        if isinstance(r, dict) and r.get("resource") == "pods" and not r.get("apiGroup") \
                and r.get("name"):
            out.append(ObjectRef("Pod", str(r["name"]), namespace, str(r.get("uid") or "")))
    return tuple(out)


class ClaimEvents:
    """``prepare_failed(ref, error)`` is the claim keeper's hook: it never waits."""

    def __init__(self, recorder: EventRecorder, node: str) -> None:
        self.recorder = recorder
        self.node = node
        self._pods: dict[str, tuple[ObjectRef, ...]] = {}  # claim UID -> its Pods
        self._waiting: dict[str, list[tuple[ClaimRef, str]]] = {}  # UID -> failures
        self._lookups: set[asyncio.Task[None]] = set()

    def prepare_failed(self, ref: ClaimRef, error: str) -> None:
        pods = self._pods.get(ref.uid)
        if pods is not None:
            self._record(ref, pods, error)
        elif ref.uid in self._waiting:
            self._waiting[ref.uid].append((ref, error))
        elif len(self._lookups) >= LOOKUPS:
            self._record(ref, (), error)
        else:
            self._waiting[ref.uid] = [(ref, error)]
            task = asyncio.create_task(self._look_up(ref), name="events-claim-pods")
            self._lookups.add(task)
            task.add_done_callback(self._lookups.discard)

    async def close(self) -> None:
        tasks = list(self._lookups)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _look_up(self, ref: ClaimRef) -> None:
        pods: tuple[ObjectRef, ...] = ()
        try:
            claim = await self.recorder.client.request("GET", claim_path(ref.namespace,
                                                                          ref.name))
            if (claim.get("metadata") or {}).get("uid") == ref.uid:
                pods = reserved_pods(claim, ref.namespace)
            if len(self._pods) >= KNOWN:
                self._pods.pop(next(iter(self._pods)))
            self._pods[ref.uid] = pods
        except KubeError as exc:
            # Not remembered: the next failure of the claim looks again.
            log.debug("the Pods of claim %s/%s are not known (%s): its Event is on the "
                      "claim only", ref.namespace, ref.name, exc)
        finally:
            waiting = self._waiting.pop(ref.uid, [])
        for r, error in waiting:
            self._record(r, pods, error)

    def _record(self, ref: ClaimRef, pods: tuple[ObjectRef, ...], error: str) -> None:
        claim = ObjectRef("ResourceClaim", ref.name, ref.namespace, ref.uid, GROUP_VERSION)
        note = (f"claim {ref.namespace}/{ref.name} was not prepared on node {self.node}: "
                f"{error}. To fix: {prepare_fix(error)}")
        for pod in pods:
            self.recorder.record(EventSpec(pod, PREPARE_FAILED, note, type=WARNING,
                                           action=ACTION, related=claim))
        self.recorder.record(EventSpec(claim, PREPARE_FAILED, note, type=WARNING,
                                       action=ACTION))
