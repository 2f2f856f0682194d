"""Preparing and unpreparing claims: typed claims in, CDI specs and checkpoint out.

The driver proper behind the helper's seam (``kubeletplugin.plugin.DriverPlugin``): the
helper holds the lock of each claim of a call and hands them over in one batch, each
as read from the API server or, when on record, as the kubelet named it. Here the fast
path is decided: a claim prepared and verified answers from memory, one on the record
(``prepared.PreparedClaims``, which owns what is prepared) from the record, and only a
claim on no record is planned and written (read first, through the helper's ``fetch``,
when the helper had no reason to). In exclusive mode each device is under a lock too.
Whatever a Prepare writes is undone when it fails: a claim is prepared when both its CDI
spec and its checkpoint entry are on disk, or neither is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from rdma_hca.contract.cdi import cdi_id
from rdma_hca.contract.checkpoint import PreparedClaim, PreparedDevice, Share
from rdma_hca.contract.dra import BANDWIDTH
from rdma_hca.daemon.dra import files, metadata
from rdma_hca.daemon.dra.claims import (
    AllocatedDevice,
    AllocationUnreadable,
    Claim,
    ClaimError,
    ClaimRef,
    HcaGone,
    HcaUnusable,
    NotAllocatedHere,
    claim_field,
)
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.daemon.dra.groupcommit import Files, Staging
from rdma_hca.daemon.dra.hooks import ClaimHooks
from rdma_hca.daemon.dra.kubeletplugin.plugin import FetchClaim, PrepareResult
from rdma_hca.daemon.dra.prepared import PreparedClaims
from rdma_hca.daemon.offer.shared import every_usable
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kit.quantity import QuantityError, parse_quantity
from rdma_hca.kit.text import short_repr
from rdma_hca.node.model import Hca
from rdma_hca.settings.model import Mode

log = logging.getLogger(__name__)


def _bandwidth(r: AllocatedDevice, driver: str) -> int:
    """Bits per second of the device's bandwidth the share consumed (0: none asked)."""
    text = r.consumed.get(f"{driver}/{BANDWIDTH}")
    if text is None:
        return 0
    try:
        bits = int(parse_quantity(text))  # whole bits, rounded up as the API's Value()
    except QuantityError as exc:
        raise AllocationUnreadable(f"the allocation of device {r.device} consumed {text!r} of "
                                   f"{driver}/{BANDWIDTH}, which is not a quantity: {exc}"
                                   ) from exc
    if bits < 0:
        raise AllocationUnreadable(f"the allocation of device {r.device} consumed a negative "
                                   f"{driver}/{BANDWIDTH} ({text})")
    return bits


# A claim on no record: its entry, its files (write, undo), its spec staged (flush, discard).
Work = tuple[PreparedClaim, Files, Staging]


class SpecNotWritten(ClaimError):
    fix = ("the node's CDI directory or the driver's checkpoint cannot be written; check "
           "the disk and the driver's cdi mount, then the kubelet tries again")


class ClaimPreparer:
    """The driver proper: prepare and unprepare, on the record of :class:`PreparedClaims`."""

    def __init__(self, config: DriverConfig, io: OffLoop, prepared: PreparedClaims, *,
                 offer: Callable[[], DeviceOffer], hooks: ClaimHooks) -> None:
        """``offer``: the devices offered now (their HCAs, the node-wide device's group,
        rdma_cm); ``hooks``: told of each claim prepared and unprepared, after the call
        answered."""
        self.config = config
        self.prepared = prepared
        self.hooks = hooks
        self._io = io
        self._offer = offer
        self._device_locks: dict[str, asyncio.Lock] = {}
        self.device_waits = 0  # times an exclusive device was busy with another claim

    # --- the seam ---------------------------------------------------------------------

    async def prepare_claims(self, claims: Sequence[Claim | ClaimRef],
                             fetch: FetchClaim) -> dict[str, PrepareResult]:
        if len(claims) == 1:  # the kubelet's usual call: no task to gather
            return {claims[0].uid: await self._prepare(claims[0], fetch)}
        results = await asyncio.gather(*(self._prepare(c, fetch) for c in claims))
        return {c.uid: r for c, r in zip(claims, results, strict=True)}

    async def unprepare_claims(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        errors = await asyncio.gather(*(self._unprepare(r) for r in claims))
        return {r.uid: e for r, e in zip(claims, errors, strict=True)}

    # --- prepare ----------------------------------------------------------------------

    async def _prepare(self, claim: Claim | ClaimRef, fetch: FetchClaim) -> PrepareResult:
        try:
            return await self._prepare_one(claim, fetch)
        except Exception as exc:
            return PrepareResult.failed(exc)

    async def _prepare_one(self, item: Claim | ClaimRef, fetch: FetchClaim) -> PrepareResult:
        uid = item.uid
        known = self.prepared.verified(uid)
        if known is not None:
            return PrepareResult(known.devices)
        if self.prepared.shared and uid not in self.prepared:
            return await self._prepare_unseen(item, fetch)
        # On the record here, or (shared) read again: the other instance may have
        # unprepared it meanwhile.
        known = await self.prepared.look_up(uid)
        if known is not None:
            return await self._from_record(uid, known)
        return await self._prepare_claim(item if isinstance(item, Claim) else await fetch(item))

    async def _prepare_unseen(self, item: Claim | ClaimRef, fetch: FetchClaim) -> PrepareResult:
        """Beside another instance, a claim this one has not seen on the shared record: most
        likely new, so it is read and planned at once, and the record is looked at when
        its entry is written (read under the file's lock, in the same hand-off to a
        thread): an entry found there, written by the other instance before this one took
        the claim's lock, is the answer, and nothing of this one's is written."""
        try:
            claim = item if isinstance(item, Claim) else await fetch(item)
            work = self._work_of(claim)
        except Exception:
            # Not to be prepared as read; but if the other instance prepared it, it is.
            known = await self.prepared.look_up(item.uid)
            if known is None:
                raise
            return await self._from_record(item.uid, known)
        return await self._commit(claim, work)

    async def _prepare_claim(self, claim: Claim) -> PrepareResult:
        """A claim on no record: planned, its files and entry written."""
        return await self._commit(claim, self._work_of(claim))

    async def _from_record(self, uid: str, known: PreparedClaim) -> PrepareResult:
        """The answer of a claim on the record, its spec written again if it is gone."""
        await self._ensure_spec(uid, known)
        self.prepared.verify(uid)
        return PrepareResult(known.devices)

    def _work_of(self, claim: Claim) -> Work:
        """What a claim on no record gets: its entry, its files (written, undone) and its
        CDI spec staged (flushed to a temp file while the checkpoint is written)."""
        uid = claim.uid
        prepared, hcas = self._plan(claim)
        prepared = files.with_config(prepared, claim.device_configs(self.config.driver_name))
        meta, spec = self._files_of(uid, prepared, hcas, claim.pod_claim)
        spec_dir, driver = self.config.cdi_spec_dir, self.config.driver_name
        staged = files.staged_claim_spec(spec_dir, driver, uid, spec)

        def write_files() -> None:
            metadata.write(meta)  # before the spec that mounts them
            try:
                staged.place()
            except BaseException:
                metadata.undo(meta)
                raise

        def undo_files() -> None:
            files.remove_claim_spec(spec_dir, driver, uid)
            metadata.undo(meta)

        return prepared, (write_files, undo_files), (staged.flush, staged.discard)

    async def _commit(self, claim: Claim, work: Work) -> PrepareResult:
        uid = claim.uid
        prepared, own_files, staging = work
        async with self._devices_locked(prepared.devices):
            try:
                # Answered once the entry is durable, in the batch of its moment; the files
                # are put in place on its thread just before its rename (the spec flushed
                # meanwhile on another), and undone there when the entry is not written
                # (without it a restart would forget the claim).
                found = await self.prepared.add(uid, prepared, own_files, staging=staging,
                                                unless_recorded=self.prepared.shared)
            except OSError as exc:
                raise SpecNotWritten(f"cannot write the CDI spec or the checkpoint: {exc}") \
                    from exc
        if found is not None:
            return await self._from_record(uid, found)
        log.info("claim %s/%s prepared: %s", claim.namespace, claim.name,
                 ", ".join(f"{d.device} ({d.hca})" for d in prepared.devices),
                 extra={"claim": claim_field(claim.ref)})
        self.hooks.prepared(claim, prepared.devices)
        return PrepareResult(prepared.devices)

    @contextlib.asynccontextmanager
    async def _devices_locked(self, devices: Sequence[PreparedDevice]) -> AsyncIterator[None]:
        """In exclusive mode a device is in one claim at a time: its claims take turns.
        A device given with admin access is in no one's turn: it waits for no claim
        holding the HCA, and none waits for it."""
        held = {d.device for d in devices if not d.admin_access}
        if self.config.mode is not Mode.EXCLUSIVE or not held:
            yield
            return
        async with contextlib.AsyncExitStack() as stack:
            for name in sorted(held):  # one order everywhere: no deadlock
                lock = self._device_locks.setdefault(name, asyncio.Lock())
                if lock.locked():
                    self.device_waits += 1
                await stack.enter_async_context(lock)
            yield

    def _plan(self, claim: Claim) -> tuple[PreparedClaim, dict[str, tuple[Hca, ...]]]:
        driver, pool = self.config.driver_name, self.config.pool_name
        ours = claim.of(driver)
        if not ours:
            raise NotAllocatedHere(f"ResourceClaim {claim.namespace}/{claim.name} has no "
                                   f"device of driver {driver} allocated")
        hcas: dict[str, tuple[Hca, ...]] = {}
        devices: dict[str, PreparedDevice] = {}
        for r in ours:
            if r.pool != pool:
                raise NotAllocatedHere(f"device {r.device} was allocated from pool {r.pool}, "
                                       f"not from this node's pool {pool}")
            if r.device not in hcas:
                hcas[r.device] = self._hcas_of(r.device, None)
            # Admin access watches the HCA beside its holders: it holds no share of it.
            shares = (Share(r.share_id, _bandwidth(r, driver)),) \
                if r.share_id and not r.admin_access else ()
            known = devices.get(r.device)
            if known is None:
                # Named as the kubelet matches a container's request: a prioritized
                # list's subrequest answers under its request.
                devices[r.device] = PreparedDevice(
                    (r.request_name,), pool, r.device,
                    ",".join(h.name for h in hcas[r.device]),
                    (cdi_id(driver, claim.uid, r.device),), shares,
                    admin_access=r.admin_access)
            else:
                # A shared device can be in one claim twice (two requests, or rdma/hca: 2
                # on the node-wide device; each with its share ID): one CDI device for every
                # request that got it, holding what all of them consumed, and held when
                # any of them holds it.
                devices[r.device] = replace(
                    known, request_names=tuple(dict.fromkeys((*known.request_names,
                                                              r.request_name))),
                    shares=known.shares + shares,
                    admin_access=known.admin_access and r.admin_access)
        watched = [f"{d.device} ({d.hca})" for d in devices.values() if d.admin_access]
        if watched:
            log.info("claim %s/%s has admin access to %s: given beside the claims holding "
                     "them, holding nothing", claim.namespace, claim.name, ", ".join(watched),
                     extra={"claim": claim_field(claim.ref)})
        return PreparedClaim(claim.namespace, claim.name, tuple(devices.values())), hcas

    def _hcas_of(self, device: str, hca_name: str | None) -> tuple[Hca, ...]:
        """The HCAs a device gives: its own, or for the node-wide device every usable HCA
        now (``offer.shared``: what a device plugin slot gives)."""
        group = self._offer().groups.get(device)
        if group is None:
            return (self._hca(device, hca_name),)
        usable = every_usable(group)
        if not usable:
            why = "; ".join(p for h in group for p in h.problems) or "no verbs device node"
            raise HcaUnusable(f"device {device} stands for every HCA of this node, and none "
                              f"can be used now: {why}")
        return usable

    def _hca(self, device: str, hca_name: str | None) -> Hca:
        hca = self._offer().hcas.get(device)
        if hca is None or (hca_name is not None and hca.name != hca_name):
            raise HcaGone(f"device {device} ({hca_name or 'HCA'}) is no longer on this node")
        if not hca.usable:
            raise HcaUnusable(f"device {device} ({hca.name}) cannot be used: "
                              f"{'; '.join(hca.problems) or 'its verbs device node is missing'}")
        return hca

    async def _ensure_spec(self, uid: str, claim: PreparedClaim) -> None:
        """/var/run is a tmpfs: after a reboot the spec is gone but the claim is not."""
        driver, spec_dir = self.config.driver_name, self.config.cdi_spec_dir
        path = files.cdi_spec_path(spec_dir, driver, uid)
        if await self._io.run(f"looking for {path}", lambda: os.path.exists(path)):
            return
        hcas = {d.device: self._hcas_of(d.device, d.hca) for d in claim.devices}
        pod_claim = (await self._io.run(
            "reading the device metadata of claim " + uid,
            lambda: metadata.written_pod_claim(self.config.plugin_dir, claim))
            if metadata.versions(self.config.device_metadata) else None)
        meta, spec = self._files_of(uid, claim, hcas, pod_claim)

        def write() -> None:
            metadata.write(meta)
            files.write_claim_spec(spec_dir, driver, uid, spec)

        await self._io.run(f"writing {path}", write)

    def _files_of(self, uid: str, claim: PreparedClaim, hcas: Mapping[str, Sequence[Hca]],
                  pod_claim: str | None) -> tuple[metadata.Plan, dict[str, Any]]:
        """A claim's device metadata files and its CDI spec, from one env per setting its
        devices were asked for (the spec's devices set it, the metadata files repeat it)."""
        offer = self._offer()
        every = list({h.name: h for hs in hcas.values() for h in hs}.values())
        by_config = {d.config: files.claim_env(every, self.config.env, claim, d.config)
                     for d in claim.devices}
        env = {d.device: by_config[d.config] for d in claim.devices}
        meta = metadata.plan(self.config.device_metadata, self.config.driver_name,
                             self.config.plugin_dir, uid, claim, hcas, env, pod_claim,
                             offer.groups.keys())
        spec = files.claim_spec(self.config.driver_name, uid, claim, hcas, offer.rdma_cm, env,
                                meta.mounts)
        return meta, spec

    # --- unprepare --------------------------------------------------------------------

    async def _unprepare(self, ref: ClaimRef) -> str:
        uid = ref.uid
        driver, spec_dir = self.config.driver_name, self.config.cdi_spec_dir

        def remove_files() -> None:
            # Removed even when unknown: a crash may fall between spec and checkpoint.
            files.remove_claim_spec(spec_dir, driver, uid)
            metadata.remove(self.config.plugin_dir, ref.namespace, ref.name, uid)

        known = self.prepared.get(uid)
        devices = known.devices if known is not None else ()
        try:
            async with self._devices_locked(devices):
                await self._io.run(f"removing the CDI spec of claim {uid}", remove_files)
                was = await self.prepared.remove(uid)
        except Exception as exc:
            log.warning("claim %s/%s (%s) not unprepared: %s", short_repr(ref.namespace),
                        short_repr(ref.name), short_repr(uid), exc,
                        extra={"claim": claim_field(ref)})
            return f"cannot remove the CDI spec or the checkpoint entry: {exc}"
        if was:
            log.info("claim %s/%s unprepared", ref.namespace, ref.name,
                     extra={"claim": claim_field(ref)})
            self.hooks.unprepared(ref)
        return ""
