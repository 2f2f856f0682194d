"""Writing this node's fabric block label and neighbours annotation on its own Node.

Desired state in, writes out, in the shape of the slice publisher: whoever knows the
ports' neighbours hands :meth:`NodeFabricWriter.update` each new set (or lets
:meth:`NodeFabricWriter.follow` take them from a ``Broadcast``); the writer's loop makes
the Node hold

- the label ``rdma-hca.io/fabric-block``: :func:`fabric_block` of the switches the
  ports reach (removed when they reach none);
- the annotation ``rdma-hca.io/fabric-neighbours``: :func:`encode_neighbours` of the set,
  silent ports included (removed when the set is empty).

Each write is one JSON merge patch of those two keys and nothing else: a merge patch
leaves every other label and annotation as it is, needs no read-modify-write, and lets
the chart's admission policy compare the Node before and after key by key. The writer
reads the Node once (and again after a failure and once per resync interval, jittered) and
sends a patch only when a value differs from what the server holds: an LLDP frame every
30 s that says the same is no write.

Writes are spaced: the first change goes out at once, the next no sooner than ``spacing``
later, and the last state always goes out. A daemon that starts hears its first frames up
to 30 s later: until it has heard one (or ``start_grace`` has passed) a set that reaches
no switch (empty, or silent ports only) writes nothing, so a restart does not take the
label away and put it back. A failed write is said once per reason, counted, and tried
again after a backoff (at least what the server's ``Retry-After`` asked);
the client itself retries 429 and 5xx with Retry-After.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rdma_hca.contract.fabric import (
    FABRIC_BLOCK_LABEL,
    MAX_NEIGHBOURS_ANNOTATION,
    NEIGHBOURS_ANNOTATION,
    PortNeighbour,
    encode_neighbours,
    fabric_block,
)
from rdma_hca.kit.aio import cancel_all, wait_event
from rdma_hca.kit.backoff import Backoff, Sleep, jittered
from rdma_hca.kit.broadcast import Broadcast
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kit.sayonce import Latch, Once
from rdma_hca.kube.client import ApiClient, read_credentials
from rdma_hca.kube.credentials import CredentialSearch
from rdma_hca.kube.errors import KubeError
from rdma_hca.kube.policy import ClientPolicy, Priority

log = logging.getLogger(__name__)

Neighbours = tuple[PortNeighbour, ...]

DEFAULT_SPACING = 5.0  # seconds between two writes while the neighbours keep changing
# One LLDP TTL (120 s by default): a switch that sends at all has been heard by then.
DEFAULT_START_GRACE = 120.0
DEFAULT_RESYNC = 600.0  # the Node read again (someone may have removed the label)
RESYNC_JITTER = 0.2
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
# What the writer sends: the series of the API request counter that exist from the start.
KNOWN_REQUESTS = (("nodes", "get", "200"), ("nodes", "patch", "200"))
# A write every few seconds at most: a small budget of its own, short deadlines (a dead
# server costs a retry later, never a stop).
WRITER_POLICY = ClientPolicy(qps=1.0, burst=5, timeout=5.0, budget=10.0, max_retries=2)
# serve has no credential flags: in a pod its service account, else a kubeconfig file.
WRITER_CREDENTIALS = CredentialSearch(
    in_cluster_first=True,
    in_pod_fix="run it in a pod with its service account token mounted (the chart does when "
               "fabric.lldp is true)")
LABEL_OFF = "the Node label %s is off: %s"


@dataclass(frozen=True, slots=True)
class Stats:
    """What the writer did since it was made."""

    reads: int = 0  # GETs of the Node
    writes: int = 0  # PATCHes that succeeded
    errors: int = 0  # passes that failed
    error: str | None = None  # why the last pass failed; None after a good one


@dataclass(frozen=True, slots=True)
class Held:
    """The two values as the server holds them ("" for absent)."""

    block: str
    neighbours: str


def desired_values(neighbours: Neighbours) -> Held:
    """The label and annotation values for ``neighbours`` ("" removes)."""
    block = fabric_block(n.switch for n in neighbours if n.heard)
    return Held(block, _annotation(neighbours))


def _annotation(neighbours: Neighbours) -> str:
    if not neighbours:
        return ""
    kept = sorted(neighbours, key=lambda n: (n.hca, n.port))
    text = encode_neighbours(kept)
    # A node with more ports than the bound holds (never seen): the first ones that fit.
    while len(text) > MAX_NEIGHBOURS_ANNOTATION and kept:
        kept.pop()
        text = encode_neighbours(kept)
    return text


def node_path(node: str) -> str:
    return f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}"


class NodeFabricWriter:
    """Construct with the API client and this node's name; :meth:`update` the neighbours
    (or :meth:`follow` a broadcast of them); run :meth:`run` as a task, or :meth:`start`
    and :meth:`stop` it.

    ``rate`` names the client's budget to take tokens from; the writes go at low priority,
    after whatever else of that budget is waiting.
    """

    def __init__(self, api: ApiClient, node: str, *, rate: str | None = None,
                 spacing: float = DEFAULT_SPACING, start_grace: float = DEFAULT_START_GRACE,
                 resync: float = DEFAULT_RESYNC,
                 clock: Callable[[], float] = time.monotonic, sleep: Sleep = asyncio.sleep,
                 rng: random.Random | None = None) -> None:
        if not node:
            raise ValueError("the node writer needs this node's name (NODE_NAME)")
        self.api = api
        self.node = node
        self.rate = rate
        self.spacing = spacing
        self.start_grace = start_grace
        self.resync = resync
        self.written = asyncio.Event()  # set after every pass that left the server right
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._desired: Neighbours | None = None
        self._heard = False  # some port has heard a neighbour since the start
        self._wake = asyncio.Event()
        self._held: Held | None = None  # what the server holds, None: read it first
        self._last_write: float | None = None
        self._started: float | None = None
        self._next_resync: float | None = None
        self._stats = Stats()
        self._trouble = Latch()
        self._said = Once()
        self._tasks: list[asyncio.Task[None]] = []
        api.tally.expect(KNOWN_REQUESTS, (rate or api.policy.rate_name,))

    # --- what the daemon gives and reads ----------------------------------------------------

    def update(self, neighbours: Neighbours) -> None:
        """The ports' neighbours from now on; never waits, the loop writes what changed."""
        neighbours = tuple(neighbours)
        if any(n.heard for n in neighbours):
            self._heard = True
        if neighbours != self._desired:
            self._desired = neighbours
            self._wake.set()

    async def follow(self, neighbours: Broadcast[Neighbours]) -> None:
        """:meth:`update` with every value of ``neighbours``, its current one first."""
        self.update(neighbours.value)
        async for value in neighbours.follow(neighbours.generation):
            self.update(value)

    @property
    def stats(self) -> Stats:
        return self._stats

    @property
    def held(self) -> Held | None:
        """The label and annotation the server holds, as far as the writer knows."""
        return self._held

    def start(self, neighbours: Broadcast[Neighbours] | None = None) -> None:
        """Run the loop (and follow ``neighbours`` when given) as tasks of their own."""
        self._tasks.append(asyncio.create_task(self.run(), name="fabric-node-writer"))
        if neighbours is not None:
            self._tasks.append(asyncio.create_task(self.follow(neighbours),
                                                   name="fabric-node-follow"))

    async def stop(self, *, close_api: bool = False) -> None:
        """End the tasks (and close the client when ``close_api``)."""
        tasks, self._tasks = self._tasks, []
        await cancel_all(tasks)
        if close_api:
            await self.api.close()

    # --- one pass ----------------------------------------------------------------------------

    async def _read(self) -> Held:
        node = await self.api.get(node_path(self.node), rate=self.rate, priority=Priority.LOW)
        self._count(reads=self._stats.reads + 1)
        return _held(node)

    async def sync(self, neighbours: Neighbours) -> bool:
        """Make the Node hold the values of ``neighbours``; True when it wrote."""
        if self._held is None:
            self._held = await self._read()
        want = desired_values(neighbours)
        if len(want.neighbours) < len(encode_neighbours(neighbours)) \
                and self._said.first("cut"):
            log.warning("Node %s: %d ports' neighbours exceed the annotation's %d bytes: "
                        "the last ones are left out of %s", self.node, len(neighbours),
                        MAX_NEIGHBOURS_ANNOTATION, NEIGHBOURS_ANNOTATION)
        patch: dict[str, dict[str, str | None]] = {}
        if want.block != self._held.block:
            patch["labels"] = {FABRIC_BLOCK_LABEL: want.block or None}
        if want.neighbours != self._held.neighbours:
            patch["annotations"] = {NEIGHBOURS_ANNOTATION: want.neighbours or None}
        if not patch:
            return False
        node = await self.api.request("PATCH", node_path(self.node),
                                      body={"metadata": patch}, rate=self.rate,
                                      priority=Priority.LOW)
        self._held = _held(node)
        self._count(writes=self._stats.writes + 1)
        if FABRIC_BLOCK_LABEL in patch.get("labels", {}):
            log.info("Node %s: label %s=%s", self.node, FABRIC_BLOCK_LABEL,
                     want.block or "(removed)")
        return True

    def _count(self, **changes: Any) -> None:
        self._stats = dataclasses.replace(self._stats, **changes)

    # --- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Write whenever the neighbours change or a resync is due, until cancelled."""
        self._started = self._clock()
        self._plan_resync()
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX, rng=self._rng)
        while True:
            await wait_event(self._wake, self._next_wait())
            self._wake.clear()
            if self._next_resync is not None and self._clock() >= self._next_resync:
                self._held = None  # look at the server's copy again
                self._plan_resync()
            await self._spaced()
            desired = self._desired
            if desired is None or self._waiting_for_grace():
                continue  # nothing yet, or no switch heard before the grace ends (woken then)
            try:
                if await self.sync(desired):
                    self._last_write = self._clock()
            except Exception as exc:
                # The server's refusal or an answer we cannot read: either is said, counted
                # and tried again; a label is never worth the daemon's end.
                self._failed(exc)
                self._held = None
                delay = backoff.next()
                if isinstance(exc, KubeError) and exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, BACKOFF_MAX))
                await self._sleep(delay)
                self._wake.set()
                continue
            if self._trouble.clear():
                log.info("Node %s: fabric label and annotation written again", self.node)
            self._count(error=None)
            backoff.reset()
            self.written.set()

    def _plan_resync(self) -> None:
        self._next_resync = (self._clock() + jittered(self.resync, RESYNC_JITTER, self._rng)
                             if self.resync > 0 else None)

    def _next_wait(self) -> float | None:
        """How long the loop sleeps when nothing comes: until the resync, or until the
        grace ends when a set that reaches no switch waits for it."""
        now = self._clock()
        waits = [] if self._next_resync is None else [self._next_resync - now]
        if self._waiting_for_grace():
            assert self._started is not None
            waits.append(self._started + self.start_grace - now)
        return max(0.0, min(waits)) if waits else None

    def _failed(self, exc: Exception) -> None:
        self._count(errors=self._stats.errors + 1, error=str(exc) or type(exc).__name__)
        status = exc.status if isinstance(exc, KubeError) else None
        reason = str(status or type(exc).__name__)
        if not self._trouble.set(reason):
            return
        if not isinstance(exc, KubeError):
            log.warning("cannot write the fabric label of Node %s: the API server's answer "
                        "could not be used (%s: %s); retrying", self.node,
                        type(exc).__name__, exc, exc_info=exc)
        elif status == 403:
            log.warning("cannot write the fabric label of Node %s (%s): the daemon's service "
                        "account needs get and patch on nodes (the chart grants them with "
                        "fabric.lldp: true); retrying", self.node, exc)
        elif status == 404:
            log.warning("Node %s not found on the API server (%s): is NODE_NAME this node's "
                        "name? retrying", self.node, exc)
        else:
            log.warning("cannot write the fabric label of Node %s: %s; retrying",
                        self.node, exc)

    def _waiting_for_grace(self) -> bool:
        """Nothing heard since the start (every port silent or none), within the grace: a
        restart must not take the label away before the switches had time to speak."""
        return self._desired is not None and not self._heard and not self._grace_over()

    def _grace_over(self) -> bool:
        return self._started is not None and \
            self._clock() - self._started >= self.start_grace

    async def _spaced(self) -> None:
        """Wait out the spacing since the last write; changes meanwhile join this pass."""
        if self._last_write is None:
            return
        hold = self._last_write + self.spacing - self._clock()
        if hold > 0:
            await self._sleep(hold)


def _held(node: dict[str, Any]) -> Held:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return Held(str(labels.get(FABRIC_BLOCK_LABEL, "")),
                str(annotations.get(NEIGHBOURS_ANNOTATION, "")))


async def connect_node_writer(node: str | None, *, off: OffLoop | None,
                              **kw: Any) -> NodeFabricWriter | None:
    """A writer for Node ``node`` on a client of its own (its HTTP connections shared with
    the process's other clients on the same credentials), or None, said in one line, when
    the node's name or the credentials are missing: the label is off, nothing else is."""
    if not node:
        log.warning(LABEL_OFF, FABRIC_BLOCK_LABEL, "the node's name is not known (set "
                    "NODE_NAME; the chart does); LLDP, the DRA attributes and /metrics work "
                    "without it")
        return None
    try:
        creds = await read_credentials(None, WRITER_CREDENTIALS, off=off)
        api = await ApiClient.connect(creds, WRITER_POLICY, off=off)
    except (KubeError, OSError) as exc:
        log.warning(LABEL_OFF, FABRIC_BLOCK_LABEL, f"no usable API server credentials ({exc}); "
                    "LLDP, the DRA attributes and /metrics work without it")
        return None
    return NodeFabricWriter(api, node, **kw)
