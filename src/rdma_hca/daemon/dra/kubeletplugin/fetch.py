"""Fetching a claim and checking it, before the claim's lock is taken.

As the upstream helper does: the slow API read comes before serializing, so a claim
waiting for its lock does not also wait for the API server, and a claim that cannot be
prepared here (deleted and created again, not allocated to this driver) is refused
without taking a lock at all.
"""

from __future__ import annotations

from typing import Any, Protocol

from rdma_hca.daemon.dra.claims import Claim, ClaimError, ClaimRef, parse_claim


class ClaimReader(Protocol):
    """The part of the driver's API client that reads claims."""

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...


async def fetch_claim(api: ClaimReader, ref: ClaimRef) -> Claim:
    """The claim the kubelet names, parsed; :func:`check_claim` it before use."""
    return parse_claim(await api.get_claim(ref.namespace, ref.name))


def check_claim(claim: Claim, ref: ClaimRef, driver: str) -> None:
    """Raise :class:`ClaimError` unless the claim is the one asked for and is allocated
    devices of this driver."""
    if claim.uid != ref.uid:
        raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name} has UID {claim.uid}, "
                         f"not {ref.uid}: it was deleted and created again")
    if not claim.allocated:
        raise ClaimError(f"ResourceClaim {claim.namespace}/{claim.name} is not allocated yet, "
                         f"so it has no device of driver {driver} allocated")
    if not claim.of(driver):
        raise ClaimError(f"ResourceClaim {claim.namespace}/{claim.name} has no device of "
                         f"driver {driver} allocated")
