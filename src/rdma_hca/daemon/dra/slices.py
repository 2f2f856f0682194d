"""Keeping this node's ResourceSlices equal to what the driver offers, at a cost a fleet
can carry.

The pool (one per node, named after it) is split over as many slices as the API's limits
need (upstream pkg/apis/resource/types.go: ``ResourceSliceMaxDevices = 128``,
``ResourceSliceMaxDevicesWithTaintsOrConsumesCounters = 64``,
``ResourceSliceMaxAttributesAndCapacitiesPerDevice = 32``). Devices go to slices in name
order, 64 a slice whenever taints may be published (so a port going down never moves a
device to another slice) and 128 otherwise: the same offer always makes the same slices,
and one port changing rewrites the one slice that holds its device.

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
its HCA down until it is stable (``watch.flaps``), so its device stays as it is.

The loop and the driver share a :class:`PublishSignals` (wake-ups, check requests and
the outcome the driver's readiness and metrics read); the loop sees nothing else of the
driver but :class:`PublishHost`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rdma_hca.daemon.dra.devices import DEVICES_HASH_ANNOTATION, DeviceOffer
from rdma_hca.kit.aio import wait_event
from rdma_hca.kit.sayonce import Once
from rdma_hca.kube.errors import KubeError
from rdma_hca.kube.policy import Backoff, Sleep, jittered

log = logging.getLogger(__name__)

GROUP_VERSION = "resource.k8s.io/v1"
SLICE_INDEX_ANNOTATION = "slice-index"  # qualified with the driver name
MAX_DEVICES = 128  # ResourceSliceMaxDevices
MAX_DEVICES_WITH_TAINTS = 64  # ResourceSliceMaxDevicesWithTaintsOrConsumesCounters
MAX_ATTRIBUTES_AND_CAPACITIES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_NAME = 253
CONFLICT_RETRIES = 3
BACKOFF_FIRST = 0.2
BACKOFF_MAX = 10.0
DEFAULT_SPACING = 2.5
DEFAULT_RESYNC = 60.0
DEFAULT_RESYNC_JITTER = 0.2


class SliceClient(Protocol):
    async def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]: ...
    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def delete_slice(self, name: str) -> None: ...
    async def get_node(self, name: str) -> dict[str, Any]: ...


class PublishSignals:
    """What the driver and its publishing loop tell each other."""

    def __init__(self) -> None:
        self.wake = asyncio.Event()  # the offer changed, or a check is asked for
        self.stopping = False
        self.running = False  # a publish pass is under way
        self.error: str | None = None  # why the last pass failed; None after a good one
        self.passes = 0  # successful publish passes, written or not
        self.published = asyncio.Event()  # set after every successful pass
        self._check = True  # read the server's copy first (it may have changed)
        self._poked = asyncio.Event()

    def poke(self, *, check: bool = False) -> None:
        """Publish the offer (after reading the server's copy, with ``check``)."""
        self._check = self._check or check
        self.wake.set()
        self._poked.set()

    async def next_poke(self) -> None:
        """Return at the next poke (the loop's one waiter, while it spaces writes)."""
        self._poked.clear()
        await self._poked.wait()

    def take(self) -> bool:
        """The loop starts a pass: clears the wake-up; whether a check was asked for."""
        self.wake.clear()
        check, self._check = self._check, False
        return check

    @property
    def idle(self) -> bool:
        """No publish pass running or due."""
        return not self.running and not self.wake.is_set()


class PublishHost(Protocol):
    """The driver, as its publishing loop sees it."""

    @property
    def signals(self) -> PublishSignals: ...

    @property
    def offer(self) -> DeviceOffer: ...

    @property
    def taints(self) -> bool: ...

    def drop_taints(self) -> None:
        """The API server refuses device taints: offer the devices without them."""


@dataclass(frozen=True, slots=True)
class Known:
    """A slice as the server holds it after our last write (or read) of it."""

    name: str
    resource_version: str
    digest: str
    generation: int


def fit_device(device: dict[str, Any]) -> dict[str, Any]:
    """The device with at most 32 attributes and capacities together (the first ones kept:
    ours are few, but a longer list must not make the whole slice fail)."""
    attrs = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attrs) + len(capacity) <= MAX_ATTRIBUTES_AND_CAPACITIES:
        return device
    room = MAX_ATTRIBUTES_AND_CAPACITIES - min(len(capacity), MAX_ATTRIBUTES_AND_CAPACITIES)
    out = dict(device)
    out["attributes"] = dict(list(attrs.items())[:room])
    if capacity:
        out["capacity"] = dict(list(capacity.items())[:MAX_ATTRIBUTES_AND_CAPACITIES - room])
    return out


def split(devices: Sequence[dict[str, Any]], *, taints: bool) -> list[list[dict[str, Any]]]:
    """Devices in name order, cut into slices the API server accepts; at least one slice
    (an empty pool still says so)."""
    ordered = sorted((fit_device(dict(d)) for d in devices), key=lambda d: str(d["name"]))
    tainted = any(d.get("taints") for d in ordered)
    per = MAX_DEVICES_WITH_TAINTS if taints or tainted else MAX_DEVICES
    chunks = [ordered[i:i + per] for i in range(0, len(ordered), per)]
    return chunks or [[]]


def _content_digest(devices: Sequence[dict[str, Any]], count: int, owner: str) -> str:
    text = json.dumps([devices, count, owner], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _generate_name(node: str, driver: str, index: int) -> str:
    base = re.sub(r"[^a-z0-9.-]+", "-", f"{node}-{driver}".lower()).strip("-.")
    return f"{base[:MAX_NAME - 20]}-{index}-"


class Damper:
    """Spacing of slice writes: none for the first change of a quiet node, at least
    ``spacing`` seconds between writes while changes keep coming."""

    def __init__(self, spacing: float = DEFAULT_SPACING) -> None:
        self.spacing = spacing
        self.last: float | None = None

    def hold(self, now: float) -> float:
        """Seconds to wait before the next write."""
        if self.last is None:
            return 0.0
        return max(0.0, self.last + self.spacing - now)

    def wrote(self, now: float) -> None:
        self.last = now


class SlicePublisher:
    def __init__(self, client: SliceClient, driver: str, node: str, pool: str, *,
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
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.known: dict[int, Known] = {}
        self.generation = 0
        self.owner: dict[str, Any] | None = None
        self._owner_read = False
        self._stale: list[str] = []  # slices of this node to delete (found by a read)
        self.need_read = True
        self.published_digest: str | None = None
        self.published_down: frozenset[str] = frozenset()  # devices down in what was published
        self.writes = 0  # creates, updates and deletes made, for metrics and benchmarks
        self.reads = 0  # LISTs of this node's slices
        self._said = Once()

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

    async def publish(self, offer: DeviceOffer, *, check: bool = False,
                      taints: bool = True) -> bool:
        """Make the API server hold ``offer``; True when anything was written.

        Without ``check`` (and with nothing that made the server's copy unknown), an offer
        equal to the last one published costs no API call at all.
        """
        if not check and not self.need_read and self.published_digest == offer.digest:
            return False
        read = check or self.need_read
        for attempt in range(CONFLICT_RETRIES):
            try:
                return await self._sync(offer, read=read, taints=taints)
            except KubeError as exc:
                self.need_read = True  # whatever is there now, look again next time
                if exc.status not in (404, 409) or attempt == CONFLICT_RETRIES - 1:
                    raise
                log.info("ResourceSlice changed under us (%s); reading them again", exc)
                read = True
        return False  # not reached

    async def _read(self) -> None:
        slices = await self.client.list_slices(self.node, self.driver)
        self.reads += 1
        self.known, self._stale = {}, []
        unindexed: list[Known] = []
        top = 0
        for s in sorted(slices, key=lambda s: s["metadata"]["name"]):
            meta, spec = s["metadata"], s.get("spec") or {}
            pool = spec.get("pool") or {}
            if pool.get("name") != self.pool:
                self._stale.append(meta["name"])  # this node's, but not our pool
                continue
            annotations = meta.get("annotations") or {}
            known = Known(meta["name"], meta.get("resourceVersion", ""),
                          annotations.get(self._digest_key, ""), int(pool.get("generation") or 0))
            top = max(top, known.generation)
            index_text = annotations.get(self._index_key, "")
            if not index_text.isdigit():
                unindexed.append(known)  # written by an older version: taken over below
            elif int(index_text) in self.known:
                self._stale.append(meta["name"])  # a duplicate
            else:
                self.known[int(index_text)] = known
        free = (i for i in range(len(slices) + 1) if i not in self.known)
        for known, index in zip(unindexed, free, strict=False):
            self.known[index] = Known(known.name, known.resource_version, "", known.generation)
        # The pool's generation is the highest any of its slices has: the next one is above.
        self.generation = top
        owners = {ref.get("uid") for s in slices
                  for ref in s["metadata"].get("ownerReferences") or []
                  if ref.get("kind") == "Node"}
        # No slice left (a node re-created, the kubelet wiping them), or one owned by
        # another Node object: read the Node again, its UID may have changed.
        if not self.known or (self.owner is not None and owners - {self.owner["uid"]}):
            self._owner_read = False
        self.need_read = False

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
            self.owner = None
            return
        uid = node.get("metadata", {}).get("uid")
        if uid:
            if self.owner is not None and self.owner["uid"] != uid:
                log.info("Node %s was re-created (UID %s); its slices follow the new object",
                         self.node, uid)
            self.owner = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid,
                          "controller": True}

    def _object(self, index: int, count: int, devices: list[dict[str, Any]], digest: str,
                generation: int, known: Known | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"annotations": {self._digest_key: digest,
                                                self._index_key: str(index)}}
        if self.owner is not None:
            meta["ownerReferences"] = [dict(self.owner)]
        if known is None:
            meta["generateName"] = _generate_name(self.node, self.driver, index)
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

    async def _sync(self, offer: DeviceOffer, *, read: bool, taints: bool) -> bool:
        if read:
            await self._read()
        if not self._owner_read:
            await self._read_owner()
        chunks = split(offer.devices, taints=taints)
        count = len(chunks)
        owner = self.owner["uid"] if self.owner else ""
        digests = [_content_digest(c, count, owner) for c in chunks]
        stale = list(self._stale) + [k.name for i, k in self.known.items() if i >= count]
        present = {i: k for i, k in self.known.items() if i < count}
        new = [i for i in range(count) if i not in present]
        changed = [i for i, k in present.items() if k.digest != digests[i]]
        uneven = any(k.generation != self.generation for k in present.values())
        generation = self.generation
        if new or stale or len(changed) > 1 or uneven or generation == 0:
            generation += 1
            changed = sorted(present)  # every slice carries the new generation
        wrote = False
        # Obsolete slices go first: better no device than one published twice.
        for name in stale:
            await self.client.delete_slice(name)
            log.info("stale ResourceSlice %s of this node deleted", name)
            self.writes += 1
            wrote = True
        self._stale = []
        self.known = present
        for i in changed:
            obj = self._object(i, count, chunks[i], digests[i], generation, present[i])
            stored = await self.client.replace_slice(obj)
            self._remember(i, stored, digests[i], generation)
            log.info("ResourceSlice %s updated: %d device(s), slice %d of %d, pool "
                     "generation %d", stored["metadata"]["name"], len(chunks[i]), i + 1, count,
                     generation)
            wrote = True
        for i in new:
            obj = self._object(i, count, chunks[i], digests[i], generation, None)
            stored = await self.client.create_slice(obj)
            self._remember(i, stored, digests[i], generation)
            log.info("ResourceSlice %s created: %d device(s), slice %d of %d, pool "
                     "generation %d", stored["metadata"]["name"], len(chunks[i]), i + 1, count,
                     generation)
            wrote = True
        self.generation = generation
        self.published_digest = offer.digest
        self.published_down = down_devices(offer.devices)
        return wrote

    def _remember(self, index: int, stored: dict[str, Any], digest: str,
                  generation: int) -> None:
        meta = stored["metadata"]
        self.known[index] = Known(meta["name"], meta.get("resourceVersion", ""), digest,
                                  generation)
        self.writes += 1

    # --- the loop --------------------------------------------------------------------------

    async def run(self, host: PublishHost) -> None:
        """Publish whenever the host's offer changes or a check is due, until it stops."""
        signals = host.signals
        if self.start_jitter > 0:
            # A fleet restarting at once (an upgrade, a control plane back) spreads out.
            await self._sleep(self._rng.uniform(0, self.start_jitter))
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX, rng=self._rng)
        while not signals.stopping:
            interval = jittered(self.resync, self.resync_jitter, self._rng) \
                if self.resync > 0 else None
            if not await wait_event(signals.wake, interval):
                signals.poke(check=True)
            # Changes arriving meanwhile join this pass, and its last state is what goes out.
            await self._spaced(host)
            check = signals.take()
            signals.running = True
            try:
                wrote = await self.publish(host.offer, check=check, taints=host.taints)
            except KubeError as exc:
                if exc.status == 422 and "taints" in str(exc) and host.taints:
                    log.warning("the API server refuses device taints (DRADeviceTaints off?); "
                                "marking down HCAs only by their linkState attribute")
                    host.drop_taints()
                    signals.poke(check=True)
                    continue
                message = str(exc)
                if message != signals.error:
                    log.error("cannot publish the ResourceSlices: %s; retrying", message)
                signals.error = message
                await self._retry_later(signals, backoff)
                continue
            except Exception:
                log.exception("publishing the ResourceSlices failed; retrying")
                await self._retry_later(signals, backoff)
                continue
            finally:
                signals.running = False
            if wrote:
                self.damper.wrote(self._clock())
            if signals.error is not None:
                log.info("ResourceSlices published again")
            signals.error = None
            backoff.reset()
            signals.passes += 1
            signals.published.set()

    async def _spaced(self, host: PublishHost) -> None:
        """Wait out the damper's spacing; an offer with a device newly down cuts it short.

        The pass after the wait publishes the offer of that moment.
        """
        while not self._newly_down(host.offer):
            hold = self.damper.hold(self._clock())
            if hold <= 0:
                return
            sleeper = asyncio.ensure_future(self._sleep(hold))
            poked = asyncio.ensure_future(host.signals.next_poke())
            try:
                await asyncio.wait({sleeper, poked}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in (sleeper, poked):
                    t.cancel()
            if sleeper.done() and not sleeper.cancelled():
                return

    def _newly_down(self, offer: DeviceOffer) -> bool:
        return bool(down_devices(offer.devices) - self.published_down)

    async def _retry_later(self, signals: PublishSignals, backoff: Backoff) -> None:
        await self._sleep(backoff.next())
        signals.poke(check=True)


def down_devices(devices: Sequence[dict[str, Any]]) -> frozenset[str]:
    """Names of the devices that are tainted or whose linkState says down."""
    out = []
    for d in devices:
        state = next((v.get("string") for k, v in (d.get("attributes") or {}).items()
                      if k.endswith("/linkState")), None)
        if d.get("taints") or state == "down":
            out.append(str(d["name"]))
    return frozenset(out)
