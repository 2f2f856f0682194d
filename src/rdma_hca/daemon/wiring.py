"""Wiring of the node daemon: discovery → pools → kubelet lifecycle → HTTP endpoints.

``Daemon.run`` is what ``rdma-hca serve`` runs; the demo, the tests and the
benchmarks run the same object on simulated trees. The HTTP endpoints see the
daemon only through :meth:`Daemon.status`, a frozen snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rdma_hca import __version__
from rdma_hca.daemon.deviceplugin.allocations import AllocationStats
from rdma_hca.daemon.deviceplugin.kubelet import KUBELET_SOCKET, KubeletLifecycle
from rdma_hca.daemon.deviceplugin.runtime import PoolRuntime
from rdma_hca.daemon.dra import DraDriver, DriverConfig
from rdma_hca.daemon.findings import NodeFindings, evaluate_node
from rdma_hca.daemon.observe.httpserver import MetricsServer
from rdma_hca.daemon.observe.status import DraStatus, PoolStatus, Status
from rdma_hca.daemon.offer.cdi import SPEC_FILE, build_spec, write_spec
from rdma_hca.daemon.offer.env import env_settings
from rdma_hca.daemon.offer.nodeevents import NodeEvents, start_node_events
from rdma_hca.daemon.offer.nodeevents import stats as event_stats
from rdma_hca.daemon.supervise import Supervisor
from rdma_hca.daemon.watch.health import HealthWatcher
from rdma_hca.daemon.watch.machine import MachineReader
from rdma_hca.kit.aio import cancel_all, describe, settle
from rdma_hca.kit.offloop import OffLoop, Stalled
from rdma_hca.kit.probe import default_dir, probe_socket_path
from rdma_hca.kit.sayonce import Latch, Once
from rdma_hca.kit.workers import WORKERS
from rdma_hca.kube.events import EventRecorder
from rdma_hca.node.model import Gid, Hca, NodeInventory
from rdma_hca.node.reader import NodeReader
from rdma_hca.node.roce import ipv6_missing
from rdma_hca.settings.config import (
    ConfigError,
    Settings,
    exclusive_first,
    held_text,
    overlapping_hcas,
    pools_sharing,
)

log = logging.getLogger(__name__)

STOP_DEADLINE = 1.5  # SIGTERM must end the process within 2 s
STOP_STEP = 1.0  # what one step of a stop may take before it is named and left
CDI_CHECK_SECONDS = 2.0  # how soon a removed or changed CDI spec is written again
EVENTS_GRACE = 0.5  # what a stop gives queued Events to go out
STALE_PASSES = 5  # /healthz fails after this many poll intervals without a health pass


def _held_by(names: Sequence[str]) -> str:
    """``the HCA mlx5_0 is`` or ``the HCAs mlx5_0, mlx5_1 are``."""
    return held_text(names) + (" is" if len(names) == 1 else " are")


class Daemon:
    def __init__(self, settings: Settings, *, netlink: bool = True,
                 reader: MachineReader | None = None,
                 read_deadline: float | None = None,
                 probe_dir: str | None = None) -> None:
        self.settings = settings
        # The probe socket sits in the pod's own scratch directory (``/tmp``, an emptyDir),
        # named after the pod: only with a pod UID is it surely this instance's.
        self.probe_socket = (probe_socket_path(probe_dir or default_dir(os.environ),
                                               settings.pod_uid)
                             if settings.pod_uid else None)
        # ``read_deadline`` overrides the setting (tests use short ones).
        self.read_deadline = (settings.read_deadline_seconds if read_deadline is None
                              else read_deadline)
        self.runtimes = [
            PoolRuntime(p, env=env_settings(settings), cdi=settings.cdi.enabled)
            for p in settings.pools
        ]
        self.allocations = AllocationStats(r.resource_name for r in self.runtimes)
        self.lifecycle = KubeletLifecycle(
            self.runtimes,
            settings.kubelet_dir,
            resend_seconds=settings.resend_seconds,
            on_allocate=self.allocations.observe,
        )
        self.reader: MachineReader = reader or NodeReader(
            Path(settings.sysfs_root), Path(settings.dev_root), deadline=self.read_deadline)
        health_kw: dict[str, Any] = {} if netlink else {"events": None}
        self.health = HealthWatcher(
            self.runtimes,
            self.reader,
            poll_seconds=settings.health_poll_seconds,
            flap_hold_seconds=settings.flap_hold_seconds,
            **health_kw,
        )
        # The DRA driver, beside or instead of the device plugin pools. lightkube is
        # imported only when it starts, so a daemon without DRA does not pay for it.
        self.dra: DraDriver | None = None
        if settings.dra.enabled:
            self.dra = DraDriver(DriverConfig.from_settings(settings,
                                                            read_deadline=self.read_deadline))
        # The files the daemon owns (its CDI spec) are written off the loop, within the
        # read deadline: a hung filesystem must not stop the loop either.
        self.files = OffLoop(self.read_deadline)
        self.supervisor = Supervisor()
        self.findings = NodeFindings()
        # Kubernetes Events about the node (and, handed to the DRA driver, its claims).
        self.node_events: NodeEvents | None = None
        self.http: MetricsServer | None = None
        self.started = time.time()
        self.cdi_check_seconds = CDI_CHECK_SECONDS
        self._tasks: list[asyncio.Task[None]] = []
        self._cdi_error = Latch()
        self._ipv6_ready = False
        self._ipv6_gids: tuple[tuple[Gid, ...], ...] | None = None
        # Overlaps of an HCA that came after start, already said.
        self._told_shared_exclusive = Once()
        self._pools_checked = False

    @property
    def inventory(self) -> NodeInventory | None:
        return self.health.inventory

    @property
    def _recorder(self) -> EventRecorder | None:
        if self.node_events is not None:
            return self.node_events.recorder
        return self.dra.events if self.dra is not None else None

    @property
    def failed(self) -> bool:
        """A root task ended by itself: the process should exit non-zero."""
        return bool(self.supervisor.dead)

    def ready(self) -> bool:
        return self.status().ready

    # --- what the endpoints read ------------------------------------------------------

    def status(self) -> Status:
        """The daemon's state now, as one frozen record (cheap: no per-HCA work)."""
        inv = self.health.inventory
        return Status(
            version=__version__,
            hcas=inv.hcas if inv is not None else (),
            gpus=inv.gpus if inv is not None else (),
            events=None if self._recorder is None else event_stats(self._recorder),
            pools=tuple(
                PoolStatus(
                    resource=r.resource_name,
                    devices=len(r.state.devices),
                    healthy=r.state.healthy_count(),
                    hcas=r.selected_hca_count,
                    missing=r.missing_hcas,
                    registered=bool(self.lifecycle.registered.get(r.resource_name)),
                    registrations=self.lifecycle.registrations.get(r.resource_name, 0),
                    selected=r.selected_hcas,
                )
                for r in self.runtimes
            ),
            kubelet_restarts=self.lifecycle.kubelet_restarts,
            allocations=dict(self.allocations.total),
            ipv6_ready=self._ipv6_ready,
            counters=self.health.counters,
            state_changes=self.health.state_changes,
            sysfs_stalls=self.reader.stalls_total + self.files.stalls_total + (
                self.dra.file_stalls if self.dra is not None else 0),
            discovery_errors=self.health.discovery_errors,
            started=self.started,
            health_last_pass=self.health.last_pass,
            dead_tasks=tuple(self.supervisor.dead),
            health_stale_after=max(STALE_PASSES * self.settings.health_poll_seconds,
                                   2 * self.read_deadline + 5.0),
            dra=None if self.dra is None else DraStatus(
                registered=self.dra.registered,
                registrations=self.dra.registrations,
                prepared_claims=len(self.dra.prepared),
                publish_error=self.dra.publish_error,
                published=self.dra.published_since_start,
                prepares=dict(self.dra.claims.prepare_results),
                unprepares=dict(self.dra.claims.unprepare_results),
                prepare_seconds=self.dra.claims.prepare_seconds.counts(),
                bandwidth_capacity=self.dra.bandwidth_capacity,
                bandwidth_held=self.dra.bandwidth_held,
                api_requests=self.dra.api_requests,
                api_wait_seconds=self.dra.api_wait_seconds,
            ),
        )

    # --- following the node -----------------------------------------------------------
    # Each follower runs in a task of its own (HealthWatcher.follow): a CDI directory on a
    # hung filesystem must not hold back a DRA taint, nor the other way round.

    async def judge_node(self, inventory: NodeInventory) -> None:
        """The non-hostNetwork findings and the IPv6 gauge, from the pools' HCAs."""
        pool_hcas = {h.name: h for r in self.runtimes for h in r.view.hcas}
        # Judged from the pools' HCAs whether or not the switch is on: the node findings
        # only look when it is, and an operator reads the gauge to decide whether to
        # turn it on. Only GIDs decide it, and a port's GIDs are the very same tuple
        # until a discovery reads them again: every GID of every port is read once
        # per discovery, not once per port-state change.
        gids = tuple(p.gids for h in pool_hcas.values() for p in h.ports)
        seen = self._ipv6_gids
        if seen is None or len(seen) != len(gids) or any(
                a is not b for a, b in zip(seen, gids, strict=True)):
            self._ipv6_gids = gids
            # Tens of thousands of GIDs on a large node: judged on a worker thread.
            hcas = tuple(pool_hcas.values())
            self._ipv6_ready = not await WORKERS.run(lambda: ipv6_missing(hcas),
                                                     "rdma-hca-ipv6")
        self._say_late_exclusive_overlap(inventory.hcas)
        findings = evaluate_node(inventory, self.settings, self.runtimes)
        if findings != self.findings:
            findings.log_changes(self.findings)
            self.findings = findings

    async def _keep_cdi(self) -> None:
        """Write the spec for every new inventory, and again when something removed or
        changed it (looked at every ``cdi_check_seconds``)."""
        path = os.path.join(self.settings.cdi.spec_dir, SPEC_FILE)
        seen = self.health.inventories.generation
        while True:
            generation = await self.health.inventories.wait_newer(seen, self.cdi_check_seconds)
            news, seen = generation != seen, generation
            if await self._write_cdi(self.health.inventory) and not news:
                log.warning("the CDI spec %s was removed or changed; written again", path)

    async def _write_cdi(self, inventory: NodeInventory | None) -> bool:
        """Write the spec if it differs from the file; True when it was (re)written."""
        if inventory is None:
            return False
        hcas = {h.name: h for r in self.runtimes for h in r.view.hcas}
        spec = build_spec(hcas.values(), inventory.rdma_cm)
        spec_dir = self.settings.cdi.spec_dir
        try:
            written = await self.files.run(
                f"the CDI spec in {spec_dir}", lambda: write_spec(spec_dir, spec))
            self._cdi_error.clear()
            return written
        except (OSError, Stalled) as exc:
            message = f"cannot write the CDI spec in {spec_dir}: {exc}"
            if self._cdi_error.set(message):
                log.error("%s; pods allocated now will not get their devices", message)
            return False

    # --- SIGHUP -----------------------------------------------------------------------

    def rescan(self) -> None:
        """Rediscover now and check the kubelet's socket and ours (what SIGHUP means)."""
        gone = [r for r, s in self.lifecycle.servers.items() if not os.path.exists(s.path)]
        kubelet = os.path.exists(os.path.join(self.settings.kubelet_dir, KUBELET_SOCKET))
        log.info("rescan asked (SIGHUP): rediscovering the node; kubelet.sock %s%s",
                 "is there" if kubelet else "is missing",
                 f"; our socket is gone for {', '.join(gone)}" if gone else "")
        self.health.poke(full=True)
        for resource in gone:
            self.lifecycle.request(resource, "rescan: our socket is gone", hurry=True)

    # --- running ----------------------------------------------------------------------

    async def start(self) -> None:
        """Discover, then serve and register, then watch; returns once started."""
        inventory = await self.health.refresh()
        log.info("found %d RDMA HCA(s): %s", len(inventory.hcas),
                 ", ".join(h.name for h in inventory.hcas) or "none")
        await self._start_events()
        twice = {name: who for name, who in overlapping_hcas(self.settings,
                                                              inventory.hcas).items()
                 if "dra" in who}
        try:
            if twice:
                raise ConfigError(
                    "dra.selectors",
                    ", ".join(f"{n} ({' and '.join(w)})" for n, w in twice.items()),
                    "an HCA is offered by DRA and by a device plugin pool at once; give "
                    "dra.selectors and the pools' selectors HCAs apart, or set "
                    "devicePlugin.enabled: false")
            self._check_pools_apart(inventory.hcas)
        except ConfigError as exc:
            if self.node_events is not None:
                # Beside the exit, where `kubectl describe node` shows it; bounded.
                await self.node_events.refused_sent(str(exc))
            raise
        if self.node_events is not None:
            self.node_events.observe(inventory)
        if self.settings.metrics_address:
            server = MetricsServer(self.status, self.settings.metrics_address,
                                   collectors=[self.allocations.latency],
                                   on_scrape=self.health.want_counters,
                                   max_connections=self.settings.http.max_connections,
                                   probe_socket=self.probe_socket)
            await server.start()
            self.http = server
            await self.health.refresh_counters()
        # What the followers do for later inventories is done once for the first one
        # before anything is served: a pod allocated at once must find its CDI devices.
        await self.judge_node(inventory)
        if self.settings.cdi.enabled:
            await self._write_cdi(inventory)
        if self.runtimes:
            # DRA alone has no device-plugins directory to wait for.
            await self.lifecycle.start()
            self.supervisor.watch(self.lifecycle.tasks)
        # The followers take it from the inventory start has handed them already.
        seen = self.health.inventories.generation
        if self.dra is not None:
            await self.dra.start(inventory)
            self.supervisor.watch(self.dra.tasks)
            self._tasks.append(self.supervisor.spawn(
                "dra-follow", self.health.follow(self.dra.update, seen)))
        self._tasks.append(self.supervisor.spawn(
            "node-findings", self.health.follow(self.judge_node, seen)))
        if self.node_events is not None:
            self._tasks.append(self.supervisor.spawn(
                "node-events", self.health.follow(self._tell_node, seen)))
        self._tasks.append(self.supervisor.spawn("health", self.health.run()))
        if self.settings.cdi.enabled:
            self._tasks.append(self.supervisor.spawn("cdi-spec", self._keep_cdi()))

    async def _start_events(self) -> None:
        """The node's recorder, when the DRA driver runs (its account may write Events) or
        events.enabled asks for it; the DRA driver's claim Events go through it too."""
        if self.node_events is not None or not (self.dra is not None
                                                or self.settings.events_enabled):
            return
        node = self.settings.node_name
        if not node:
            log.warning("Kubernetes Events are off: the node's name is not known (set "
                        "NODE_NAME; the chart does)")
            return
        # Without credentials the DRA driver refuses to start, in words of its own.
        self.node_events = await start_node_events(None, node, off=self.files,
                                                   wanted=self._offered,
                                                   quiet=self.dra is not None)
        if self.node_events is not None and self.dra is not None:
            self.dra.events = self.node_events.recorder

    def _offered(self, hca: Hca) -> bool:
        """An HCA a pool or the DRA driver selects: the only ones the node's Events name."""
        if self.dra is not None and self.settings.dra.selectors.matches(hca):
            return True
        return any(p.selectors.matches(hca) for p in self.settings.pools)

    async def _tell_node(self, inventory: NodeInventory) -> None:
        if self.node_events is not None:
            self.node_events.observe(inventory)

    def _say_late_exclusive_overlap(self, hcas: Sequence[Hca]) -> None:
        """HCAs that appeared after start in an exclusive pool and another: said once each.

        At start that is a config error (status 2); a running daemon keeps serving its pods,
        and the next start refuses the config with the same words.
        """
        if not self._pools_checked:
            return  # start checks them first, and refuses the config instead
        for (exclusive, other), names in self._exclusive_overlaps(hcas).items():
            new = [n for n in names if self._told_shared_exclusive.first(
                f"{n} {exclusive} {other}")]
            if new:
                log.error("%s in the exclusive pool %s and in the pool %s: an exclusive "
                          "pool gives each HCA to one pod only, so pods of both may share "
                          "it; give the pools selectors that keep their HCAs apart (a "
                          "restart refuses this config)", _held_by(new), exclusive, other)

    def _exclusive_overlaps(self, hcas: Sequence[Hca]) -> dict[tuple[str, str], list[str]]:
        """(exclusive pool, other pool) -> the HCAs both hold, for each such pair."""
        out: dict[tuple[str, str], list[str]] = {}
        for name, a, b in pools_sharing(self.settings, hcas):
            pair = exclusive_first(a, b)
            if pair is not None:
                held = out.setdefault((pair[0].resource_name, pair[1].resource_name), [])
                if name not in held:
                    held.append(name)
        return out

    def _check_pools_apart(self, hcas: Sequence[Hca]) -> None:
        """An HCA in an exclusive pool and another pool is a config error; shared pools
        may hold a same HCA (their pods then share it), said once here."""
        for (exclusive, other), names in self._exclusive_overlaps(hcas).items():
            raise ConfigError(
                "pools", ", ".join(names), f"{_held_by(names)} in the exclusive pool "
                f"{exclusive} and in the pool {other}: an exclusive pool gives each HCA to one "
                "pod only; give the pools selectors that keep their HCAs apart")
        shared: dict[str, list[str]] = {}
        for name, a, b in pools_sharing(self.settings, hcas):
            for pool in (a, b):
                holders = shared.setdefault(name, [])
                if pool.resource_name not in holders:
                    holders.append(pool.resource_name)
        if shared:
            log.info("shared pools hold the same HCA(s), whose pods share them: %s",
                     "; ".join(f"{n} in {', '.join(p)}" for n, p in shared.items()))
        self._pools_checked = True

    async def stop(self) -> None:
        """Stop every task and close every server, whatever state they are in.

        Each step gets STOP_STEP seconds: one that does not finish (a gRPC shutdown or a
        task that never ends) is named in the log and left, so a stop always returns and
        the steps after it still close their servers.
        """
        self.supervisor.stopping()
        tasks, self._tasks = self._tasks, []
        await cancel_all(tasks, within=STOP_STEP, what="the daemon's tasks")
        lifecycle = asyncio.ensure_future(self.lifecycle.stop())
        await settle([lifecycle], within=STOP_STEP, what="the kubelet lifecycle")
        if not lifecycle.done() or lifecycle.cancelled() or lifecycle.exception() is not None:
            # A lifecycle task that died re-raises in its stop; its servers must still go.
            for server in list(self.lifecycle.servers.values()):
                await settle([server.stop()], within=STOP_STEP, what=f"the {server.path} server")
            self.lifecycle.servers.clear()
            self.lifecycle.remove_sockets()
        if self.dra is not None:
            await settle([self.dra.stop()], within=STOP_STEP, what="the DRA driver")
        if self.http is not None:
            await settle([self.http.stop()], within=STOP_STEP, what="the HTTP server")
            self.http = None
        if self.node_events is not None:
            recorder, self.node_events = self.node_events.recorder, None
            await settle([recorder.close(grace=EVENTS_GRACE)], within=STOP_STEP,
                         what="the Event recorder")

    async def run(self, stop: asyncio.Event,
                  on_started: Callable[[], None] | None = None) -> None:
        """Serve until ``stop`` is set or a root task dies (then :attr:`failed` is True);
        ``on_started`` is called once the daemon has started."""
        stopped = asyncio.ensure_future(stop.wait())
        try:
            # A stop during start (its first discovery may wait a whole read deadline)
            # ends the start: SIGTERM must not wait for a read that never returns.
            starting = asyncio.ensure_future(self.start())
            await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                starting.cancel()
                await asyncio.gather(starting, return_exceptions=True)
                return
            starting.result()
            if on_started is not None:
                on_started()
            failed = asyncio.ensure_future(self.supervisor.failed.wait())
            try:
                await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                failed.cancel()
        finally:
            stopped.cancel()
            log.info("stopping: closing the servers and removing our sockets")
            if await settle([self.stop()], within=STOP_DEADLINE, what="the daemon"):
                # Shutdown must end: say what was stuck, then leave no socket behind.
                stuck = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                log.error("shutdown took over %g s; still running: %s", STOP_DEADLINE,
                          "; ".join(describe(t) for t in stuck))
                self.lifecycle.remove_sockets()
