"""The DRA driver: the kubelet plugin helper and the driver proper, composed.

Composition only, as dranet's ``driver.go``: the helper (``kubeletplugin/``) owns the
sockets, the services, fetching and serializing claims and publishing the node's slice;
the driver proper prepares claims into CDI specs (``prepare.py``) on the record of the
prepared claims (``prepared.py``, which owns the checkpoint, recovered by ``recovery.py``
and followed by ``follow.py``) and offers the node's devices (``offering.py``). Each part
is handed the parts it uses when it is built; none calls back into this module. Whatever
needs the API client is built in :meth:`DraDriver.start`, on the client as soon as its
credentials are read: the kubelet is registered with while its HTTP stack and TLS context
are built off the loop, and calls made meanwhile wait for them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from rdma_hca.contract.checkpoint import PreparedClaim
from rdma_hca.contract.fabric import PortNeighbour
from rdma_hca.daemon.dra.checkpoint import Checkpoint
from rdma_hca.daemon.dra.claimevents import ClaimEvents
from rdma_hca.daemon.dra.claimstatus import ClaimStatusWriter
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.follow import CheckpointFollower
from rdma_hca.daemon.dra.hooks import ClaimHooks, PreparedHook, UnpreparedHook
from rdma_hca.daemon.dra.kubeapi import BUDGETS, KNOWN_REQUESTS, KubeApiError, SliceApi
from rdma_hca.daemon.dra.kubeletplugin.health import HealthBoard
from rdma_hca.daemon.dra.kubeletplugin.helper import Helper, HelperApi, HelperParts
from rdma_hca.daemon.dra.kubeletplugin.options import DraConfigError, HelperOptions
from rdma_hca.daemon.dra.offering import NodeOffer
from rdma_hca.daemon.dra.prepare import ClaimPreparer
from rdma_hca.daemon.dra.prepared import PreparedClaims
from rdma_hca.daemon.dra.recovery import recover
from rdma_hca.daemon.dra.resourceslice.publisher import Stats
from rdma_hca.daemon.offer.nodeevents import CONTROLLER
from rdma_hca.kit.aio import cancel_all
from rdma_hca.kit.histogram import HistogramCounts
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kube.client import HttpBuilder
from rdma_hca.kube.events import EventRecorder, connect_events_client
from rdma_hca.node.model import NodeInventory

STOP_WAIT = 1.0


class DriverApi(HelperApi, Protocol):
    """The driver's API client: the helper's reads and writes, and closing it."""

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class DraStats:
    """What the daemon reads of the driver (/metrics, /healthz): a snapshot."""

    registered: bool  # with the kubelet's plugin watcher
    registrations: int
    prepared_claims: int
    publish_error: str | None  # why the last publish pass failed; None after a good one
    published: bool  # a publish pass succeeded since start
    idle: bool  # no publish pass running or due (tests and benchmarks wait for this)
    prepares: Mapping[str, int]  # claims answered, by result ("ok", "error")
    unprepares: Mapping[str, int]
    prepare_seconds: HistogramCounts
    bandwidth_capacity: Mapping[str, int]  # each offered HCA's, bits per second
    bandwidth_held: Mapping[str, int]  # what the prepared claims hold of each HCA
    api_requests: Mapping[tuple[str, str, str], int]  # by (resource, verb, code)
    api_wait_seconds: Mapping[str, float]  # waiting for a token, by budget
    file_stalls: int  # reads and writes of the driver's files past their deadline, ever
    # The claims' status writes: refused with a 4xx (not 404, 409, 429), taken without our
    # entries (the feature gate off), and claims whose write is still to go out.
    status_refused: int = 0
    status_dropped: int = 0
    status_pending: int = 0
    attributes_dropped: int = 0  # left out of a device to keep within the API's limit
    admin_access_claims: int = 0  # prepared claims given a device with admin access


@dataclass(slots=True)
class _Running:
    """What :meth:`DraDriver.start` built, with the API client."""

    api: DriverApi
    checkpoint: Checkpoint
    prepared: PreparedClaims
    preparer: ClaimPreparer
    helper: Helper
    tasks: list[asyncio.Task[None]]
    status_writer: ClaimStatusWriter | None
    events: EventRecorder | None  # made by the driver, closed at stop


class DraDriver:
    """Construct, ``await start(inventory)``, feed ``update(inventory)``, ``await stop()``."""

    def __init__(self, config: DriverConfig, *, api: DriverApi | None = None,
                 on_prepared: PreparedHook | None = None,
                 on_unprepared: UnpreparedHook | None = None,
                 http: HttpBuilder | None = None) -> None:
        """``api``: an API client of the caller's (else the driver connects its own at
        start); ``on_prepared``/``on_unprepared``: hooks of the caller's, in place of the
        claims' status.devices entries; ``http``: how its own client builds its HTTP
        client (lightkube's by default)."""
        self.config = config
        self._given_api = api
        self._http = http
        self._on_prepared = on_prepared
        self._on_unprepared = on_unprepared
        self._files = OffLoop(config.read_deadline)
        self.offering = NodeOffer(config)
        self.board = HealthBoard(config.pool_name)
        self._events: EventRecorder | None = None
        self._running: _Running | None = None

    # --- what others read ------------------------------------------------------------

    @property
    def events(self) -> EventRecorder | None:
        """The recorder the claims' Events go through (the daemon's, or the driver's own)."""
        return self._events

    @property
    def helper(self) -> Helper:
        return self._started().helper

    @property
    def preparer(self) -> ClaimPreparer:
        return self._started().preparer

    @property
    def prepared(self) -> PreparedClaims:
        """The claims prepared, the checkpoint and its group commit."""
        return self._started().prepared

    @property
    def status_writer(self) -> ClaimStatusWriter | None:
        return self._started().status_writer

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The driver's running tasks, for the daemon's supervisor."""
        run = self._running
        return [] if run is None else [*run.helper.tasks, *run.tasks]

    def _started(self) -> _Running:
        if self._running is None:
            raise RuntimeError("the DRA driver is not started")
        return self._running

    def stats(self) -> DraStats:
        run = self._running
        publish = run.helper.publisher.stats if run is not None else Stats()
        prepared: Mapping[str, PreparedClaim] = run.prepared if run else {}
        api = run.api if run is not None else None
        writer = run.status_writer if run is not None else None
        return DraStats(
            registered=run is not None and run.helper.sockets.registered,
            registrations=run.helper.sockets.registrations if run else 0,
            prepared_claims=len(prepared),
            publish_error=publish.error,
            published=publish.passes > 0,
            idle=run is None or run.helper.publisher.idle,
            prepares=dict(run.helper.prepare_results) if run else {"ok": 0, "error": 0},
            unprepares=dict(run.helper.unprepare_results) if run else {"ok": 0, "error": 0},
            prepare_seconds=(run.helper.prepare_seconds.counts() if run
                             else HistogramCounts()),
            bandwidth_capacity=self.offering.offer().bandwidth(),
            bandwidth_held=self.offering.bandwidth_held(prepared),
            # Not connected yet: the series at 0.
            api_requests=(dict(api.tally.requests) if isinstance(api, SliceApi)
                          else {key: 0 for key in KNOWN_REQUESTS}),
            api_wait_seconds=(dict(api.tally.waited) if isinstance(api, SliceApi)
                              else dict.fromkeys(BUDGETS, 0.0)),
            file_stalls=self._files.stalls_total,
            # Not started, or hooks of the caller's in place of status writes: at 0.
            status_refused=writer.refused if writer is not None else 0,
            status_dropped=writer.dropped if writer is not None else 0,
            status_pending=writer.pending if writer is not None else 0,
            attributes_dropped=self.offering.attributes_dropped,
            admin_access_claims=sum(any(d.admin_access for d in c.devices)
                                    for c in prepared.values()),
        )

    # --- life cycle ------------------------------------------------------------------

    async def start(self, inventory: NodeInventory | None = None, *,
                    events: EventRecorder | None = None) -> None:
        """``events``: the daemon's recorder for the claims' Events; without one the
        driver makes its own (with the API client it makes itself), on a budget apart.

        The kubelet is registered with before the driver's own client can send; this
        returns once it can. A client that cannot be built ends the start with the
        driver stopped (its sockets removed) and a :class:`DraConfigError`.
        """
        options = HelperOptions.from_config(self.config)
        options.check()
        api = self._given_api or await self._open()
        own_events: EventRecorder | None = None
        checkpoint = Checkpoint(self.config.checkpoint, self.config.lock_path,
                                deadline=self.config.read_deadline)
        try:
            if events is None and self._given_api is None and isinstance(api, SliceApi):
                client = await connect_events_client(api.client.creds, off=self._files,
                                                     build=self._http)
                own_events = events = EventRecorder(client, controller=CONTROLLER,
                                                    instance=self.config.node_name,
                                                    close_client=client.close)
                own_events.start()
            self._events = events
            recovered = await recover(self.config, checkpoint, self._files)
        except BaseException:
            # Nothing is left running of a start that did not finish.
            checkpoint.close()
            if own_events is not None:
                await own_events.close()
                self._events = None
            if self._given_api is None:
                with contextlib.suppress(Exception):
                    await api.close()
            raise
        prepared = PreparedClaims(checkpoint, self._files, recovered, shared=options.rolling)
        claim_events = (ClaimEvents(events, self.config.node_name) if events is not None
                        else None)
        status_writer = self._status_writer(api, claim_events, prepared)
        hooks = (ClaimHooks(status_writer.on_prepared, status_writer.on_unprepared)
                 if status_writer is not None
                 else ClaimHooks(self._on_prepared, self._on_unprepared))
        preparer = ClaimPreparer(self.config, self._files, prepared, offer=self.offering.offer,
                                 hooks=hooks)
        tasks = []
        if options.rolling:
            # Another instance may write the checkpoint: follow its writes.
            follower = CheckpointFollower(checkpoint, self._files.run, prepared.followed,
                                          backstop=self.config.socket_check_seconds)
            tasks.append(asyncio.create_task(follower.run(), name="dra-checkpoint-watch"))
        helper = Helper(options, HelperParts(
            plugin=preparer, prepared=prepared, api=api, records=checkpoint, io=self._files,
            desired=self.offering.offer(), board=self.board,
            on_prepare_failed=claim_events.prepare_failed if claim_events else None))
        self._running = _Running(api, checkpoint, prepared, preparer, helper, tasks,
                                 status_writer, own_events)
        if status_writer is not None:
            status_writer.start()  # what the last instance left unwritten
        if inventory is not None:
            await self.update(inventory)
        await helper.start()
        if isinstance(api, SliceApi) and self._given_api is None:
            await self._until_ready(api)

    async def _open(self) -> SliceApi:
        """The driver's client, its credentials read; its HTTP client is built from the
        first call on (the first publish, a Prepare) or :meth:`_until_ready`."""
        try:
            return await SliceApi.open(self.config.kubeconfig, self.config.read_deadline,
                                       qps=self.config.api_qps, burst=self.config.api_burst,
                                       claim_qps=self.config.claim_api_qps,
                                       claim_burst=self.config.claim_api_burst,
                                       off=self._files, build=self._http,
                                       # Once the sockets are served: the imports and the
                                       # TLS context do not compete with serving them.
                                       now=False)
        except KubeApiError as exc:
            # The message names what serve accepts and tried (rdma_hca.kube.credentials).
            raise DraConfigError(f"the DRA driver needs the API server: {exc}") from None

    async def _until_ready(self, api: SliceApi) -> None:
        """Build the client's HTTP client and wait for it; one that cannot be built stops
        the driver."""
        try:
            await api.ready()
        except BaseException as exc:
            # Nothing is left of a start that did not finish: the sockets go too.
            await self.stop()
            if isinstance(exc, KubeApiError):
                raise DraConfigError(f"the DRA driver needs the API server: {exc}") from None
            raise

    def _status_writer(self, api: DriverApi, claim_events: ClaimEvents | None,
                       prepared: PreparedClaims) -> ClaimStatusWriter | None:
        """Without hooks of the caller's, prepared claims get their status.devices entries."""
        if self._on_prepared is not None or self._on_unprepared is not None:
            return None
        if not isinstance(api, SliceApi):
            return None
        return ClaimStatusWriter(api, self.config.driver_name,
                                 sysfs_root=self.config.sysfs_root, hca_of=self.offering.hca,
                                 files=self._files, prepared=prepared,
                                 on_refused=(claim_events.status_refused
                                             if claim_events is not None else None),
                                 retry_after_max=self.config.status_retry_after_max_seconds)

    async def stop(self) -> None:
        """Stop serving and remove our sockets; the slice stays (the kubelet wipes it later).

        Bounded: a task that does not end within its wait is left behind (and named),
        so SIGTERM always ends with the sockets removed.
        """
        run, self._running = self._running, None
        if run is None:
            return
        await run.helper.stop()
        await cancel_all(run.tasks, within=STOP_WAIT, what="the checkpoint's follower")
        await run.preparer.hooks.close()
        run.checkpoint.close()
        if run.status_writer is not None:
            await run.status_writer.close()
        if run.events is not None:
            await run.events.close()
            self._events = None
        if self._given_api is None:
            with contextlib.suppress(Exception):
                await run.api.close()

    async def update(self, inventory: NodeInventory) -> None:
        """Take a new inventory: the slice, the claims and the health streams follow it."""
        offer = self.offering.update(inventory)
        if self._running is not None:
            self._running.helper.publish(offer)
        await self.board.set(offer.health())

    async def update_neighbours(self, neighbours: tuple[PortNeighbour, ...]) -> None:
        """Take the ports' LLDP neighbours (each HCA's switch attributes): the slice is
        written when they change what it says."""
        offer = self.offering.update_neighbours(neighbours)
        if self._running is not None:
            self._running.helper.publish(offer)
