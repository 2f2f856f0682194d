"""Writing what Prepare gave a claim into its status, as KEP-4817 describes it:
``status.devices[]`` holds one entry per allocated device of ours (driver, pool, device and
the allocation's shareID), with a ``Ready`` condition and ``networkData``: the HCA's
netdev (``interfaceName``), its MAC (``hardwareAddress``) and its addresses (``ips``) where
an address source is given: the API wants them in CIDR form, and sysfs (where the RoCE GIDs
are read) does not say an address's prefix, so without one they are left out.

Entries of other drivers are never touched: each write is a read-modify-write of the
claim through its ``/status`` subresource with the resourceVersion just read, so a
concurrent writer makes it fail with 409 and it is done again on a fresh read.

Off the pod's path. ``on_prepared`` and ``on_unprepared`` (the claims code's hooks) only
note what the claim's entries should become and return at once; a few workers write them
on the driver's own budget, after its slice writes (``kubeapi``). So a burst of pods waits
for none of it, and a backlog of status writes delays neither a claim read nor a taint.

- Coalesced: at most one pending write per claim, the claim's latest state. A Prepare then
  an Unprepare before the write went out send nothing (Prepare read the claim without
  entries of ours, and none went out since), or one removal when entries of ours may be
  there (a write went out or got no answer, or the claim was prepared before a restart).
- Retried until written: a conflict (409) re-reads the claim and applies the entries
  again; any other failure (5xx, no answer, the client's retries on 429 used up) waits a
  growing, jittered backoff and tries again. A newer state of the claim queued meanwhile
  replaces the one being retried. Nothing is retried past 404 (the claim is gone) or a
  different UID (made again under the name: not the claim we prepared).
- Bounded: at most ``max_pending`` claims wait (an order of magnitude above the claims a
  node holds: kubelet's maxPods is 110 by default). Full, a new claim's state still goes
  in, never delaying a Prepare: the oldest pending *prepared* state is set aside, which
  loses nothing, since that claim is still prepared and the checkpoint says so; once the
  queue has drained, every prepared claim whose entries were not written is queued again
  (one GET more each). Only when every pending state is a removal does the oldest one go,
  said in the log: its stale entry stays on the claim (which is usually deleted with its
  pod anyway). A removal is the one state not kept anywhere else.

Best effort: a claim whose status cannot be written is still prepared. Where the API
server does not take the field (the DRAResourceClaimDeviceStatus feature gate off: the
server drops it from what it stores) or refuses us (RBAC), that is said once in the log
and the writer stops trying, instead of retrying every claim. Pending writes do not
survive a restart.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from rdma_hca.contract.checkpoint import PreparedClaim, PreparedDevice
from rdma_hca.daemon.dra.claims import ClaimRef
from rdma_hca.kit.aio import cancel_all
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kit.sayonce import Once
from rdma_hca.kube.errors import KubeError
from rdma_hca.kube.policy import Backoff, Clock, Sleep
from rdma_hca.node.model import Hca

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5  # in a row, then a backoff before the next round
# A few at a time: each holds one of the client's connections while the server answers,
# and the driver's budget (dra.apiQps) sets their pace anyway.
WORKERS = 4
MAX_PENDING = 4096
RETRY_FIRST = 0.5
RETRY_MAX = 30.0
MAX_HARDWARE_ADDRESS = 128  # NetworkDeviceDataHardwareAddressMaxLength
MAX_INTERFACE_NAME = 256  # NetworkDeviceDataInterfaceNameMaxLength
MAX_IPS = 16  # NetworkDeviceDataMaxIPs


class ClaimStatusApi(Protocol):
    async def reread_claim(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def replace_claim_status(self, claim: dict[str, Any]) -> dict[str, Any]: ...


def read_mac(sysfs_root: str, netdev: str) -> str | None:
    """``<sysfs_root>/class/net/<netdev>/address``, or None when there is none."""
    try:
        with open(os.path.join(sysfs_root, "class", "net", netdev, "address")) as f:
            text = f.read(MAX_HARDWARE_ADDRESS + 1).strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text and len(text) <= MAX_HARDWARE_ADDRESS else None


def _key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))


def _without_times(entries: Sequence[Mapping[str, Any]]) -> list[Any]:
    out = []
    for e in entries:
        conditions = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                      for c in e.get("conditions") or []]
        out.append({**e, "conditions": conditions})
    return sorted(out, key=lambda e: str(_key(e)))


@dataclass(slots=True)
class _Intent:
    """What a claim's entries of ours should become: ``devices``' (None: none)."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...] | None
    known: Mapping[str, Any] | None = None  # the claim as Prepare read it, if still fresh
    backoff: Backoff | None = field(default=None, repr=False)


class ClaimStatusWriter:
    def __init__(self, api: ClaimStatusApi, driver: str, *, sysfs_root: str,
                 hca_of: Callable[[str], Hca | None], files: OffLoop,
                 ips_of: Callable[[str], Sequence[str]] | None = None,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 prepared: Callable[[], Mapping[str, PreparedClaim]] | None = None,
                 max_pending: int = MAX_PENDING, workers: int = WORKERS,
                 clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep,
                 rng: random.Random | None = None) -> None:
        self.api = api
        self.driver = driver
        self.sysfs_root = sysfs_root
        self.hca_of = hca_of  # device name -> the HCA behind it, from the current offer
        self.files = files
        self.ips_of = ips_of  # netdev -> its addresses in CIDR form (blocking: run off the loop)
        self._now = now
        self._prepared = prepared  # the claims prepared now: what a set-aside state comes from
        self.max_pending = max(1, max_pending)
        self._workers_wanted = max(1, workers)
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.disabled: str | None = None  # why the writer stopped, once it did
        self.writes = 0
        self.conflicts = 0  # writes refused with 409, then done again on a fresh read
        self.retries = 0  # rounds that failed and waited a backoff
        self.coalesced = 0  # states that replaced or cancelled a pending one
        self.set_aside = 0  # prepared states set aside by a full queue, queued again later
        self.lost = 0  # removals dropped by a full queue
        self._pending: OrderedDict[str, _Intent] = OrderedDict()
        self._busy: set[str] = set()  # claims being written now
        self._waiting: dict[str, asyncio.Task[None]] = {}  # claims backing off
        self._written: set[str] = set()  # claims whose entries of ours were written
        # Claims known to carry no entry of ours (Prepare read them so, and nothing went
        # out since): only their removal may be dropped. A claim this process has not seen
        # (prepared before a restart) may carry entries: its removal always goes out.
        self._clean: set[str] = set()
        self._sweep = False  # a prepared state was set aside: look at every claim again
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._workers: list[asyncio.Task[None]] = []
        self._said = Once()

    # --- the claims code's hooks: note and return -------------------------------------

    async def on_prepared(self, claim: ClaimRef, devices: Sequence[PreparedDevice],
                          known: Mapping[str, Any] | None = None) -> None:
        """Our entries of the claim's status.devices become those of ``devices``.

        ``known`` is the claim as Prepare read it: the write starts from it (its
        resourceVersion guards it), and only a conflict costs a fresh read.
        """
        if self.disabled is None and devices:
            self._put(_Intent(claim, tuple(devices), known))

    async def on_unprepared(self, claim: ClaimRef) -> None:
        """Our entries go; other drivers' stay."""
        if self.disabled is None:
            self._put(_Intent(claim, None))

    # --- the queue --------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Claims whose status is still to be written (queued, backing off or going out)."""
        return len(self._pending) + len(self._waiting) + len(self._busy)

    async def drained(self) -> None:
        """Wait until every state noted so far is written (or given up): tests, benchmarks."""
        await self._idle.wait()

    async def close(self) -> None:
        await cancel_all([*self._workers, *self._waiting.values()])
        self._workers, self._waiting = [], {}

    def _put(self, intent: _Intent) -> None:
        uid = intent.ref.uid
        waiting = self._waiting.pop(uid, None)
        if waiting is not None:  # a newer state replaces the one backing off
            waiting.cancel()
            self.coalesced += 1
        replaced = self._pending.pop(uid, None)
        if replaced is not None:
            self.coalesced += 1
        if intent.devices is None and uid in self._clean and uid not in self._busy:
            # Nothing of ours is on the claim: nothing to remove.
            self._clean.discard(uid)
            self._settle()
            return
        if (intent.devices is not None and intent.known is not None and uid not in self._busy
                and uid not in self._written and not self._ours_in(intent.known)):
            self._clean.add(uid)
        if replaced is None and len(self._pending) >= self.max_pending:
            self._make_room()
        self._pending[uid] = intent
        self._start()

    def _ours_in(self, claim: Mapping[str, Any]) -> bool:
        status = claim.get("status") or {}
        return any(e.get("driver") == self.driver for e in status.get("devices") or [])

    def _make_room(self) -> None:
        prepared = self._prepared() if self._prepared is not None else {}
        for uid, old in self._pending.items():
            if old.devices is not None and uid in prepared:
                del self._pending[uid]
                self.set_aside += 1
                self._sweep = True
                return
        uid, old = self._pending.popitem(last=False)
        self.lost += 1
        if self._said.first("full"):
            log.warning("%d claim status writes wait: the status of ResourceClaim %s/%s (and "
                        "of any more unprepared while the API server does not take them) "
                        "keeps this driver's entries", len(self._pending) + 1,
                        old.ref.namespace, old.ref.name)

    def _start(self) -> None:
        self._idle.clear()
        self._wake.set()
        if not self._workers:
            self._workers = [asyncio.create_task(self._work(), name=f"dra-claim-status-{i}")
                             for i in range(self._workers_wanted)]

    def _settle(self) -> None:
        if not self._pending and not self._waiting and not self._busy:
            if self._sweep:
                self._sweep = False
                self._queue_unwritten()
            if not self._pending:
                self._idle.set()

    def _queue_unwritten(self) -> None:
        if self._prepared is None or self.disabled is not None:
            return
        for uid, c in list(self._prepared().items()):
            if uid not in self._written and len(self._pending) < self.max_pending:
                self._pending[uid] = _Intent(ClaimRef(c.namespace, uid, c.name), c.devices)
        if self._pending:
            self._start()

    def _take(self) -> _Intent | None:
        for uid in self._pending:
            if uid not in self._busy:  # one write of a claim at a time, in order
                return self._pending.pop(uid)
        return None

    async def _work(self) -> None:
        while True:
            intent = self._take()
            if intent is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            uid = intent.ref.uid
            self._busy.add(uid)
            try:
                done = self.disabled is not None or await self._update(intent)
            except Exception as exc:  # a bug must not end the worker: said once, retried
                if self._said.first(f"{type(exc).__name__}: {exc}"):
                    log.exception("writing the status of ResourceClaim %s/%s failed",
                                  intent.ref.namespace, intent.ref.name)
                done = False
            finally:
                self._busy.discard(uid)
            if not done and uid not in self._pending and self.disabled is None:
                self._retry_later(intent)
            if uid in self._pending:
                self._wake.set()  # its next state waited for this one
            self._settle()

    def _retry_later(self, intent: _Intent) -> None:
        self.retries += 1
        backoff = intent.backoff or Backoff(RETRY_FIRST, RETRY_MAX, rng=self._rng)
        intent.backoff, intent.known = backoff, None
        uid = intent.ref.uid
        wait = backoff.next()

        async def later() -> None:
            await self._sleep(wait)
            if self._waiting.get(uid) is task:
                del self._waiting[uid]
                self._pending.setdefault(uid, intent)
                self._start()

        task = asyncio.create_task(later(), name=f"dra-claim-status-retry-{uid}")
        self._waiting[uid] = task

    async def _entries(self, claim: dict[str, Any], devices: Sequence[PreparedDevice]
                       ) -> list[dict[str, Any]]:
        ours = {(d.pool, d.device): d for d in devices}
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}) \
            .get("results") or []
        generation = claim.get("metadata", {}).get("generation")
        stamp = self._now().strftime("%Y-%m-%dT%H:%M:%SZ")
        entries: list[dict[str, Any]] = []
        seen: set[tuple[Any, ...]] = set()
        for r in results:
            prepared = ours.get((r.get("pool"), r.get("device")))
            if r.get("driver") != self.driver or prepared is None:
                continue
            entry: dict[str, Any] = {"driver": self.driver, "pool": prepared.pool,
                                     "device": prepared.device}
            if r.get("shareID"):
                entry["shareID"] = r["shareID"]
            if _key(entry) in seen:
                continue  # two requests got the same device: one entry
            seen.add(_key(entry))
            condition: dict[str, Any] = {
                "type": "Ready", "status": "True", "reason": "Prepared",
                "message": f"HCA {prepared.hca} is ready in the pod",
                "lastTransitionTime": stamp}
            if isinstance(generation, int):
                condition["observedGeneration"] = generation
            entry["conditions"] = [condition]
            network = await self._network(prepared)
            if network:
                entry["networkData"] = network
            entries.append(entry)
        return entries

    async def _network(self, device: PreparedDevice) -> dict[str, Any]:
        hca = self.hca_of(device.device)
        if hca is None or not hca.netdevs:
            return {}
        netdev = hca.netdevs[0]
        out: dict[str, Any] = {"interfaceName": netdev[:MAX_INTERFACE_NAME]}
        try:
            mac = await self.files.run(f"MAC of {netdev}",
                                       lambda: read_mac(self.sysfs_root, netdev))
        except Exception as exc:  # a stuck sysfs read: the entry goes out without the MAC
            log.debug("cannot read the MAC of %s: %s", netdev, exc)
            mac = None
        if mac:
            out["hardwareAddress"] = mac
        if self.ips_of is not None:
            ips_of = self.ips_of
            try:
                ips = await self.files.run(f"addresses of {netdev}", lambda: list(ips_of(netdev)))
            except Exception as exc:
                log.debug("cannot read the addresses of %s: %s", netdev, exc)
                ips = []
            if ips:
                out["ips"] = ips[:MAX_IPS]
        return out

    async def _update(self, intent: _Intent) -> bool:
        """One round of writing ``intent``; False: try again after a backoff."""
        ref, known = intent.ref, intent.known
        devices = intent.devices or ()
        uid = ref.uid
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        for _ in range(CONFLICT_RETRIES):
            try:
                claim = (copy.deepcopy(dict(known)) if known
                         else await self.api.reread_claim(ref.namespace, ref.name))
            except KubeError as exc:
                if exc.status == 404:
                    self._mark(uid, False)
                    return True
                log.debug("cannot read %s to write its status: %s", where, exc)
                return False
            known = None  # a conflict means it changed: read it again
            if claim.get("metadata", {}).get("uid") != uid:
                self._mark(uid, False)
                return True  # deleted and made again: not the claim we prepared
            status = claim.setdefault("status", {})
            current = list(status.get("devices") or [])
            others = [e for e in current if e.get("driver") != self.driver]
            mine = [e for e in current if e.get("driver") == self.driver]
            wanted = await self._entries(claim, devices)
            if _without_times(mine) == _without_times(wanted):
                self._mark(uid, bool(wanted))
                return True  # already there (a repeated Prepare): no write
            status["devices"] = others + wanted
            try:
                stored = await self.api.replace_claim_status(claim)
            except KubeError as exc:
                if exc.status == 409:
                    self.conflicts += 1
                    continue  # someone else wrote the claim: read it again
                if exc.status == 404:
                    self._mark(uid, False)
                    return True
                if exc.status in (403, 422, 405):
                    self._stop(f"the API server refuses the status of {where} ({exc}); "
                               "claims are prepared without status.devices from now on"
                               + (": grant update on resourceclaims/status and (1.36) "
                                  "associated-node:update on resourceclaims/driver"
                                  if exc.status == 403 else ""))
                    return True
                if not exc.status:
                    self._mark(uid, True)  # no answer: it may have been written
                log.debug("cannot write the status of %s (trying again): %s", where, exc)
                return False
            self.writes += 1
            self._mark(uid, bool(wanted))
            if wanted and not (stored.get("status") or {}).get("devices"):
                self._stop("the API server dropped status.devices (feature gate "
                           "DRAResourceClaimDeviceStatus off?); claims are prepared without "
                           "it from now on")
            return True
        log.debug("the status of %s kept changing under us; trying again later", where)
        return False

    def _mark(self, uid: str, ours: bool) -> None:
        """What the server holds now: entries of ours on the claim, or none (and then the
        claim is forgotten: it is unprepared, or gone)."""
        self._clean.discard(uid)
        if ours:
            self._written.add(uid)
        else:
            self._written.discard(uid)

    def _stop(self, why: str) -> None:
        self.disabled = why
        log.warning("%s", why)
        dropped = list(self._waiting.values())
        self._pending.clear()
        self._waiting.clear()
        self._clean.clear()
        for t in dropped:
            t.cancel()
