"""One recorder of Kubernetes Events, on a budget of its own.

``record(spec)`` never waits and never raises: it counts the spec into its series and
queues the series' name. One task sends what is queued, through a client of its own (its
own token bucket, connections and deadlines, :data:`EVENTS_POLICY`), so an API server that
is slow or holds Event requests never delays a Prepare or a slice write: those go through
the driver's client.

Repeats aggregate as client-go's recorder does them: equal specs within
:data:`SERIES_WINDOW` of each other are one Event, whose ``series`` (core v1: ``count``)
the recorder patches, and a series waiting to be sent is queued once however often it
repeats. The queue is bounded: under overload (more distinct Events waiting than
:data:`QUEUE_SIZE`) new ones are dropped and counted in :attr:`EventRecorder.dropped`;
Events are a courtesy to the user, never worth memory or a claim's time.

``events.k8s.io/v1`` is used where the server serves it, core ``v1`` otherwise: asked once
(``GET /apis/events.k8s.io/v1``, 404 means core).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rdma_hca.kit.sayonce import Once
from rdma_hca.kube.client import ApiClient
from rdma_hca.kube.credentials import Credentials
from rdma_hca.kube.errors import KubeError, NotFoundError
from rdma_hca.kube.eventbody import (
    CORE_V1,
    EVENTS_V1,
    EventSpec,
    create_body,
    event_name,
    event_namespace,
    event_path,
    repeat_patch,
)
from rdma_hca.kube.policy import ClientPolicy

log = logging.getLogger(__name__)

# Equal Events this close together are one series (client-go's window is 6 minutes).
SERIES_WINDOW = 360.0
QUEUE_SIZE = 128
SERIES_KEPT = 1024  # series remembered; the oldest are forgotten first
# A request a second with a burst of 10; short deadlines and few retries, so a dead server
# costs the sender seconds, not minutes, and a burst of failures still shows at once.
EVENTS_POLICY = ClientPolicy(qps=1.0, burst=10, timeout=3.0, budget=5.0, max_retries=2)

Clock = Callable[[], float]


class EventClient(Protocol):
    async def request(self, method: str, path: str, *, body: Any = None,
                      params: Mapping[str, str] | None = None) -> dict[str, Any]: ...


async def connect_events_client(creds: Credentials, **kw: Any) -> ApiClient:
    """The recorder's own client: its own token bucket, connections and deadlines.

    Its HTTP client is built at its first send (:meth:`ApiClient.starting`), shared with
    the process's other clients on the same credentials: a recorder never waits for a
    send, so nothing need wait for that build either, and a daemon that sends no Event
    never builds it. A client that cannot be built fails its sends, said once as any
    failed send is.
    """
    return ApiClient.starting(creds, EVENTS_POLICY, now=False, **kw)


@dataclass(slots=True)
class _Series:
    count: int
    first: float  # wall clock
    last: float  # wall clock
    seen: float  # the recorder's clock
    name: str | None = None  # the Event's, once created
    api: str | None = None  # which API created it
    sent: int = 0  # the count the server has


class EventRecorder:
    """``start()``, then ``record(spec)`` from anywhere on the loop; ``await close()``."""

    def __init__(self, client: EventClient, *, controller: str, instance: str,
                 queue_size: int = QUEUE_SIZE, window: float = SERIES_WINDOW,
                 clock: Clock = time.monotonic, wall: Clock = time.time,
                 close_client: Callable[[], Any] | None = None) -> None:
        self.client = client
        self.controller = controller
        self.instance = instance
        self.queue_size = queue_size
        self.window = window
        self._clock = clock
        self._wall = wall
        self._close_client = close_client
        self._series: dict[EventSpec, _Series] = {}
        self._pending: dict[EventSpec, None] = {}  # insertion-ordered, each series once
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._api: str | None = None
        self._said = Once()
        self.recorded = 0  # record() calls
        self.created = 0  # Events created
        self.patched = 0  # series updates sent
        self.dropped = 0  # not sent: the queue was full
        self.failed = 0  # sends the server refused or did not answer

    @property
    def api(self) -> str | None:
        """The Events API in use, once asked (``events.k8s.io/v1`` or ``v1``)."""
        return self._api

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="events")
        return self._task

    async def close(self, grace: float = 0.0) -> None:
        """Send what is queued for up to ``grace`` seconds, then stop."""
        if grace > 0:
            await self.drain(grace)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._close_client is not None:
            with contextlib.suppress(Exception):
                await self._close_client()

    async def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the queue to be sent; True when it was."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    # --- recording (never waits) -------------------------------------------------------

    def record(self, spec: EventSpec) -> None:
        self.recorded += 1
        now, wall = self._clock(), self._wall()
        series = self._series.get(spec)
        if series is not None and now - series.seen <= self.window:
            series.count += 1
            series.last, series.seen = wall, now
        else:
            series = _Series(count=1, first=wall, last=wall, seen=now)
            self._series.pop(spec, None)
            self._series[spec] = series
            self._forget_old()
        if spec in self._pending:
            return  # the send that is queued carries the new count
        if len(self._pending) >= self.queue_size:
            self.dropped += 1
            if self._said.first("dropped"):
                log.warning("Kubernetes Events are being dropped: %d are waiting for the API "
                            "server already (counted as outcome=\"dropped\" in "
                            "rdma_hca_events_total)",
                            len(self._pending))
            return
        self._pending[spec] = None
        self._idle.clear()
        self._wake.set()

    def _forget_old(self) -> None:
        while len(self._series) > SERIES_KEPT:
            oldest = next(iter(self._series))
            if oldest in self._pending:
                break
            del self._series[oldest]

    # --- sending (its own task) --------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            # Off the queue before it is sent: a repeat meanwhile queues it again.
            spec = next(iter(self._pending))
            del self._pending[spec]
            try:
                await self._send(spec)
            except KubeError as exc:
                self.failed += 1
                self._say_failure(exc)
            except Exception as exc:  # a courtesy must not end its sender: said, counted
                self.failed += 1
                if self._said.first(f"bug {type(exc).__name__}"):
                    log.warning("a Kubernetes Event was not sent: %r", exc)

    def _say_failure(self, exc: KubeError) -> None:
        if exc.status == 403:
            if self._said.first("forbidden"):
                log.warning("cannot write Kubernetes Events (%s): give the service account "
                            "create and patch on events (the chart does)", exc)
        elif self._said.first(f"failed {exc.status}"):
            log.warning("a Kubernetes Event was not sent: %s", exc)
        else:
            log.debug("a Kubernetes Event was not sent: %s", exc)

    async def _api_version(self) -> str:
        if self._api is None:
            try:
                await self.client.request("GET", "/apis/events.k8s.io/v1")
                self._api = EVENTS_V1
            except NotFoundError:
                self._api = CORE_V1
                log.info("the API server does not serve events.k8s.io/v1: Events go to the "
                         "core v1 API")
        return self._api

    async def _send(self, spec: EventSpec) -> None:
        series = self._series.get(spec)
        if series is None:
            return
        api = await self._api_version()
        # Taken now: repeats that come while the request is out are sent after it.
        count, last = series.count, series.last
        if series.name is not None and series.api == api:
            if count <= series.sent:
                return
            try:
                await self.client.request(
                    "PATCH", event_path(api, event_namespace(spec.regarding), series.name),
                    body=repeat_patch(api, count=count, last=last))
                series.sent = count
                self.patched += 1
                return
            except NotFoundError:
                series.name = None  # expired (the server keeps Events an hour): a new one
        name = event_name(spec.regarding, int(self._wall() * 1e9))
        body = create_body(api, spec, name=name, controller=self.controller,
                           instance=self.instance, first=series.first, last=last, count=count)
        await self.client.request("POST", event_path(api, event_namespace(spec.regarding)),
                                  body=body)
        series.name, series.api, series.sent = name, api, count
        self.created += 1
