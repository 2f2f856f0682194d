"""The helper: sockets, services, fetching and serialization around the driver proper.

What the upstream kubelet plugin helper's ``Start`` composes. The kubelet's calls come
in through the services; each claim is fetched from the API server and checked first,
then handed to the driver (:class:`~rdma_hca.daemon.dra.kubeletplugin.plugin.DriverPlugin`)
under its lock. A claim this instance prepared and verified answers at once, with no
lock, file or API call; a claim on the driver's record (after a restart, or written by
another instance) needs no API read either, as its record says what it was given. Beside
another instance (a rolling update) any claim may be on the shared record, so there the
claim is read under its lock, when the record does not have it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from rdma_hca.daemon.dra.claims import Claim, ClaimRef, claim_field
from rdma_hca.daemon.dra.kubeletplugin.fetch import ClaimReader, check_claim, fetch_claim
from rdma_hca.daemon.dra.kubeletplugin.health import HealthBoard, add_health_services
from rdma_hca.daemon.dra.kubeletplugin.options import DraConfigError, HelperOptions
from rdma_hca.daemon.dra.kubeletplugin.plugin import DriverPlugin, PrepareResult
from rdma_hca.daemon.dra.kubeletplugin.serialize import ClaimLocks, RecordLocks
from rdma_hca.daemon.dra.kubeletplugin.services import add_dra_services
from rdma_hca.daemon.dra.kubeletplugin.sockets import KubeletSockets, SocketInUse
from rdma_hca.daemon.dra.resourceslice.publisher import DesiredDevices, SliceClient, SlicePublisher
from rdma_hca.kit.aio import cancel_all
from rdma_hca.kit.histogram import Histogram
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kit.text import short_repr

log = logging.getLogger(__name__)

STOP_WAIT = 1.0
# One claim's Prepare: a cached answer in microseconds, an API read and two file writes in
# milliseconds, a lock held by another instance or a slow API server in seconds.
PREPARE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0)

# Told of each claim not prepared (the claim, the error, the object when it was read);
# must not wait.
PrepareFailed = Callable[[ClaimRef, str, Mapping[str, Any] | None], None]


class HelperApi(SliceClient, ClaimReader, Protocol):
    """What the helper asks of the API server: the node's slices and the claims."""


@dataclass(frozen=True, slots=True)
class HelperParts:
    """The helper's collaborators, built before it."""

    plugin: DriverPlugin  # the driver proper
    api: HelperApi
    records: RecordLocks  # the claims' record locks, shared by every instance on the node
    io: OffLoop  # blocking file work, off the loop
    desired: DesiredDevices  # the devices offered at start, for the slice publisher
    board: HealthBoard  # the devices' health, for the health streams
    on_prepare_failed: PrepareFailed | None = None


class Helper:
    """``await start()``, then the kubelet's calls; ``await stop()``."""

    def __init__(self, options: HelperOptions, parts: HelperParts) -> None:
        self.options = options
        self._plugin = parts.plugin
        self._api = parts.api
        self._on_prepare_failed = parts.on_prepare_failed
        self.board = parts.board
        self.locks = ClaimLocks(parts.records, parts.io, wait=options.lock_wait,
                                lock_path=options.lock_path)
        self.sockets = KubeletSockets(options.sockets, self._add_services, self._on_registered)
        self.publisher = SlicePublisher(parts.api, options.driver_name, options.node_name,
                                        options.pool_name, desired=parts.desired,
                                        taints=options.device_taints,
                                        resync=options.resync_seconds,
                                        start_jitter=options.start_jitter_seconds)
        # Outcomes per claim, for /metrics: the kubelet's gRPC metrics see one OK call
        # for an answer that carries an error for a claim inside it.
        self.prepare_results = {"ok": 0, "error": 0}
        self.unprepare_results = {"ok": 0, "error": 0}
        self.prepare_seconds = Histogram(PREPARE_BUCKETS)
        self._tasks: list[asyncio.Task[None]] = []
        # Reads of a claim, shared by the calls that ask for it while one is working on it:
        # a claim in two calls at once is read once.
        self._reads: dict[ClaimRef, asyncio.Future[Claim]] = {}

    def _add_services(self, server: grpc.aio.Server) -> None:
        add_dra_services(server, self)
        add_health_services(server, self.board, self.options.health_resend_seconds)

    def _on_registered(self) -> None:
        # A starting kubelet deleted this node's slices: look at the server's copy again.
        self.publisher.check()

    def publish(self, desired: DesiredDevices) -> None:
        """The devices offered from now on (upstream's ``PublishResources``); written
        when they changed."""
        self.publisher.update(desired)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The helper's running tasks, for the daemon's supervisor."""
        return [*self._tasks, *self.sockets.tasks]

    # --- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self.sockets.start()
        except SocketInUse as exc:  # another instance serves our sockets: exit status 2
            raise DraConfigError(str(exc)) from None
        self._tasks = [asyncio.create_task(self.publisher.run(), name="dra-publish")]

    async def stop(self) -> None:
        """Stop serving and remove our sockets; the slice stays (the kubelet wipes it later).

        Bounded: a task that does not end within STOP_WAIT is left behind (and named),
        so SIGTERM always ends with the sockets removed.
        """
        tasks, self._tasks = self._tasks, []
        await cancel_all(tasks, within=STOP_WAIT, what="the DRA driver's tasks")
        await self.sockets.stop()

    # --- prepare ----------------------------------------------------------------------

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """Each claim's result by UID; the claims are read and written concurrently."""
        unique = list({r.uid: r for r in refs}.values())
        results = await asyncio.gather(*(self._prepare(r) for r in unique))
        return {r.uid: res for r, res in zip(unique, results, strict=True)}

    async def _prepare(self, ref: ClaimRef) -> PrepareResult:
        started = asyncio.get_running_loop().time()
        result = await self._prepare_one(ref)
        self.prepare_seconds.observe(asyncio.get_running_loop().time() - started)
        self.prepare_results["error" if result.error else "ok"] += 1
        return result

    async def _prepare_one(self, ref: ClaimRef) -> PrepareResult:
        answer = self._plugin.answered(ref.uid)
        if answer is not None:
            return answer
        claim: Claim | None = None
        owner = False  # this call reads the claim, for the calls that come meanwhile too
        try:
            if not self._plugin.recorded(ref.uid):
                read = self._reads.get(ref)
                if read is None:
                    read = self._reads[ref] = asyncio.ensure_future(fetch_claim(self._api, ref))
                    owner = True
                # Shielded: one caller given up on does not take the read from the others.
                claim = await asyncio.shield(read)
                check_claim(claim, ref, self.options.driver_name)
            async with self.locks.held(ref.uid):
                result = (await self._plugin.prepare([claim or ref])).get(ref.uid)
                if result is None:
                    # Not on the record after all (beside another instance every claim is
                    # looked up there first): the claim is read now, under its lock.
                    claim = await fetch_claim(self._api, ref)
                    check_claim(claim, ref, self.options.driver_name)
                    result = (await self._plugin.prepare([claim]))[ref.uid]
        except Exception as exc:
            result = PrepareResult(error=str(exc) or type(exc).__name__)
        finally:
            if owner:
                del self._reads[ref]
        if result.error:
            log.warning("claim %s/%s (%s) not prepared: %s", short_repr(ref.namespace),
                        short_repr(ref.name), short_repr(ref.uid), result.error,
                        extra={"claim": claim_field(ref)})
            if self._on_prepare_failed is not None:
                self._on_prepare_failed(ref, result.error,
                                        claim.source if claim is not None else None)
        return result

    # --- unprepare --------------------------------------------------------------------

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Each claim's error by UID ("" when done); concurrently, like ``prepare``."""
        unique = list({r.uid: r for r in refs}.values())
        errors = await asyncio.gather(*(self._unprepare(r) for r in unique))
        for e in errors:
            self.unprepare_results["error" if e else "ok"] += 1
        return {r.uid: e for r, e in zip(unique, errors, strict=True)}

    async def _unprepare(self, ref: ClaimRef) -> str:
        try:
            async with self.locks.held(ref.uid):
                return (await self._plugin.unprepare([ref]))[ref.uid]
        except Exception as exc:
            log.warning("claim %s/%s (%s) not unprepared: %s", short_repr(ref.namespace),
                        short_repr(ref.name), short_repr(ref.uid), exc,
                        extra={"claim": claim_field(ref)})
            return f"cannot remove the CDI spec or the checkpoint entry: {exc}"
