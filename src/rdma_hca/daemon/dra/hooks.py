"""What runs after a claim's call answered: its status entries, through hooks.

A hook runs after the claim's earlier hooks, in a task of its own, so the kubelet's call
never waits for it; a failing hook never fails the call and is said once per reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from rdma_hca.contract.checkpoint import PreparedDevice
from rdma_hca.daemon.dra.claims import Claim, ClaimRef
from rdma_hca.kit.aio import cancel_all
from rdma_hca.kit.sayonce import Once

log = logging.getLogger(__name__)

CLOSE_WAIT = 1.0

# The claim as the kubelet named it, what it was given, and the claim as Prepare read it
# (the status writer's ``on_prepared``).
PreparedHook = Callable[[ClaimRef, tuple[PreparedDevice, ...], Claim], Awaitable[None]]
UnpreparedHook = Callable[[ClaimRef], Awaitable[None]]


class ClaimHooks:
    """``prepared``/``unprepared`` start the hooks given at construction (none: nothing)."""

    def __init__(self, on_prepared: PreparedHook | None = None,
                 on_unprepared: UnpreparedHook | None = None) -> None:
        self._on_prepared = on_prepared
        self._on_unprepared = on_unprepared
        self._hooks: dict[str, asyncio.Task[None]] = {}
        self._said = Once()
        self.failures = 0

    def prepared(self, claim: Claim, devices: tuple[PreparedDevice, ...]) -> None:
        hook = self._on_prepared
        if hook is not None:
            self._run(claim.uid, "on_prepared", lambda: hook(claim.ref, devices, claim))

    def unprepared(self, ref: ClaimRef) -> None:
        hook = self._on_unprepared
        if hook is not None:
            self._run(ref.uid, "on_unprepared", lambda: hook(ref))

    async def done(self) -> None:
        """Wait until every hook started so far has run (tests, a clean stop)."""
        while self._hooks:
            await asyncio.wait(list(self._hooks.values()))

    async def close(self) -> None:
        await cancel_all(list(self._hooks.values()), within=CLOSE_WAIT, what="the claims' hooks")

    def _run(self, uid: str, what: str, call: Callable[[], Awaitable[None]]) -> None:
        before = self._hooks.get(uid)

        async def run() -> None:
            if before is not None:
                await asyncio.wait({before})
            try:
                await call()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                reason = f"{what}: {type(exc).__name__}: {exc}"
                if self._said.first(reason):
                    log.warning("claim %s: the %s hook failed (%s); the claim stays prepared",
                                uid, what, reason)
            finally:
                if self._hooks.get(uid) is task:
                    del self._hooks[uid]

        task = asyncio.create_task(run(), name=f"dra-{what}-{uid}")
        self._hooks[uid] = task
