"""The helper: sockets, services, fetching and serialization around the driver proper.

What the upstream kubelet plugin helper's ``Start`` composes. The kubelet's calls come
in through the services; the helper reads and checks the claims the driver's record does
not hold (a claim on record needs no API read, as its record says what it was given),
takes the batch's locks and calls the driver once per call
(:class:`~rdma_hca.daemon.dra.kubeletplugin.plugin.DriverPlugin`, whose docstring tells
the seam). Beside another instance (a rolling update) any claim may be on the shared
record, so there the driver reads the claim, through the helper's ``fetch``, under its
lock, when the record does not have it.
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
from rdma_hca.daemon.dra.kubeletplugin.plugin import (
    UNKNOWN_FIX,
    DriverPlugin,
    FetchClaim,
    PreparedView,
    PrepareResult,
)
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
# One claim's Prepare: a cached answer (its locks, no file or API call) well under a
# millisecond, an API read and two file writes in milliseconds, a lock held by another
# instance or a slow API server in seconds.
PREPARE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0)

# Told of each claim not prepared (the claim, the error, its fix, the object when it was
# read); must not wait.
PrepareFailed = Callable[[ClaimRef, str, str, Mapping[str, Any] | None], None]


class HelperApi(SliceClient, ClaimReader, Protocol):
    """What the helper asks of the API server: the node's slices and the claims."""


@dataclass(frozen=True, slots=True)
class HelperParts:
    """The helper's collaborators, built before it."""

    plugin: DriverPlugin  # the driver proper
    prepared: PreparedView  # the driver's record, read only
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
        self._prepared = parts.prepared
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
        """Each claim's result by UID: the claims not on the driver's record read and
        checked, their locks taken, and the driver called once for the batch."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        unique = list({r.uid: r for r in refs}.values())
        read: dict[str, Claim] = {}  # what was read of each claim, for its Event
        owned: list[ClaimRef] = []  # reads this call started: shared until it answers

        async def fetch(ref: ClaimRef) -> Claim:
            pending = self._reads.get(ref)
            if pending is None:
                pending = self._reads[ref] = asyncio.ensure_future(fetch_claim(self._api, ref))
                owned.append(ref)
            # Shielded: one caller given up on does not take the read from the others.
            claim = read[ref.uid] = await asyncio.shield(pending)
            check_claim(claim, ref, self.options.driver_name)
            return claim

        try:
            results = await self._prepare_batch(unique, fetch)
        finally:
            # A call that came meanwhile shared the read, then found the claim prepared.
            for ref in owned:
                del self._reads[ref]
        took = loop.time() - started
        for ref in unique:
            result = results[ref.uid]
            self.prepare_seconds.observe(took)
            self.prepare_results["error" if result.error else "ok"] += 1
            if result.error:
                self._failed(ref, result, read.get(ref.uid))
        return {r.uid: results[r.uid] for r in unique}

    async def _prepare_batch(self, unique: Sequence[ClaimRef],
                             fetch: FetchClaim) -> dict[str, PrepareResult]:
        """Read what the record does not hold, take the locks, call the driver once."""

        results: dict[str, PrepareResult] = {}
        ready: list[Claim | ClaimRef] = []
        # The claims on record need no read: no task of their own.
        held = [r for r in unique if self._prepared.holds(r.uid)]
        to_read = [r for r in unique if not self._prepared.holds(r.uid)]
        found: list[Claim | ClaimRef | BaseException] = list(held)
        if to_read:
            found += await asyncio.gather(*(fetch(r) for r in to_read), return_exceptions=True)
        for ref, got in zip([*held, *to_read], found, strict=True):
            if isinstance(got, Exception):
                results[ref.uid] = PrepareResult.failed(got)
            elif isinstance(got, BaseException):
                raise got
            else:
                ready.append(got)
        if ready:
            async with self.locks.held_all(c.uid for c in ready) as busy:
                for uid, exc in busy.items():
                    results[uid] = PrepareResult.failed(exc)
                locked = [c for c in ready if c.uid not in busy]
                if locked:
                    try:
                        answers = await self._plugin.prepare_claims(locked, fetch)
                    except Exception as exc:
                        answers = {c.uid: PrepareResult.failed(exc) for c in locked}
                    for c in locked:
                        results[c.uid] = answers.get(c.uid) or PrepareResult(
                            error="the driver gave no answer for this claim", fix=UNKNOWN_FIX)
        return results

    def _failed(self, ref: ClaimRef, result: PrepareResult, claim: Claim | None) -> None:
        log.warning("claim %s/%s (%s) not prepared: %s", short_repr(ref.namespace),
                    short_repr(ref.name), short_repr(ref.uid), result.error,
                    extra={"claim": claim_field(ref)})
        if self._on_prepare_failed is not None:
            self._on_prepare_failed(ref, result.error, result.fix,
                                    claim.source if claim is not None else None)

    # --- unprepare --------------------------------------------------------------------

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Each claim's error by UID ("" when done): their locks taken, and the driver
        called once for the batch."""
        unique = list({r.uid: r for r in refs}.values())
        errors: dict[str, str] = {}
        async with self.locks.held_all(r.uid for r in unique) as busy:
            locked = [r for r in unique if r.uid not in busy]
            try:
                answers = await self._plugin.unprepare_claims(locked) if locked else {}
            except Exception as exc:
                busy.update({r.uid: exc for r in locked})
                answers = {}
            for ref in unique:
                why = busy.get(ref.uid)
                if why is not None:
                    log.warning("claim %s/%s (%s) not unprepared: %s", short_repr(ref.namespace),
                                short_repr(ref.name), short_repr(ref.uid), why,
                                extra={"claim": claim_field(ref)})
                    errors[ref.uid] = f"cannot remove the CDI spec or the checkpoint entry: {why}"
                else:
                    errors[ref.uid] = answers.get(ref.uid, "the driver gave no answer for this "
                                                           "claim")
        for e in errors.values():
            self.unprepare_results["error" if e else "ok"] += 1
        return errors
