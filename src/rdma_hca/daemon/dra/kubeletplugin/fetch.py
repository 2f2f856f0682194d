"""Fetching a claim and checking it, before the claim's lock is taken.

As the upstream helper does: the slow API read comes before serializing, so a claim
waiting for its lock does not also wait for the API server, and a claim that cannot be
prepared here (deleted and created again, not allocated to this driver) is refused
without taking a lock at all. Each refusal is a :class:`ClaimError` of its own kind,
carrying what its user does about it.
"""

from __future__ import annotations

from typing import Any, Protocol

from rdma_hca.daemon.dra.claims import (
    Claim,
    ClaimError,
    ClaimRef,
    NotAllocatedHere,
    parse_claim,
)
from rdma_hca.kube.errors import KubeError

FORBIDDEN = 403


class ClaimRecreated(ClaimError):
    fix = "the claim was re-created; delete the pod so it is scheduled with the new claim"


class ClaimUnreadable(ClaimError):
    fix = ("the driver could not read the claim from the API server; the kubelet tries "
           "again. If it lasts, check the API server and the driver's log")


class ClaimForbidden(ClaimUnreadable):
    fix = ("the driver may not read the claim: give its service account get on "
           "resourceclaims (the chart does)")


class ClaimReader(Protocol):
    """The part of the driver's API client that reads claims."""

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...


async def fetch_claim(api: ClaimReader, ref: ClaimRef) -> Claim:
    """The claim the kubelet names, parsed; :func:`check_claim` it before use."""
    try:
        obj = await api.get_claim(ref.namespace, ref.name)
    except KubeError as exc:
        kind = ClaimForbidden if exc.status == FORBIDDEN else ClaimUnreadable
        raise kind(f"cannot read ResourceClaim {ref.namespace}/{ref.name} from the API "
                   f"server: {exc}") from exc
    try:
        return parse_claim(obj)
    except ClaimError as exc:
        raise ClaimUnreadable(str(exc)) from exc


def check_claim(claim: Claim, ref: ClaimRef, driver: str) -> None:
    """Raise :class:`ClaimError` unless the claim is the one asked for and is allocated
    devices of this driver."""
    if claim.uid != ref.uid:
        raise ClaimRecreated(f"ResourceClaim {ref.namespace}/{ref.name} has UID {claim.uid}, "
                             f"not {ref.uid}: it was deleted and created again")
    if not claim.allocated:
        raise NotAllocatedHere(f"ResourceClaim {claim.namespace}/{claim.name} is not allocated "
                               f"yet, so it has no device of driver {driver} allocated")
    if not claim.of(driver):
        raise NotAllocatedHere(f"ResourceClaim {claim.namespace}/{claim.name} has no device of "
                               f"driver {driver} allocated")
