"""Writing what Prepare gave a claim into its ``status.devices`` (the entries are built by
``claimentries``), applied server-side as upstream drivers do.

Each write is a server-side apply of the claim's ``/status`` with the driver's name as
field manager, holding only our entries: the API server merges them with the entries other
drivers (other managers) applied, by the list's keys (driver, pool, device, shareID), and
removes the entries we applied before and leave out now. So an Unprepare is an apply of no
entries, another driver's entry is never part of what we send, and no resourceVersion is
needed: a concurrent writer is no conflict. The claim's UID is in the apply body: a claim
deleted meanwhile answers 409, one made again under the name 422 (its UID is immutable),
and neither is written. The manager is the driver's name, not the ``rdma-hca/<version>``
every other write of ours carries (the User-Agent still says the version): what a manager
applied is removed only by that manager's later apply, so under a versioned name the
entries an older version wrote would stay after an upgrade, owned by a name nothing
writes as any more, and two versions serving side by side in a rolling update would
each keep the other's entries.

Off the pod's path. ``on_prepared`` and ``on_unprepared`` (the claims code's hooks) only
note what the claim's entries should become and return at once; a few workers write them
on the driver's own budget, after its slice writes (``kubeapi``). So a burst of pods waits
for none of it, and a backlog of status writes delays neither a claim read nor a taint.

- Coalesced: at most one pending write per claim, the claim's latest state. A Prepare then
  an Unprepare before the write went out send nothing (Prepare read the claim without
  entries of ours, and none went out since), or one removal when entries of ours may be
  there (a write went out or got no answer, or the claim was prepared before a restart).
- A state with entries starts from the claim as Prepare read it (its allocation gives the
  shareIDs), or, when that is gone (a retry, a restart), from one low-priority read: a
  claim whose entries are already right is not written. A removal needs no read.
- Retried until written: a failure (5xx, no answer, the client's retries on 429 used up)
  waits what the server's ``Retry-After`` said (at most ``retry_after_max``), else a
  growing, jittered backoff. A newer state of the claim replaces the one being retried.
  A refusal that trying again cannot change (a 4xx other than 404, 409 and 429) is
  counted (``refused``), leaves a Warning Event on the claim, and the same state is sent
  at most ``REFUSALS`` times; other claims go on. Nothing is retried past 404 or 409 (the
  claim is gone) or a different UID (made again under the name: not the claim we
  prepared). A server that drops the field (the DRAResourceClaimDeviceStatus feature gate
  off) is noticed per claim (``dropped``), said once, and the other claims go on.
- Bounded: at most ``max_pending`` claims wait, retries in backoff included (an order of
  magnitude above the claims a node holds: kubelet's maxPods is 110 by default). Full, a
  new claim's state still goes in, never delaying a Prepare: the oldest pending
  *prepared* state is set aside, which loses nothing, since that claim is still prepared
  and the checkpoint says so; once the queue has drained, every prepared claim whose
  entries were not written is queued again (one read each). Only when every pending
  state is a removal does the oldest one go, said in the log: its stale entry stays on
  the claim (which is usually deleted with its pod anyway). A removal is the one state
  not kept anywhere else.
- Never lost across a restart: ``start()`` queues every claim the checkpoint holds (a
  read each, a write only where the entry is not right), and ``close()`` gives pending
  writes a short, bounded drain before it cancels them.

Best effort: a claim whose status cannot be written is still prepared.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from rdma_hca.contract.checkpoint import PreparedClaim, PreparedDevice
from rdma_hca.daemon.dra.claimentries import EntryBuilder
from rdma_hca.daemon.dra.claimrecords import DeviceEntry, same_entries
from rdma_hca.daemon.dra.claims import Claim, ClaimRef
from rdma_hca.kit.aio import cancel_all
from rdma_hca.kit.backoff import Backoff, Clock, Sleep
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kit.sayonce import Once
from rdma_hca.kube.errors import KubeError
from rdma_hca.node.model import Hca

log = logging.getLogger(__name__)

# A few at a time: each holds one of the client's connections while the server answers,
# and the driver's budget (dra.apiQps) sets their pace anyway.
WORKERS = 4
MAX_PENDING = 4096
RETRY_FIRST = 0.5
RETRY_MAX = 30.0
RETRY_AFTER_MAX = 60.0  # dra.statusRetryAfterMaxSeconds' default
REFUSALS = 3  # times one state is sent to a server that refuses it (a 4xx), at most
DRAIN_SECONDS = 2.0  # what close() gives pending writes before it cancels them


class ClaimStatusApi(Protocol):
    async def claim_for_status(self, namespace: str, name: str) -> Claim: ...

    async def apply_claim_status(self, namespace: str, name: str, uid: str,
                                 entries: Sequence[DeviceEntry], field_manager: str
                                 ) -> Claim: ...


@dataclass(slots=True)
class _Intent:
    """What a claim's entries of ours should become: ``devices``' (None: none)."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...] | None
    known: Claim | None = None  # the claim as Prepare read it, if still fresh
    backoff: Backoff | None = field(default=None, repr=False)
    refusals: int = 0  # 4xx answers to this state


@dataclass(slots=True)
class _Waiting:
    intent: _Intent
    task: asyncio.Task[None]


class ClaimStatusWriter:
    def __init__(self, api: ClaimStatusApi, driver: str, *, sysfs_root: str,
                 hca_of: Callable[[str], Hca | None], files: OffLoop,
                 ips_of: Callable[[str], Sequence[str]] | None = None,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 prepared: Mapping[str, PreparedClaim] | None = None,
                 on_refused: Callable[[ClaimRef, KubeError], None] | None = None,
                 retry_after_max: float = RETRY_AFTER_MAX,
                 max_pending: int = MAX_PENDING, workers: int = WORKERS,
                 clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep,
                 rng: random.Random | None = None) -> None:
        self.api = api
        self.driver = driver
        self.entries = EntryBuilder(driver, sysfs_root=sysfs_root, hca_of=hca_of,
                                    files=files, ips_of=ips_of, now=now)
        self._prepared = prepared  # the claims prepared, live: what a set-aside state comes from
        self._on_refused = on_refused  # a Warning Event on the claim
        self.retry_after_max = retry_after_max
        self.max_pending = max(1, max_pending)
        self._workers_wanted = max(1, workers)
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.writes = 0
        self.retries = 0  # rounds that failed and waited a backoff
        self.coalesced = 0  # states that replaced or cancelled a pending one
        self.set_aside = 0  # prepared states set aside by a full queue, queued again later
        self.lost = 0  # removals dropped by a full queue
        self.refused = 0  # writes the API server refused with a 4xx (not 404, 409, 429)
        self.dropped = 0  # writes the API server took without our entries (gate off)
        self._pending: OrderedDict[str, _Intent] = OrderedDict()
        self._busy: set[str] = set()  # claims being written now
        self._waiting: dict[str, _Waiting] = {}  # claims backing off
        self._written: set[str] = set()  # claims whose entries of ours were written
        # Claims known to carry no entry of ours (Prepare read them so, and nothing went
        # out since): only their removal may be dropped. A claim this process has not seen
        # (prepared before a restart) may carry entries: its removal always goes out.
        self._clean: set[str] = set()
        # Claims whose state the server would not take (refused, or field dropped): not
        # queued again by a sweep; a new state of the claim tries again.
        self._given_up: set[str] = set()
        self._sweep = False  # a prepared state was set aside: look at every claim again
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._workers: list[asyncio.Task[None]] = []
        self._said = Once()

    # --- life ---------------------------------------------------------------------------

    def start(self) -> None:
        """Queue every prepared claim's status: what a stop (or an update) left unwritten
        is written now, and a claim whose entries are right costs one read."""
        self._queue_prepared(written_too=True)

    async def close(self, drain: float = DRAIN_SECONDS) -> None:
        """Give pending writes up to ``drain`` seconds, then cancel what is left."""
        if drain > 0 and self.pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), drain)
        if self.pending:
            log.info("%d claim status writes left at stop; the next start writes them",
                     self.pending)
        await cancel_all([*self._workers, *(w.task for w in self._waiting.values())])
        self._workers, self._waiting = [], {}

    # --- the claims code's hooks: note and return -------------------------------------

    async def on_prepared(self, claim: ClaimRef, devices: Sequence[PreparedDevice],
                          known: Claim | None = None) -> None:
        """Our entries of the claim's status.devices become those of ``devices``.

        ``known`` is the claim as Prepare read it: the entries are built from it, with no
        read of their own.
        """
        if devices:
            self._put(_Intent(claim, tuple(devices), known))

    async def on_unprepared(self, claim: ClaimRef) -> None:
        """Our entries go; other drivers' stay."""
        self._put(_Intent(claim, None))

    # --- the queue --------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Claims whose status is still to be written (queued, backing off or going out)."""
        return len(self._pending) + len(self._waiting) + len(self._busy)

    async def drained(self) -> None:
        """Wait until every state noted so far is written (or given up): tests, benchmarks."""
        await self._idle.wait()

    def _put(self, intent: _Intent) -> None:
        uid = intent.ref.uid
        self._given_up.discard(uid)
        waiting = self._waiting.pop(uid, None)
        if waiting is not None:  # a newer state replaces the one backing off
            waiting.task.cancel()
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
                and uid not in self._written and not intent.known.entries_of(self.driver)):
            self._clean.add(uid)
        if replaced is None and waiting is None and self._queued() >= self.max_pending:
            self._make_room()
        self._pending[uid] = intent
        self._start()

    def _queued(self) -> int:
        """What counts toward the bound: states waiting their turn or their backoff."""
        return len(self._pending) + len(self._waiting)

    def _make_room(self) -> None:
        prepared = self._prepared if self._prepared is not None else {}
        for uid, old in self._pending.items():
            if old.devices is not None and uid in prepared:
                del self._pending[uid]
                self._set_aside()
                return
        for uid, w in self._waiting.items():
            if w.intent.devices is not None and uid in prepared:
                del self._waiting[uid]
                w.task.cancel()
                self._set_aside()
                return
        if self._pending:
            _, old = self._pending.popitem(last=False)
        else:
            uid = next(iter(self._waiting))
            w = self._waiting.pop(uid)
            w.task.cancel()
            old = w.intent
        self.lost += 1
        if self._said.first("full"):
            log.warning("%d claim status writes wait: the status of ResourceClaim %s/%s (and "
                        "of any more unprepared while the API server does not take them) "
                        "keeps this driver's entries", self._queued() + 1,
                        old.ref.namespace, old.ref.name)

    def _set_aside(self) -> None:
        self.set_aside += 1
        self._sweep = True

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
                self._queue_prepared(written_too=False)
            if not self._pending:
                self._idle.set()

    def _queue_prepared(self, *, written_too: bool) -> None:
        if self._prepared is None:
            return
        for uid, c in list(self._prepared.items()):
            if uid in self._pending or uid in self._waiting or uid in self._busy \
                    or uid in self._given_up or (uid in self._written and not written_too):
                continue
            if self._queued() >= self.max_pending:
                self._sweep = True  # the rest once these are done
                break
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
            retry: float | None
            try:
                retry = await self._update(intent)
            except Exception as exc:  # a bug must not end the worker: said once, retried
                if self._said.first(f"{type(exc).__name__}: {exc}"):
                    log.exception("writing the status of ResourceClaim %s/%s failed",
                                  intent.ref.namespace, intent.ref.name)
                retry = 0.0
            finally:
                self._busy.discard(uid)
            if retry is not None and uid not in self._pending:
                self._retry_later(intent, retry)
            if uid in self._pending:
                self._wake.set()  # its next state waited for this one
            self._settle()

    def _retry_later(self, intent: _Intent, hint: float) -> None:
        """Try again after ``hint`` seconds (the server's Retry-After, capped), or after
        the intent's backoff when the server said nothing (0)."""
        self.retries += 1
        backoff = intent.backoff or Backoff(RETRY_FIRST, RETRY_MAX, rng=self._rng)
        intent.backoff, intent.known = backoff, None
        uid = intent.ref.uid
        wait = min(hint, self.retry_after_max) if hint > 0 else backoff.next()

        async def later() -> None:
            await self._sleep(wait)
            waiting = self._waiting.get(uid)
            if waiting is not None and waiting.task is task:
                del self._waiting[uid]
                self._pending.setdefault(uid, intent)
                self._start()

        task = asyncio.create_task(later(), name=f"dra-claim-status-retry-{uid}")
        self._waiting[uid] = _Waiting(intent, task)

    async def _update(self, intent: _Intent) -> float | None:
        """One round of writing ``intent``: None when done (written, or nothing more to
        do), else try again after the seconds given (0: the backoff's)."""
        ref = intent.ref
        uid = ref.uid
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        wanted: tuple[DeviceEntry, ...] = ()
        if intent.devices is not None:
            claim = intent.known
            if claim is None:
                try:
                    claim = await self.api.claim_for_status(ref.namespace, ref.name)
                except KubeError as exc:
                    if exc.status == 404:
                        self._mark(uid, False)
                        return None
                    if 400 <= exc.status < 500 and exc.status != 429:
                        return self._refused(intent, exc, where)
                    log.debug("cannot read %s to write its status: %s", where, exc)
                    return exc.retry_after or 0.0
            if claim.uid != uid:
                self._mark(uid, False)
                return None  # deleted and made again: not the claim we prepared
            wanted = await self.entries.entries(claim, intent.devices)
            if same_entries(claim.entries_of(self.driver), wanted):
                self._mark(uid, bool(wanted))
                return None  # already there (a repeated Prepare, a restart): no write
        try:
            stored = await self.api.apply_claim_status(ref.namespace, ref.name, uid, wanted,
                                                       self.driver)
        except KubeError as exc:
            return self._failed(intent, exc, where)
        self.writes += 1
        if wanted and not stored.entries_of(self.driver):
            self.dropped += 1
            self._given_up.add(uid)
            self._mark(uid, False)
            if self._said.first("dropped"):
                log.warning("the API server took the status of %s without its "
                            "status.devices entries (feature gate DRAResourceClaimDeviceStatus "
                            "off?); such claims are prepared without them", where)
            return None
        self._mark(uid, bool(wanted))
        return None

    def _failed(self, intent: _Intent, exc: KubeError, where: str) -> float | None:
        uid = intent.ref.uid
        if exc.status in (404, 409) or (exc.status == 422 and "metadata.uid" in str(exc)):
            # Gone (404, or 409: our UID names no object), or made again under the name.
            self._mark(uid, False)
            return None
        if 400 <= exc.status < 500 and exc.status != 429:
            return self._refused(intent, exc, where)
        if not exc.status:
            self._mark(uid, True)  # no answer: it may have been written
        log.debug("cannot write the status of %s (trying again): %s", where, exc)
        return exc.retry_after or 0.0

    def _refused(self, intent: _Intent, exc: KubeError, where: str) -> float | None:
        self.refused += 1
        intent.refusals += 1
        if self._on_refused is not None:
            self._on_refused(intent.ref, exc)
        if exc.status == 403 and self._said.first("403"):
            log.warning("the API server refuses the status of %s (%s): grant patch on "
                        "resourceclaims/status and (1.36) associated-node:patch on "
                        "resourceclaims/driver; every claim is still tried", where, exc)
        if intent.refusals < REFUSALS:
            return exc.retry_after or 0.0
        self._given_up.add(intent.ref.uid)
        log.warning("the status of %s was refused %d times; not sent again until the claim "
                    "changes: %s", where, intent.refusals, exc)
        return None

    def _mark(self, uid: str, ours: bool) -> None:
        """What the server holds now: entries of ours on the claim, or none (and then the
        claim is forgotten: it is unprepared, or gone)."""
        self._clean.discard(uid)
        if ours:
            self._written.add(uid)
        else:
            self._written.discard(uid)
