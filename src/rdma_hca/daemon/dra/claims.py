"""Preparing and unpreparing claims: typed records in, CDI specs and checkpoint out.

Claims are independent, so nothing here is global: a call's claims are worked on
concurrently, each claim under a lock of its own (an asyncio lock in this process, a
record lock in ``claims.lock`` against another instance of the driver), and in
exclusive mode each device under one too. A claim this instance prepared answers at
once, with no lock, file or API call (during a rolling update, until the other
instance writes the checkpoint: then each claim is looked up there again). Whatever a
Prepare writes is undone when it fails: a claim is prepared when both its CDI spec and
its checkpoint entry are on disk, or neither is.

The API server's ResourceClaim is parsed into a :class:`Claim` at the edge; nothing
past :func:`parse_claim` looks at the dict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from rdma_hca.contract.cdi import cdi_id
from rdma_hca.contract.checkpoint import (
    CHECKPOINT_VERSION,
    CheckpointError,
    Claims,
    PreparedClaim,
    PreparedDevice,
    Share,
)
from rdma_hca.contract.dra import BANDWIDTH
from rdma_hca.daemon.dra import files, metadata
from rdma_hca.daemon.dra.checkpoint import Checkpoint
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.follow import CheckpointFollower
from rdma_hca.daemon.dra.groupcommit import GroupCommit
from rdma_hca.daemon.offer.shared import every_usable
from rdma_hca.kit.aio import cancel_all
from rdma_hca.kit.histogram import Histogram
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kit.quantity import QuantityError, parse_quantity
from rdma_hca.kit.sayonce import Once
from rdma_hca.kit.text import short_repr
from rdma_hca.node.model import CharDevice, Hca
from rdma_hca.settings.model import Mode

log = logging.getLogger(__name__)

T = TypeVar("T")
LOCK_RETRY_FIRST = 0.005
LOCK_RETRY_MAX = 0.1
# One claim's Prepare: a cached answer in microseconds, an API read and two file writes in
# milliseconds, a lock held by another instance or a slow API server in seconds.
PREPARE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0)


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it in a call."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One entry of ``status.allocation.devices.results``."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    # consumedCapacity: what this share takes of the device's capacities, by name.
    consumed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Claim:
    """A ResourceClaim, as far as the driver reads it."""

    namespace: str
    name: str
    uid: str
    devices: tuple[AllocatedDevice, ...]  # every driver's
    # The object as read: what a status write starts from, saving a read of its own.
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def of(self, driver: str) -> tuple[AllocatedDevice, ...]:
        return tuple(d for d in self.devices if d.driver == driver)


class ClaimError(ValueError):
    """The claim cannot be prepared here; the message says why."""


def _text(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise ClaimError(f"{where} has no {key}")
    return value


def parse_claim(obj: object) -> Claim:
    """The API server's ResourceClaim object as a :class:`Claim`."""
    if not isinstance(obj, Mapping):
        raise ClaimError(f"the API server answered {short_repr(obj)}, not a ResourceClaim")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ClaimError("the ResourceClaim has no metadata")
    namespace = str(meta.get("namespace") or "")
    name = _text(meta, "name", "the ResourceClaim")
    uid = _text(meta, "uid", f"ResourceClaim {namespace}/{name}")
    status = obj.get("status") or {}
    allocation = (status.get("allocation") or {}) if isinstance(status, Mapping) else {}
    results = ((allocation.get("devices") or {}).get("results") or []
               if isinstance(allocation, Mapping) else [])
    devices = []
    for r in results if isinstance(results, list) else []:
        if not isinstance(r, Mapping):
            continue
        share = r.get("shareID")
        consumed = r.get("consumedCapacity")
        devices.append(AllocatedDevice(
            str(r.get("request", "")), str(r.get("driver", "")), str(r.get("pool", "")),
            str(r.get("device", "")), str(share) if share else None,
            {str(k): str(v) for k, v in consumed.items()}
            if isinstance(consumed, Mapping) else {}))
    return Claim(namespace, name, uid, tuple(devices), obj)


def _bandwidth(r: AllocatedDevice, driver: str) -> int:
    """Bits per second of the device's bandwidth the share consumed (0: none asked)."""
    text = r.consumed.get(f"{driver}/{BANDWIDTH}")
    if text is None:
        return 0
    try:
        bits = int(parse_quantity(text))  # whole bits, rounded up as the API's Value()
    except QuantityError as exc:
        raise ClaimError(f"the allocation of device {r.device} consumed {text!r} of "
                         f"{driver}/{BANDWIDTH}, which is not a quantity: {exc}") from exc
    if bits < 0:
        raise ClaimError(f"the allocation of device {r.device} consumed a negative "
                         f"{driver}/{BANDWIDTH} ({text})")
    return bits


def _claim_field(ref: ClaimRef) -> str:
    """``namespace/name`` for the logs' claim field, bounded: the kubelet's call is input."""
    return f"{ref.namespace}/{ref.name}"[:MAX_CLAIM_FIELD]


MAX_CLAIM_FIELD = 320  # a namespace (63) and a name (253), and the slash


class ClaimReader(Protocol):
    """The part of the driver's ``ApiClient`` that claims use."""

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...


PreparedHook = Callable[[Claim, tuple[PreparedDevice, ...]], Awaitable[None]]
UnpreparedHook = Callable[[ClaimRef], Awaitable[None]]


class ClaimKeeper:
    """``load()`` at start, then ``prepare``/``unprepare``; ``hcas`` follow the offer."""

    def __init__(self, config: DriverConfig, io: OffLoop, *,
                 on_prepared: PreparedHook | None = None,
                 on_unprepared: UnpreparedHook | None = None) -> None:
        self.config = config
        self.api: ClaimReader | None = None
        self.hcas: Mapping[str, Hca] = {}  # device name -> HCA, of the current offer
        self.groups: Mapping[str, Sequence[Hca]] = {}  # the node-wide device -> its HCAs
        self.rdma_cm: CharDevice | None = None
        self.prepared: Claims = {}
        self.on_prepared = on_prepared
        self.on_unprepared = on_unprepared
        # Told of each claim not prepared (the claim, the error, the object when it was
        # read); must not wait.
        self.on_prepare_failed: Callable[[ClaimRef, str, Mapping[str, Any] | None], None] \
            | None = None
        self._read: dict[str, Mapping[str, Any]] = {}  # UID -> the object, while preparing
        self.checkpoint = Checkpoint(config.checkpoint, config.lock_path,
                                     deadline=config.read_deadline)
        self.commits = GroupCommit(self.checkpoint, self._run, lambda: self.prepared)
        self.follower = CheckpointFollower(self.checkpoint, self._run, self._followed,
                                           backstop=config.socket_check_seconds)
        self.hook_failures = 0
        self.lock_waits = 0  # times a claim's lock was held by another instance
        self.device_waits = 0  # times an exclusive device was busy with another claim
        self._io = io
        self._verified: set[str] = set()  # claims whose spec this process wrote or saw
        self._locks: dict[str, asyncio.Lock] = {}
        self._lock_users: dict[str, int] = {}
        self._device_locks: dict[str, asyncio.Lock] = {}
        self._hooks: dict[str, asyncio.Task[None]] = {}
        self._hook_said = Once()
        self._tasks: list[asyncio.Task[None]] = []
        self.foreign_writes = 0  # checkpoint writes by another instance seen
        # Outcomes per claim, for /metrics: the kubelet's gRPC metrics see one OK call
        # for an answer that carries an error for a claim inside it.
        self.prepare_results = {"ok": 0, "error": 0}
        self.unprepare_results = {"ok": 0, "error": 0}
        self.prepare_seconds = Histogram(PREPARE_BUCKETS)

    @property
    def _rolling(self) -> bool:
        """Another instance may share the checkpoint (a rolling update is possible)."""
        return bool(self.config.pod_uid)

    async def _run(self, what: str, fn: Callable[[], T]) -> T:
        """Blocking file work off the loop, on the daemon's threads, within the deadline.

        Not the loop's default executor: a write stuck on a hung filesystem would keep
        ``asyncio.run`` from returning at exit, and so SIGTERM from ending the process.
        """
        return await self._io.run(what, fn)

    # --- start ----------------------------------------------------------------------

    async def load(self) -> None:
        """Read the checkpoint; rebuild it from our CDI specs when it is lost or corrupt."""
        path = self.config.checkpoint
        await self._run(f"opening {self.config.lock_path}", self.checkpoint.open)
        try:
            claims, version = await self._run(f"reading the checkpoint {path}",
                                              self.checkpoint.read)
            problem = None
        except CheckpointError as exc:
            claims, version, problem = {}, CHECKPOINT_VERSION, str(exc)
            aside = path + ".corrupt"
            with contextlib.suppress(OSError):
                await self._run(f"moving {path} aside", lambda: os.replace(path, aside))
            problem += f" (moved aside to {aside})"
        if problem is not None or not claims:
            specs = await self._run(
                f"reading the CDI specs in {self.config.cdi_spec_dir}",
                lambda: files.read_claim_specs(self.config.cdi_spec_dir,
                                               self.config.driver_name))
            if problem is not None or specs:
                log.error("%s; rebuilt %d prepared claim(s) from this driver's CDI specs in %s",
                          problem or f"the checkpoint {path} is missing",
                          len(specs), self.config.cdi_spec_dir)
                claims = await self._save_merged(specs)
        elif version != CHECKPOINT_VERSION:
            claims = await self._save_merged(claims)
            log.info("checkpoint %s migrated from version %d to %d", path, version,
                     CHECKPOINT_VERSION)
        self.prepared = dict(claims)
        if self.prepared:
            log.info("%d prepared claim(s) in the checkpoint", len(self.prepared))

    async def _save_merged(self, claims: Claims) -> Claims:
        def merge(on_disk: Claims) -> None:
            for uid, c in claims.items():
                on_disk.setdefault(uid, c)

        return await self._run(f"writing the checkpoint {self.config.checkpoint}",
                               lambda: self.checkpoint.update(merge, claims, force=True))

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks)

    def start(self) -> None:
        """With another instance possible, follow its writes of the checkpoint."""
        if self._rolling:
            self._tasks = [asyncio.create_task(self.follower.run(),
                                               name="dra-checkpoint-watch")]

    def _followed(self, claims: Claims | None, foreign: bool) -> None:
        """A version of the checkpoint (None: unreadable), written by another instance?"""
        if foreign:
            # What this instance prepared may have been unprepared by the other one.
            self.foreign_writes += 1
            self._verified.clear()
        if claims is not None:
            self.prepared = claims

    async def close(self) -> None:
        await cancel_all(self._tasks)
        self._tasks = []
        hooks = list(self._hooks.values())
        for t in hooks:
            t.cancel()
        if hooks:
            await asyncio.wait(hooks, timeout=1.0)
        self.checkpoint.close()

    async def hooks_done(self) -> None:
        """Wait until every hook started so far has run (tests, a clean stop)."""
        while self._hooks:
            await asyncio.wait(list(self._hooks.values()))

    # --- locks ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _claim_locked(self, uid: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(uid, asyncio.Lock())
        self._lock_users[uid] = self._lock_users.get(uid, 0) + 1
        try:
            async with lock:
                await self._lock_across_instances(uid)
                try:
                    yield
                finally:
                    await self._run(f"unlocking claim {uid}",
                                    lambda: self.checkpoint.unlock_claim(uid))
        finally:
            self._lock_users[uid] -= 1
            if not self._lock_users[uid]:
                del self._lock_users[uid]
                del self._locks[uid]

    async def _lock_across_instances(self, uid: str) -> None:
        """The claim's record lock, waited for at most one read deadline.

        Tried without blocking, again and again: a thread blocked in ``lockf`` could not
        be given up on, and would take the lock after we had stopped waiting for it.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.read_deadline
        delay = LOCK_RETRY_FIRST
        while not await self._run(f"locking claim {uid}",
                                  lambda: self.checkpoint.try_lock_claim(uid)):
            self.lock_waits += 1
            if loop.time() >= deadline:
                raise ClaimError(f"another instance of the driver has been working on this "
                                 f"claim for {self.config.read_deadline:g} s (its lock in "
                                 f"{self.config.lock_path})")
            await asyncio.sleep(delay)
            delay = min(delay * 2, LOCK_RETRY_MAX)

    @contextlib.asynccontextmanager
    async def _devices_locked(self, devices: Sequence[str]) -> AsyncIterator[None]:
        """In exclusive mode a device is in one claim at a time: its claims take turns."""
        if self.config.mode is not Mode.EXCLUSIVE:
            yield
            return
        async with contextlib.AsyncExitStack() as stack:
            for name in sorted(set(devices)):  # one order everywhere: no deadlock
                lock = self._device_locks.setdefault(name, asyncio.Lock())
                if lock.locked():
                    self.device_waits += 1
                await stack.enter_async_context(lock)
            yield

    # --- prepare --------------------------------------------------------------------

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
        known = self.prepared.get(ref.uid)
        if known is not None and ref.uid in self._verified:
            return PrepareResult(known.devices)
        try:
            async with self._claim_locked(ref.uid):
                return await self._prepare_locked(ref)
        except Exception as exc:
            source = self._read.get(ref.uid)
            log.warning("claim %s/%s (%s) not prepared: %s", short_repr(ref.namespace),
                        short_repr(ref.name), short_repr(ref.uid), exc,
                        extra={"claim": _claim_field(ref)})
            error = str(exc) or type(exc).__name__
            if self.on_prepare_failed is not None:
                self.on_prepare_failed(ref, error, source)
            return PrepareResult(error=error)
        finally:
            self._read.pop(ref.uid, None)

    async def _prepare_locked(self, ref: ClaimRef) -> PrepareResult:
        uid = ref.uid
        known = self.prepared.get(uid)
        if self._rolling:
            # The other instance may have prepared (or unprepared) it meanwhile.
            on_disk, _ = await self._run(f"reading the checkpoint {self.config.checkpoint}",
                                         self.checkpoint.read)
            known = on_disk.get(uid)
            if known is None:
                self.prepared.pop(uid, None)
            else:
                self.prepared[uid] = known
        if known is not None:
            await self._ensure_spec(uid, known)
            self._verified.add(uid)
            return PrepareResult(known.devices)
        if self.api is None:
            raise RuntimeError("the driver is not started")
        claim = parse_claim(await self.api.get_claim(ref.namespace, ref.name))
        self._read[uid] = claim.source
        if claim.uid != uid:
            raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name} has UID {claim.uid}, "
                             f"not {uid}: it was deleted and created again")
        prepared, hcas = self._plan(claim)
        meta, spec = self._files_of(uid, prepared, hcas, metadata.pod_claim_name(claim.source))
        spec_dir, driver = self.config.cdi_spec_dir, self.config.driver_name

        def write_files() -> None:
            metadata.write(meta)  # before the spec that mounts them
            try:
                files.write_claim_spec(spec_dir, driver, uid, spec)
            except BaseException:
                metadata.undo(meta)
                raise

        def undo_files() -> None:
            files.remove_claim_spec(spec_dir, driver, uid)
            metadata.undo(meta)

        async with self._devices_locked([d.device for d in prepared.devices]):
            try:
                await self._run(f"writing the CDI spec of claim {uid}", write_files)
                try:
                    # Answered once the entry is durable, in the batch of its moment.
                    await self.commits.apply(lambda c: c.__setitem__(uid, prepared))
                except BaseException:
                    # Without its checkpoint entry a restart would forget the claim: undo.
                    await self._run(f"removing the CDI spec of claim {uid}", undo_files)
                    raise
            except OSError as exc:
                raise ClaimError(f"cannot write the CDI spec or the checkpoint: {exc}") from exc
        self.prepared[uid] = prepared
        self._verified.add(uid)
        log.info("claim %s/%s prepared: %s", ref.namespace, ref.name,
                 ", ".join(f"{d.device} ({d.hca})" for d in prepared.devices),
                 extra={"claim": _claim_field(ref)})
        if self.on_prepared is not None:
            hook = self.on_prepared
            self._hook(uid, "on_prepared", lambda: hook(claim, prepared.devices))
        return PrepareResult(prepared.devices)

    def _plan(self, claim: Claim) -> tuple[PreparedClaim, dict[str, tuple[Hca, ...]]]:
        driver, pool = self.config.driver_name, self.config.pool_name
        ours = claim.of(driver)
        if not ours:
            raise ClaimError(f"ResourceClaim {claim.namespace}/{claim.name} has no device of "
                             f"driver {driver} allocated")
        hcas: dict[str, tuple[Hca, ...]] = {}
        devices: dict[str, PreparedDevice] = {}
        for r in ours:
            if r.pool != pool:
                raise ClaimError(f"device {r.device} was allocated from pool {r.pool}, not "
                                 f"from this node's pool {pool}")
            if r.device not in hcas:
                hcas[r.device] = self._hcas_of(r.device, None)
            shares = (Share(r.share_id, _bandwidth(r, driver)),) if r.share_id else ()
            known = devices.get(r.device)
            if known is None:
                devices[r.device] = PreparedDevice(
                    (r.request,), pool, r.device, ",".join(h.name for h in hcas[r.device]),
                    (cdi_id(driver, claim.uid, r.device),), shares)
            else:
                # A shared device can be in one claim twice (two requests, or rdma/hca: 2
                # on the node-wide device; each with its share ID): one CDI device for every
                # request that got it, holding what all of them consumed.
                devices[r.device] = replace(
                    known, request_names=tuple(dict.fromkeys((*known.request_names,
                                                              r.request))),
                    shares=known.shares + shares)
        return PreparedClaim(claim.namespace, claim.name, tuple(devices.values())), hcas

    def _hcas_of(self, device: str, hca_name: str | None) -> tuple[Hca, ...]:
        """The HCAs a device gives: its own, or for the node-wide device every usable HCA
        now (``offer.shared``: what a device plugin slot gives)."""
        group = self.groups.get(device)
        if group is None:
            return (self._hca(device, hca_name),)
        usable = every_usable(group)
        if not usable:
            why = "; ".join(p for h in group for p in h.problems) or "no verbs device node"
            raise ClaimError(f"device {device} stands for every HCA of this node, and none "
                             f"can be used now: {why}")
        return usable

    def _hca(self, device: str, hca_name: str | None) -> Hca:
        hca = self.hcas.get(device)
        if hca is None or (hca_name is not None and hca.name != hca_name):
            raise ClaimError(f"device {device} ({hca_name or 'HCA'}) is no longer on this node")
        if not hca.usable:
            raise ClaimError(f"device {device} ({hca.name}) cannot be used: "
                             f"{'; '.join(hca.problems) or 'its verbs device node is missing'}")
        return hca

    async def _ensure_spec(self, uid: str, claim: PreparedClaim) -> None:
        """/var/run is a tmpfs: after a reboot the spec is gone but the claim is not."""
        driver, spec_dir = self.config.driver_name, self.config.cdi_spec_dir
        path = files.cdi_spec_path(spec_dir, driver, uid)
        if await self._run(f"looking for {path}", lambda: os.path.exists(path)):
            return
        hcas = {d.device: self._hcas_of(d.device, d.hca) for d in claim.devices}
        pod_claim = (await self._run(
            "reading the device metadata of claim " + uid,
            lambda: metadata.written_pod_claim(self.config.plugin_dir, claim))
            if metadata.versions(self.config.device_metadata) else None)
        meta, spec = self._files_of(uid, claim, hcas, pod_claim)

        def write() -> None:
            metadata.write(meta)
            files.write_claim_spec(spec_dir, driver, uid, spec)

        await self._run(f"writing {path}", write)

    def _files_of(self, uid: str, claim: PreparedClaim, hcas: Mapping[str, Sequence[Hca]],
                  pod_claim: str | None) -> tuple[metadata.Plan, dict[str, Any]]:
        """A claim's device metadata files and its CDI spec, from one env (the spec's
        devices set it, and the metadata files repeat it)."""
        every = {h.name: h for hs in hcas.values() for h in hs}
        env = files.claim_env(list(every.values()), self.config.env, claim)
        meta = metadata.plan(self.config.device_metadata, self.config.driver_name,
                             self.config.plugin_dir, uid, claim, hcas, env, pod_claim,
                             self.groups.keys())
        spec = files.claim_spec(self.config.driver_name, uid, claim, hcas, self.rdma_cm, env,
                                meta.mounts)
        return meta, spec

    # --- unprepare ------------------------------------------------------------------

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Each claim's error by UID ("" when done); concurrently, like ``prepare``."""
        unique = list({r.uid: r for r in refs}.values())
        errors = await asyncio.gather(*(self._unprepare(r) for r in unique))
        for e in errors:
            self.unprepare_results["error" if e else "ok"] += 1
        return {r.uid: e for r, e in zip(unique, errors, strict=True)}

    async def _unprepare(self, ref: ClaimRef) -> str:
        uid = ref.uid
        driver, spec_dir = self.config.driver_name, self.config.cdi_spec_dir
        known_here = uid in self.prepared

        def remove_files() -> None:
            # Removed even when unknown: a crash may fall between spec and checkpoint.
            files.remove_claim_spec(spec_dir, driver, uid)
            metadata.remove(self.config.plugin_dir, ref.namespace, ref.name, uid)

        def drop(claims: Claims) -> bool:
            return claims.pop(uid, None) is not None

        known = self.prepared.get(uid)
        devices = [d.device for d in known.devices] if known is not None else []
        try:
            async with self._claim_locked(uid), self._devices_locked(devices):
                await self._run(f"removing the CDI spec of claim {uid}", remove_files)
                was = (await self.commits.apply(drop)
                       if known_here or self._rolling else False)
        except Exception as exc:
            log.warning("claim %s/%s (%s) not unprepared: %s", short_repr(ref.namespace),
                        short_repr(ref.name), short_repr(uid), exc,
                        extra={"claim": _claim_field(ref)})
            return f"cannot remove the CDI spec or the checkpoint entry: {exc}"
        had = self.prepared.pop(uid, None) is not None
        self._verified.discard(uid)
        if had or was:
            log.info("claim %s/%s unprepared", ref.namespace, ref.name,
                     extra={"claim": _claim_field(ref)})
            if self.on_unprepared is not None:
                hook = self.on_unprepared
                self._hook(uid, "on_unprepared", lambda: hook(ref))
        return ""

    # --- hooks ----------------------------------------------------------------------

    def _hook(self, uid: str, what: str, call: Callable[[], Awaitable[None]]) -> None:
        """Run a hook after the call answered, after the claim's earlier hooks.

        A failing hook never fails the call: it is said once per distinct reason.
        """
        before = self._hooks.get(uid)

        async def run() -> None:
            if before is not None:
                await asyncio.wait({before})
            try:
                await call()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.hook_failures += 1
                reason = f"{what}: {type(exc).__name__}: {exc}"
                if self._hook_said.first(reason):
                    log.warning("claim %s: the %s hook failed (%s); the claim stays prepared",
                                uid, what, reason)
            finally:
                if self._hooks.get(uid) is task:
                    del self._hooks[uid]

        task = asyncio.create_task(run(), name=f"dra-{what}-{uid}")
        self._hooks[uid] = task
