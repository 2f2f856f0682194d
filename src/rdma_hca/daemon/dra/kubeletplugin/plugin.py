"""The seam between the helper and the driver proper: the one thing the driver implements.

One call per batch each way, as upstream's ``PrepareResourceClaims`` and
``UnprepareResourceClaims``. For a Prepare the helper

1. asks the driver's record, a read-only :class:`PreparedView` the driver hands it at
   construction, whether it ``holds`` each claim; the claims it does not hold are read
   from the API server and checked before their lock (a claim in two calls at once is
   read once), so a claim on record costs no API read (after a restart the API server
   may be down while the kubelet prepares its running pods again);
2. takes the locks of the batch's claims, here and across instances;
3. calls :meth:`DriverPlugin.prepare_claims` once, with each claim as read
   (:class:`~rdma_hca.daemon.dra.claims.Claim`) or, when on record, as the kubelet named
   it (:class:`~rdma_hca.daemon.dra.claims.ClaimRef`), and ``fetch``, the helper's read
   and check, for a claim whose record is gone by the time the driver looks under its
   lock (beside another instance, which may have unprepared it).

The driver decides its own fast path inside that call: a claim it prepared and verified
is answered from memory, one on the record (its own after a restart, or another
instance's during a rolling update) from the record. It never reads the helper's state,
and the helper never reads the driver's files or checkpoint.

A claim not prepared carries its error and what its user does about it (``fix``), both
from the exception raised where the problem was found (:class:`ClaimError` and its
kinds); the helper puts them in the claim's ``ClaimPrepareFailed`` Event.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from rdma_hca.contract.checkpoint import PreparedDevice
from rdma_hca.daemon.dra.claims import Claim, ClaimError, ClaimRef

# The fix of a failure no kind of ClaimError names (a stalled disk, a bug).
UNKNOWN_FIX = "see the log of the RDMA HCA driver on this node"

# The helper's read of a claim, checked (raises ClaimError when it cannot be prepared here).
FetchClaim = Callable[[ClaimRef], Awaitable[Claim]]


@dataclass(frozen=True, slots=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
    fix: str = ""  # with an error: what the claim's user does about it

    @classmethod
    def failed(cls, exc: Exception) -> PrepareResult:
        """The answer for a claim whose Prepare raised ``exc``."""
        fix = exc.fix if isinstance(exc, ClaimError) else UNKNOWN_FIX
        return cls(error=str(exc) or type(exc).__name__, fix=fix)


class PreparedView(Protocol):
    """What the helper may ask of the driver's record: nothing it can change."""

    def holds(self, uid: str) -> bool:
        """The claim is, or (beside another instance) may be, on the record: the driver
        can answer it without the claim, so the helper does not read it first."""


class DriverPlugin(Protocol):
    """Prepare and unprepare; the helper holds the lock of each claim it passes."""

    async def prepare_claims(self, claims: Sequence[Claim | ClaimRef],
                             fetch: FetchClaim) -> Mapping[str, PrepareResult]:
        """Each claim's result by UID, every claim answered."""

    async def unprepare_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """Each claim's error by UID, "" when done."""
