"""The DRA driver: the composition of its parts, and the node's slice.

Its parts are those of the upstream kubelet plugin helper: the sockets and the
registration (``sockets.py``), the claims with their CDI specs and checkpoint
(``claims.py``, ``checkpoint.py``), and publishing the node's ResourceSlice
(``slices.py``: the driver hands it each new offer's devices). The kubelet registering us
makes the publisher check the API server's copy again, since a starting kubelet deletes
the node's slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from rdma_hca.contract.checkpoint import PreparedClaim, PreparedDevice
from rdma_hca.contract.dra import NODE_DEVICE
from rdma_hca.daemon.dra.claimevents import ClaimEvents
from rdma_hca.daemon.dra.claims import (
    Claim,
    ClaimKeeper,
    ClaimReader,
    ClaimRef,
    PreparedHook,
    PrepareResult,
    UnpreparedHook,
)
from rdma_hca.daemon.dra.claimstatus import ClaimStatusWriter
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.daemon.dra.kubeapi import BUDGETS, KNOWN_REQUESTS, KubeApiError, SliceApi
from rdma_hca.daemon.dra.service import HealthBoard, add_dra_services
from rdma_hca.daemon.dra.slices import SliceClient, SlicePublisher, Stats
from rdma_hca.daemon.dra.sockets import KubeletSockets, SocketInUse
from rdma_hca.daemon.offer.nodeevents import CONTROLLER
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kit.unixserver import socket_path_problem
from rdma_hca.kube.events import EventRecorder, connect_events_client
from rdma_hca.node.model import CharDevice, Hca, NodeInventory

log = logging.getLogger(__name__)

STOP_WAIT = 1.0
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_POD_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class DraConfigError(ValueError):
    """The driver cannot run with this configuration; the message says how to fix it."""


class ApiClient(SliceClient, ClaimReader, Protocol):
    async def close(self) -> None: ...


def check_config(config: DriverConfig) -> None:
    if not config.node_name:
        raise DraConfigError("the DRA driver needs the node's name: set --node-name or NODE_NAME "
                             "(the chart sets it from spec.nodeName)")
    if len(config.driver_name) > 63 or not _DNS_SUBDOMAIN.match(config.driver_name):
        raise DraConfigError(f"DRA driver name {config.driver_name!r} is not a lowercase DNS "
                             "subdomain of at most 63 characters, e.g. rdma-hca.io")
    if config.pod_uid and not _POD_UID.match(config.pod_uid):
        raise DraConfigError(f"pod UID {config.pod_uid[:80]!r} cannot be part of a socket name: "
                             "set POD_UID to the pod's metadata.uid (the chart does)")
    for path in (config.endpoint, config.registration_socket):
        if socket_path_problem(path) is not None:
            raise DraConfigError(f"socket path {path} is too long for a unix socket "
                                 "(107 bytes at most): use a shorter kubelet root directory")


class DraDriver:
    """Construct, ``await start(inventory)``, feed ``update(inventory)``, ``await stop()``."""

    def __init__(self, config: DriverConfig, *, api: ApiClient | None = None,
                 on_prepared: PreparedHook | None = None,
                 on_unprepared: UnpreparedHook | None = None,
                 events: EventRecorder | None = None) -> None:
        self.config = config
        # The daemon's recorder when it gives one; else the driver makes its own at start
        # (with the API client it makes itself), on a budget apart from the driver's.
        self.events = events
        self._own_events = False
        self.claim_events: ClaimEvents | None = None
        self._api = api
        self._own_api = api is None
        self._offer = self._build_offer((), None, frozenset())
        self.rdma_cm: CharDevice | None = None
        self.board = HealthBoard(config.pool_name)
        self._files = OffLoop(config.read_deadline)
        self.claims = ClaimKeeper(config, self._files, on_prepared=on_prepared,
                                  on_unprepared=on_unprepared)
        # Without hooks of the caller's, prepared claims get their status.devices entries.
        self._write_status = on_prepared is None and on_unprepared is None
        self.status_writer: ClaimStatusWriter | None = None
        self.sockets = KubeletSockets(
            config,
            lambda server: add_dra_services(server, self, self.board,
                                            config.health_resend_seconds),
            self._on_registered)
        self.publisher: SlicePublisher | None = None
        self._hcas: tuple[Hca, ...] = ()
        self._held: frozenset[str] = frozenset()
        self._tasks: list[asyncio.Task[None]] = []

    # --- what others read ------------------------------------------------------------

    @property
    def prepared(self) -> Mapping[str, PreparedClaim]:
        return self.claims.prepared

    @property
    def bandwidth_capacity(self) -> dict[str, int]:
        """Each offered HCA's published bandwidth, bits per second (0: none published)."""
        return self.offer.bandwidth()

    @property
    def bandwidth_held(self) -> dict[str, int]:
        """Bits per second of each HCA the prepared claims hold: every offered HCA (at 0
        when none), and an HCA gone from the offer while a claim still holds it."""
        held = dict.fromkeys(self.offer.bandwidth(), 0)
        for claim in self.claims.prepared.values():
            for d in claim.devices:
                if d.device != NODE_DEVICE:  # it gives every HCA and holds none of them
                    held[d.hca] = held.get(d.hca, 0) + d.bandwidth
        return held

    @property
    def registered(self) -> bool:
        return self.sockets.registered

    @property
    def registrations(self) -> int:
        return self.sockets.registrations

    @property
    def offer(self) -> DeviceOffer:
        return self._offer

    @property
    def publish_stats(self) -> Stats:
        """What the slice publisher did (nothing before start)."""
        return self.publisher.stats if self.publisher is not None else Stats()

    @property
    def publish_error(self) -> str | None:
        """Why the last publish pass failed; None after a good one."""
        return self.publish_stats.error

    @property
    def published(self) -> asyncio.Event:
        """Set after every successful publish pass (the publisher's, made at start)."""
        assert self.publisher is not None, "the driver is not started"
        return self.publisher.published

    @property
    def publish_passes(self) -> int:
        """Successful publish passes, written or not."""
        return self.publish_stats.passes

    @property
    def published_since_start(self) -> bool:
        return self.publish_passes > 0

    @property
    def ready(self) -> bool:
        """Registered with the kubelet, and a slice published since start."""
        return self.registered and self.published_since_start

    @property
    def api_requests(self) -> dict[tuple[str, str, str], int]:
        """What the API client sent, by (resource, verb, code): a copy, for /metrics."""
        if isinstance(self._api, SliceApi):
            return dict(self._api.tally.requests)
        return {key: 0 for key in KNOWN_REQUESTS}  # not connected yet: the series at 0

    @property
    def api_wait_seconds(self) -> dict[str, float]:
        """Seconds spent waiting for a token, by budget: a copy, for /metrics."""
        if isinstance(self._api, SliceApi):
            return dict(self._api.tally.waited)
        return dict.fromkeys(BUDGETS, 0.0)

    @property
    def file_stalls(self) -> int:
        """Reads and writes of the driver's files that passed their deadline, ever."""
        return self._files.stalls_total

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The driver's running tasks, for the daemon's supervisor."""
        return [*self._tasks, *self.sockets.tasks, *self.claims.tasks]

    @property
    def idle(self) -> bool:
        """No publish pass running or due (tests and benchmarks wait for this)."""
        return self.publisher is None or self.publisher.idle

    # --- life cycle ------------------------------------------------------------------

    async def start(self, inventory: NodeInventory | None = None) -> None:
        check_config(self.config)
        if self._api is None:
            try:
                self._api = await SliceApi.connect(self.config.kubeconfig,
                                                   self.config.read_deadline,
                                                   qps=self.config.api_qps,
                                                   burst=self.config.api_burst,
                                                   claim_qps=self.config.claim_api_qps,
                                                   claim_burst=self.config.claim_api_burst,
                                                   off=self._files)
            except KubeApiError as exc:
                # The message names what serve accepts and tried (rdma_hca.kube.credentials).
                raise DraConfigError(f"the DRA driver needs the API server: {exc}") from None
        if self.events is None and self._own_api and isinstance(self._api, SliceApi):
            client = await connect_events_client(self._api.client.creds, off=self._files)
            self.events = EventRecorder(client, controller=CONTROLLER,
                                        instance=self.config.node_name,
                                        close_client=client.close)
            self.events.start()
            self._own_events = True
        if self.events is not None:
            self.claim_events = ClaimEvents(self.events, self.config.node_name)
            self.claims.on_prepare_failed = self.claim_events.prepare_failed
        await self.claims.load()
        self.claims.start()
        self.claims.api = self._api
        if self._write_status and isinstance(self._api, SliceApi):
            self._hook_status(self._api)
        self.publisher = SlicePublisher(self._api, self.config.driver_name,
                                        self.config.node_name, self.config.pool_name,
                                        desired=self._offer, taints=self.config.device_taints,
                                        resync=self.config.resync_seconds,
                                        start_jitter=self.config.start_jitter_seconds)
        if inventory is not None:
            await self.update(inventory)
        try:
            await self.sockets.start()
        except SocketInUse as exc:  # another instance serves our sockets: exit status 2
            raise DraConfigError(str(exc)) from None
        self._tasks = [asyncio.create_task(self._publish_loop(), name="dra-publish")]

    async def stop(self) -> None:
        """Stop serving and remove our sockets; the slice stays (the kubelet wipes it later).

        Bounded: a task that does not end within STOP_WAIT is left behind (and named),
        so SIGTERM always ends with the sockets removed.
        """
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=STOP_WAIT)
            if pending:
                log.error("DRA driver tasks still running after %g s: %s", STOP_WAIT,
                          ", ".join(t.get_name() for t in pending))
        await self.sockets.stop()
        await self.claims.close()
        if self.status_writer is not None:
            await self.status_writer.close()
        if self.events is not None and self._own_events:
            await self.events.close()
            self.events, self._own_events = None, False
        if self._api is not None and self._own_api:
            with contextlib.suppress(Exception):
                await self._api.close()
            self._api = None

    async def update(self, inventory: NodeInventory) -> None:
        """Take a new inventory: the slice, the claims and the health streams follow it."""
        hcas = tuple(h for h in inventory.hcas if self.config.selectors.matches(h))
        self._hcas = hcas
        self._held = inventory.held
        self.rdma_cm = inventory.rdma_cm
        self._rebuild()
        await self.board.set(self.offer.health())

    def _hook_status(self, api: SliceApi) -> None:
        writer = ClaimStatusWriter(api, self.config.driver_name,
                                   sysfs_root=self.config.sysfs_root,
                                   hca_of=lambda device: self.offer.hcas.get(device),
                                   files=self._files, prepared=lambda: self.claims.prepared,
                                   on_refused=(self.claim_events.status_refused
                                               if self.claim_events is not None else None),
                                   retry_after_max=self.config.status_retry_after_max_seconds)
        writer.start()  # what the last instance left unwritten

        async def prepared(claim: Claim, devices: tuple[PreparedDevice, ...]) -> None:
            await writer.on_prepared(ClaimRef(claim.namespace, claim.uid, claim.name), devices,
                                     claim.source)

        self.claims.on_prepared = prepared
        self.claims.on_unprepared = writer.on_unprepared
        self.status_writer = writer

    def _build_offer(self, hcas: Sequence[Hca], rdma_cm: CharDevice | None,
                     held: frozenset[str]) -> DeviceOffer:
        return DeviceOffer.build(hcas, self.config.driver_name, self.config.mode,
                                 self.config.device_taints, rdma_cm, held,
                                 node_device_on=self.config.node_device,
                                 default_bandwidth=self.config.default_bandwidth)

    def _rebuild(self) -> None:
        offer = self._build_offer(self._hcas, self.rdma_cm, self._held)
        self.claims.hcas, self.claims.rdma_cm = offer.hcas, offer.rdma_cm
        self.claims.groups = offer.groups
        # Replaced even when the slice stays as it is: the health verdict also follows
        # rdma_cm, which the slice does not show.
        self._offer = offer
        if self.publisher is not None:
            self.publisher.update(offer)  # written when its devices changed

    def _on_registered(self) -> None:
        # A starting kubelet deleted this node's slices: look at the server's copy again.
        if self.publisher is not None:
            self.publisher.check()

    # --- claims (the kubelet's calls) ------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        return await self.claims.prepare(claims)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return await self.claims.unprepare(claims)

    # --- publishing ------------------------------------------------------------------------

    async def _publish_loop(self) -> None:
        assert self.publisher is not None
        await self.publisher.run()
