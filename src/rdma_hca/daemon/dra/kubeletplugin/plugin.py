"""The seam between the helper and the driver proper: the one thing the driver implements.

The helper calls the driver with typed claims it has fetched and checked already, each
under the claim's lock, and never reads the driver's files or checkpoint itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from rdma_hca.contract.checkpoint import PreparedDevice
from rdma_hca.daemon.dra.claims import Claim, ClaimRef


@dataclass(frozen=True, slots=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class DriverPlugin(Protocol):
    """Prepare and unprepare; the helper serializes each claim's calls."""

    def answered(self, uid: str) -> PrepareResult | None:
        """The answer for a claim this instance prepared and verified: no lock, file or API
        call needed. None when the claim must go through :meth:`prepare`."""

    def recorded(self, uid: str) -> bool:
        """The claim is, or may be, on the driver's record: :meth:`prepare` may work from
        the record alone, so the helper does not fetch the claim first (it does, under the
        claim's lock, when :meth:`prepare` finds no record)."""

    async def prepare(self, claims: Sequence[Claim | ClaimRef]) -> Mapping[str, PrepareResult]:
        """Each claim's result by UID. A :class:`ClaimRef` (a claim on record) whose record
        is gone meanwhile is left out of the answer: the helper fetches it and asks again."""

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """Each claim's error by UID, "" when done."""
