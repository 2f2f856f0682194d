"""The prepared claims: one owner for what this instance holds prepared.

The claims in memory, the checkpoint they are kept in (written through the group
commit, which lives here), the versions of it the follower brings in from another
instance, and which claims' CDI specs this process has seen on disk: all of it is this
object's, changed only through its methods. Its lock is the event loop: each method
reads and changes the claims in memory without awaiting in between, and the file is
changed only as a read-modify-write under the checkpoint's file lock. Everyone else
(the helper, the status writer, the metrics) reads it as a mapping.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from rdma_hca.contract.checkpoint import Claims, PreparedClaim
from rdma_hca.daemon.dra.checkpoint import Checkpoint
from rdma_hca.daemon.dra.groupcommit import Files, GroupCommit, Staging
from rdma_hca.kit.offloop import OffLoop


class PreparedClaims(Mapping[str, PreparedClaim]):
    """The claims prepared, by UID; ``shared``: another instance may write the checkpoint
    too (a rolling update is possible), so the file, not memory, is the record."""

    def __init__(self, checkpoint: Checkpoint, io: OffLoop, recovered: Claims, *,
                 shared: bool) -> None:
        self.checkpoint = checkpoint
        self.shared = shared
        self._io = io
        self._claims: Claims = dict(recovered)
        self._verified: set[str] = set()  # claims whose spec this process wrote or saw
        self.commits = GroupCommit(checkpoint, io.run, lambda: self._claims)
        self.foreign_writes = 0  # checkpoint versions written by another instance seen

    # --- read only --------------------------------------------------------------------

    def __getitem__(self, uid: str) -> PreparedClaim:
        return self._claims[uid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._claims)

    def __len__(self) -> int:
        return len(self._claims)

    def holds(self, uid: str) -> bool:
        """The claim is on the record, or (shared) may be: it is looked up there under its
        lock, and the claim read only when it is not there."""
        return self.shared or uid in self._claims

    def verified(self, uid: str) -> PreparedClaim | None:
        """The claim, when this process prepared it or saw its spec and nothing since
        says otherwise: answered with no file read."""
        return self._claims.get(uid) if uid in self._verified else None

    # --- changes ----------------------------------------------------------------------

    async def look_up(self, uid: str) -> PreparedClaim | None:
        """The claim's record now; call it under the claim's lock. Shared, the file is
        read again: the other instance may have prepared or unprepared it meanwhile."""
        if not self.shared:
            return self._claims.get(uid)
        on_disk, _ = await self._io.run(f"reading the checkpoint {self.checkpoint.path}",
                                        self.checkpoint.read)
        known = on_disk.get(uid)
        if known is None:
            self._claims.pop(uid, None)
            self._verified.discard(uid)
        else:
            self._claims[uid] = known
        return known

    def verify(self, uid: str) -> None:
        """The claim's spec is on disk as its record says."""
        if uid in self._claims:
            self._verified.add(uid)

    async def add(self, uid: str, claim: PreparedClaim, files: Files | None = None, *,
                  staging: Staging | None = None,
                  unless_recorded: bool = False) -> PreparedClaim | None:
        """Record a claim just prepared: once its entry is durable (in the group commit's
        batch of its moment, ``files`` written just before it, ``staging`` flushed
        meanwhile), it is known and verified.
        ``unless_recorded``: when the file, read under its lock, holds the claim already
        (another instance prepared it before this one took the claim's lock), nothing is
        written and that entry is returned (known, its spec not yet seen)."""

        def record(claims: Claims) -> PreparedClaim | None:
            claims[uid] = claim
            return None

        found = await self.commits.apply(
            record, files, staging=staging,
            unless=(lambda claims: claims.get(uid)) if unless_recorded else None)
        if found is not None:
            self._claims[uid] = found
            return found
        self._claims[uid] = claim
        self._verified.add(uid)
        return None

    async def remove(self, uid: str) -> bool:
        """Drop a claim's entry; True when it was on the record (here, or shared)."""
        was = False
        if uid in self._claims or self.shared:
            was = await self.commits.apply(lambda claims: claims.pop(uid, None) is not None)
        had = self._claims.pop(uid, None) is not None
        self._verified.discard(uid)
        return had or was

    def followed(self, claims: Claims | None, foreign: bool) -> None:
        """A version of the checkpoint from the follower (None: unreadable), and whether
        another instance wrote it."""
        if foreign:
            # What this instance prepared may have been unprepared by the other one.
            self.foreign_writes += 1
            self._verified.clear()
        if claims is not None:
            self._claims = dict(claims)
