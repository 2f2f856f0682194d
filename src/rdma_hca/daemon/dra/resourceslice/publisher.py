"""Keeping this node's ResourceSlices equal to the pool's desired devices, at a cost a
fleet can carry: the shape of the upstream resourceslice controller.

Desired state in, writes out: the driver hands :meth:`SlicePublisher.update` the pool's
desired devices whenever they change, and the publisher's loop makes the API server hold
them (``slices.py`` here says how they are cut into slices). What it did is counted in
a :class:`Stats` record (upstream's ``Stats``: slices created, updated, deleted; with the
passes and the last error), which the driver reads for its metrics and readiness.

Each slice carries its index and a digest of its content in annotations, and an
ownerReference to this node's Node object (read once from the API server), so the
garbage collector removes the slices with the node. The publisher remembers the
resourceVersion of its last write of each slice and sends only the PUT (or POST) a change
needs; a 409 or a 404 is what makes it read the server's copy again (one LIST), as does a
check: after the kubelet registered us (a starting kubelet deletes the node's slices) and
once per resync interval, jittered so a fleet spreads out.

The pool generation is bumped as the upstream kubelet plugin helper does it: kept when at
most one existing slice changes and none is added or removed, one up otherwise (and then
every slice is written with it). Writes are spaced (``Damper``): the first change of a
quiet node goes out at once, the next no sooner than ``spacing`` later, and the last
state always goes out; a device newly down (tainted, or ``linkState: down``) never waits
for the spacing. A flapping port does not keep the slice moving: the health watcher holds
its HCA down until it is stable (``watch.flaps``), so its device stays as it is. An API
server that refuses device taints (DRADeviceTaints off) gets the devices without them
from then on: their ``linkState`` still says down.

The pool's queue and the damper are in ``pace.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rdma_hca.contract.dra import DEVICES_HASH_ANNOTATION, GROUP_VERSION, SLICE_INDEX_ANNOTATION
from rdma_hca.contract.dra import RESYNC_SECONDS as DEFAULT_RESYNC
from rdma_hca.daemon.dra.devices import Device
from rdma_hca.daemon.dra.resourceslice.pace import DEFAULT_SPACING, Damper, PoolQueue
from rdma_hca.daemon.dra.resourceslice.slices import (
    OwnerReference,
    ResourceSlice,
    SliceMeta,
    StoredSlice,
    body,
    content_digest,
    down_devices,
    generate_name,
    node_owner,
    split,
    without_taints,
)
from rdma_hca.kit.aio import wait_event
from rdma_hca.kit.backoff import Backoff, Sleep, jittered
from rdma_hca.kit.sayonce import Once
from rdma_hca.kube.errors import KubeError

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 3
BACKOFF_FIRST = 0.2
BACKOFF_MAX = 10.0
DEFAULT_RESYNC_JITTER = 0.2


class SliceClient(Protocol):
    """The API calls the publisher makes; bodies are JSON objects at this edge."""

    async def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]: ...
    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def delete_slice(self, name: str) -> None: ...
    async def get_node(self, name: str) -> dict[str, Any]: ...


class DesiredDevices(Protocol):
    """The pool's desired devices, with a digest of them (the driver's ``DeviceOffer``)."""

    @property
    def devices(self) -> Sequence[Device]: ...

    @property
    def digest(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Stats:
    """What the publisher did since it was made (upstream's ``resourceslice.Stats``)."""

    created: int = 0  # slices created (POST)
    updated: int = 0  # slices updated (PUT)
    deleted: int = 0  # slices deleted: stale, or of another pool of this node
    reads: int = 0  # LISTs of this node's slices
    passes: int = 0  # successful passes, written or not
    errors: int = 0  # failed passes
    error: str | None = None  # why the last pass failed; None after a good one
    generation: int = 0  # the pool generation last written

    @property
    def writes(self) -> int:
        return self.created + self.updated + self.deleted


@dataclass(frozen=True, slots=True)
class Known:
    """A slice as the server holds it after our last write (or read) of it."""

    name: str
    resource_version: str
    digest: str
    generation: int


class SlicePublisher:
    """Construct (with the desired devices, as upstream's controller takes its first
    resources), :meth:`update` them as they change, run :meth:`run` as a task.

    Until it has desired devices, the loop publishes nothing: an empty pool would delete
    the slices a previous instance published.
    """

    def __init__(self, client: SliceClient, driver: str, node: str, pool: str, *,
                 desired: DesiredDevices | None = None, taints: bool = True,
                 resync: float = DEFAULT_RESYNC, resync_jitter: float = DEFAULT_RESYNC_JITTER,
                 start_jitter: float = 0.0, spacing: float = DEFAULT_SPACING,
                 clock: Callable[[], float] = time.monotonic, sleep: Sleep = asyncio.sleep,
                 rng: random.Random | None = None) -> None:
        self.client = client
        self.driver = driver
        self.node = node
        self.pool = pool
        self.resync = resync
        self.resync_jitter = resync_jitter
        self.start_jitter = start_jitter
        self.damper = Damper(spacing)
        self.published = asyncio.Event()  # set after every successful pass
        self._taints = taints  # until the API server refuses them
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._queue = PoolQueue()
        self._desired = desired
        if desired is not None:
            self._queue.add()
        self._stats = Stats()
        self._known: dict[int, Known] = {}
        self._generation = 0  # the pool's: the highest read, or the last written
        self._owner: OwnerReference | None = None
        self._owner_read = False
        self._stale: list[str] = []  # slices of this node to delete (found by a read)
        self._need_read = True
        self._published_digest: str | None = None
        self._published_down: frozenset[str] = frozenset()  # down in what was published
        self._said = Once()

    # --- what the driver gives and reads ----------------------------------------------

    def update(self, desired: DesiredDevices) -> None:
        """The pool's desired devices from now on; a change is published by the loop."""
        if self._desired is None or desired.digest != self._desired.digest:
            self._queue.add()
        self._desired = desired

    def check(self) -> None:
        """Read the server's copy before the next pass (a starting kubelet deleted it)."""
        self._queue.add(check=True)

    @property
    def stats(self) -> Stats:
        return self._stats

    @property
    def idle(self) -> bool:
        """No pass running or due."""
        return self._queue.idle

    @property
    def published_digest(self) -> str | None:
        """The digest of the desired devices the server holds, as far as we know."""
        return self._published_digest

    @property
    def taints(self) -> bool:
        """Devices are published with their taints (until the API server refuses them)."""
        return self._taints

    def _count(self, **changes: Any) -> None:
        self._stats = dataclasses.replace(self._stats, **changes)

    @property
    def _digest_key(self) -> str:
        return f"{self.driver}/{DEVICES_HASH_ANNOTATION}"

    @property
    def _index_key(self) -> str:
        return f"{self.driver}/{SLICE_INDEX_ANNOTATION}"

    def _say_once(self, reason: str, message: str, *args: object) -> None:
        if self._said.first(reason):
            log.warning(message, *args)

    # --- one pass --------------------------------------------------------------------------

    async def publish(self, desired: DesiredDevices, *, check: bool = False) -> bool:
        """Make the API server hold ``desired``; True when anything was written.

        Without ``check`` (and with nothing that made the server's copy unknown), the
        devices last published cost no API call at all.
        """
        self._desired = desired
        if not check and not self._need_read and self._published_digest == desired.digest:
            return False
        read = check or self._need_read
        for attempt in range(CONFLICT_RETRIES):
            try:
                return await self._sync(desired, read=read)
            except KubeError as exc:
                self._need_read = True  # whatever is there now, look again next time
                if exc.status not in (404, 409) or attempt == CONFLICT_RETRIES - 1:
                    raise
                log.info("ResourceSlice changed under us (%s); reading them again", exc)
                read = True
        return False  # not reached

    async def _read(self) -> None:
        found = [StoredSlice.parse(obj)
                 for obj in await self.client.list_slices(self.node, self.driver)]
        self._count(reads=self._stats.reads + 1)
        self._known, self._stale = {}, []
        unindexed: list[Known] = []
        top = 0
        for s in sorted(found, key=lambda s: s.name):
            if s.pool != self.pool:
                self._stale.append(s.name)  # this node's, but not our pool
                continue
            known = Known(s.name, s.resource_version, s.annotations.get(self._digest_key, ""),
                          s.generation)
            top = max(top, known.generation)
            index_text = s.annotations.get(self._index_key, "")
            if not index_text.isdigit():
                unindexed.append(known)  # written by an older version: taken over below
            elif int(index_text) in self._known:
                self._stale.append(s.name)  # a duplicate
            else:
                self._known[int(index_text)] = known
        free = (i for i in range(len(found) + 1) if i not in self._known)
        for known, index in zip(unindexed, free, strict=False):
            self._known[index] = Known(known.name, known.resource_version, "", known.generation)
        # The pool's generation is the highest any of its slices has: the next one is above.
        self._generation = top
        owners = frozenset().union(*(s.node_owners for s in found))
        # No slice left (a node re-created, the kubelet wiping them), or one owned by
        # another Node object: read the Node again, its UID may have changed.
        if not self._known or (self._owner is not None and owners - {self._owner["uid"]}):
            self._owner_read = False
        self._need_read = False

    async def _read_owner(self) -> None:
        self._owner_read = True
        try:
            node = await self.client.get_node(self.node)
        except KubeError as exc:
            if exc.status == 404:
                self._say_once("node-404", "Node %s not found on the API server: its "
                               "ResourceSlices are published without an owner", self.node)
            elif exc.status == 403:
                self._say_once("node-403", "not allowed to get Node %s (%s): grant get on "
                               "nodes to the driver's ServiceAccount; slices are published "
                               "without an owner meanwhile", self.node, exc)
            else:
                self._owner_read = False
                raise
            self._owner = None
            return
        owner = node_owner(self.node, node)
        if owner is not None:
            if self._owner is not None and self._owner["uid"] != owner["uid"]:
                log.info("Node %s was re-created (UID %s); its slices follow the new object",
                         self.node, owner["uid"])
            self._owner = owner

    def _object(self, index: int, count: int, devices: list[Device], digest: str,
                generation: int, known: Known | None) -> ResourceSlice:
        meta: SliceMeta = {"annotations": {self._digest_key: digest,
                                           self._index_key: str(index)}}
        if self._owner is not None:
            meta["ownerReferences"] = [self._owner.copy()]
        if known is None:
            meta["generateName"] = generate_name(self.node, self.driver, index)
        else:
            meta["name"] = known.name
            meta["resourceVersion"] = known.resource_version
        return {
            "apiVersion": GROUP_VERSION, "kind": "ResourceSlice", "metadata": meta,
            "spec": {"driver": self.driver, "nodeName": self.node,
                     "pool": {"name": self.pool, "generation": generation,
                              "resourceSliceCount": count},
                     "devices": devices},
        }

    def _written(self, desired: DesiredDevices) -> Sequence[Device]:
        """The desired devices as this API server takes them."""
        return desired.devices if self._taints else without_taints(desired.devices)

    async def _sync(self, desired: DesiredDevices, *, read: bool) -> bool:
        if read:
            await self._read()
        if not self._owner_read:
            await self._read_owner()
        devices = self._written(desired)
        chunks = split(devices, taints=self._taints)
        count = len(chunks)
        owner = self._owner["uid"] if self._owner else ""
        digests = [content_digest(c, count, owner) for c in chunks]
        stale = list(self._stale) + [k.name for i, k in self._known.items() if i >= count]
        present = {i: k for i, k in self._known.items() if i < count}
        new = [i for i in range(count) if i not in present]
        changed = [i for i, k in present.items() if k.digest != digests[i]]
        generation = self._generation
        uneven = any(k.generation != generation for k in present.values())
        if new or stale or len(changed) > 1 or uneven or generation == 0:
            generation += 1
            changed = sorted(present)  # every slice carries the new generation
        wrote = False
        # Obsolete slices go first: better no device than one published twice.
        for name in stale:
            await self.client.delete_slice(name)
            log.info("stale ResourceSlice %s of this node deleted", name)
            self._count(deleted=self._stats.deleted + 1)
            wrote = True
        self._stale = []
        self._known = present
        for i in changed:
            obj = self._object(i, count, chunks[i], digests[i], generation, present[i])
            stored = StoredSlice.parse(await self.client.replace_slice(body(obj)))
            self._remember(i, stored, digests[i], generation)
            self._count(updated=self._stats.updated + 1)
            log.info("ResourceSlice %s updated: %d device(s), slice %d of %d, pool "
                     "generation %d", stored.name, len(chunks[i]), i + 1, count, generation)
            wrote = True
        for i in new:
            obj = self._object(i, count, chunks[i], digests[i], generation, None)
            stored = StoredSlice.parse(await self.client.create_slice(body(obj)))
            self._remember(i, stored, digests[i], generation)
            self._count(created=self._stats.created + 1)
            log.info("ResourceSlice %s created: %d device(s), slice %d of %d, pool "
                     "generation %d", stored.name, len(chunks[i]), i + 1, count, generation)
            wrote = True
        self._generation = generation
        self._count(generation=generation)
        self._published_digest = desired.digest
        self._published_down = down_devices(devices)
        return wrote

    def _remember(self, index: int, stored: StoredSlice, digest: str, generation: int) -> None:
        self._known[index] = Known(stored.name, stored.resource_version, digest, generation)

    # --- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Publish whenever the desired devices change or a check is due, until cancelled."""
        queue = self._queue
        if self.start_jitter > 0:
            # A fleet restarting at once (an upgrade, a control plane back) spreads out.
            await self._sleep(self._rng.uniform(0, self.start_jitter))
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX, rng=self._rng)
        while True:
            interval = jittered(self.resync, self.resync_jitter, self._rng) \
                if self.resync > 0 else None
            if not await wait_event(queue.wake, interval):
                queue.add(check=True)
            # Updates arriving meanwhile join this pass, and its last state is what goes out.
            await self._spaced()
            check = queue.take()
            if self._desired is None:
                continue
            queue.running = True
            try:
                wrote = await self.publish(self._desired, check=check)
            except KubeError as exc:
                if exc.status == 422 and "taints" in str(exc) and self._taints:
                    log.warning("the API server refuses device taints (DRADeviceTaints off?); "
                                "marking down HCAs only by their linkState attribute")
                    self._taints = False
                    queue.add(check=True)
                    continue
                message = str(exc)
                if message != self._stats.error:
                    log.error("cannot publish the ResourceSlices: %s; retrying", message)
                self._count(error=message, errors=self._stats.errors + 1)
                await self._retry_later(backoff)
                continue
            except Exception:
                log.exception("publishing the ResourceSlices failed; retrying")
                self._count(errors=self._stats.errors + 1)
                await self._retry_later(backoff)
                continue
            finally:
                queue.running = False
            if wrote:
                self.damper.wrote(self._clock())
            if self._stats.error is not None:
                log.info("ResourceSlices published again")
            self._count(error=None, passes=self._stats.passes + 1)
            backoff.reset()
            self.published.set()

    async def _spaced(self) -> None:
        """Wait out the damper's spacing; devices newly down cut it short.

        The pass after the wait publishes the desired devices of that moment.
        """
        while not self._newly_down():
            hold = self.damper.hold(self._clock())
            if hold <= 0:
                return
            sleeper = asyncio.ensure_future(self._sleep(hold))
            added = asyncio.ensure_future(self._queue.next_add())
            try:
                await asyncio.wait({sleeper, added}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in (sleeper, added):
                    t.cancel()
            if sleeper.done() and not sleeper.cancelled():
                return

    def _newly_down(self) -> bool:
        if self._desired is None:
            return False
        return bool(down_devices(self._written(self._desired)) - self._published_down)

    async def _retry_later(self, backoff: Backoff) -> None:
        await self._sleep(backoff.next())
        self._queue.add(check=True)
