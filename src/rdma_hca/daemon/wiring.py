"""Wiring of the node daemon: discovery → pools → kubelet lifecycle → HTTP endpoints.

``Daemon.run`` is what ``rdma-hca serve`` runs; the demo, the tests and the
benchmarks run the same object on simulated trees. This module builds the daemon's
parts and runs their life cycle (start, stop, run, SIGHUP); beside it in the
composition root, ``snapshot`` builds the status the endpoints read (they see the
daemon only through :meth:`Daemon.status`, a frozen record), ``overlaps`` judges the
pools' selectors on the live inventory, and ``findings`` follows the node's inventories
for what non-hostNetwork pods need. The CDI spec follows them in ``offer.cdifollow``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rdma_hca.contract.fabric import PortNeighbour
from rdma_hca.daemon.findings import NodeJudge
from rdma_hca.daemon.observe.httpserver import MetricsServer
from rdma_hca.daemon.offer.cdifollow import CDI_CHECK_SECONDS, CdiFollower
from rdma_hca.daemon.offer.env import env_settings
from rdma_hca.daemon.overlaps import PoolOverlaps
from rdma_hca.daemon.snapshot import StatusSnapshot
from rdma_hca.daemon.supervise import Supervisor
from rdma_hca.daemon.watch.health import HealthWatcher
from rdma_hca.daemon.watch.machine import MachineReader
from rdma_hca.kit import dirwatch
from rdma_hca.kit.aio import cancel_all, describe, settle
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kit.probe import default_dir, probe_socket_path
from rdma_hca.kit.workers import WORKERS
from rdma_hca.node.deadline_reader import NodeReader
from rdma_hca.node.model import Hca, NodeInventory
from rdma_hca.settings.model import KUBELET_SOCKET, ConfigError, Settings

if TYPE_CHECKING:
    from rdma_hca.daemon.deviceplugin.allocations import AllocationStats
    from rdma_hca.daemon.deviceplugin.kubelet import KubeletLifecycle
    from rdma_hca.daemon.deviceplugin.runtime import PoolRuntime
    from rdma_hca.daemon.dra.driver import DraDriver
    from rdma_hca.daemon.fabric.listener import LldpListener
    from rdma_hca.daemon.fabric.nodelabel import NodeFabricWriter
    from rdma_hca.daemon.observe.status import Status
    from rdma_hca.daemon.offer.nodeevents import NodeEvents
    from rdma_hca.kube.events import EventRecorder

log = logging.getLogger(__name__)

STOP_DEADLINE = 1.5  # SIGTERM must end the process within 2 s
STOP_STEP = 1.0  # what one step of a stop may take before it is named and left
EVENTS_GRACE = 0.5  # what a stop gives queued Events to go out
# ``on_started`` waits for the kubelet to have registered every front end (this long at
# most), then for the calls a kubelet makes once it has (ListAndWatch, GetInfo).
REGISTERED_WAIT = 2.0
REGISTERED_POLL = 0.01
AFTER_REGISTERED = 0.25


class Daemon:
    def __init__(self, settings: Settings, *, netlink: bool = True,
                 reader: MachineReader | None = None,
                 read_deadline: float | None = None,
                 probe_dir: str | None = None,
                 cdi_check_seconds: float = CDI_CHECK_SECONDS,
                 node_writer: Mapping[str, float] | None = None) -> None:
        """``node_writer``: the Node writer's ``spacing`` and ``start_grace`` (tests use
        short ones)."""
        self.settings = settings
        # The probe socket sits in the pod's own scratch directory (``/tmp``, an emptyDir),
        # named after the pod: only with a pod UID is it surely this instance's.
        self.probe_socket = (probe_socket_path(probe_dir or default_dir(os.environ),
                                               settings.pod_uid)
                             if settings.pod_uid else None)
        # ``read_deadline`` overrides the setting (tests use short ones).
        self.read_deadline = (settings.read_deadline_seconds if read_deadline is None
                              else read_deadline)
        # The device plugin, when a pool is served. Its modules load only then: the DRA
        # driver alone pays for none of them (its gRPC service and protobuf messages).
        self.runtimes: list[PoolRuntime] = []
        self.allocations: AllocationStats | None = None
        self.lifecycle: KubeletLifecycle | None = None
        if settings.pools:
            from rdma_hca.daemon.deviceplugin.allocations import AllocationStats
            from rdma_hca.daemon.deviceplugin.kubelet import KubeletLifecycle
            from rdma_hca.daemon.deviceplugin.runtime import PoolRuntime

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
        # The DRA driver, beside or instead of the device plugin pools. Its modules load
        # only when it is on, and lightkube only when it starts: a daemon without DRA
        # pays for neither.
        self.dra: DraDriver | None = None
        if settings.dra.enabled:
            from rdma_hca.daemon.dra.config import DriverConfig
            from rdma_hca.daemon.dra.driver import DraDriver

            self.dra = DraDriver(DriverConfig.from_settings(settings,
                                                            read_deadline=self.read_deadline))
        # The files the daemon owns (its CDI spec) are written off the loop, within the
        # read deadline: a hung filesystem must not stop the loop either.
        self.files = OffLoop(self.read_deadline)
        # Each RoCE port's switch from LLDP (fabric.lldp), for both front ends: the DRA
        # driver's attributes, the Node's label and /metrics follow ``lldp.neighbours``.
        self.lldp: LldpListener | None = None
        if settings.fabric.lldp:
            from rdma_hca.daemon.fabric.listener import LldpListener

            self.lldp = LldpListener(settings.sysfs_root,
                                     hold_seconds=settings.flap_hold_seconds, files=self.files)
        # The Node's fabric block label and neighbours annotation (fabric.lldp, NODE_NAME
        # and credentials): made at start.
        self.node_writer: NodeFabricWriter | None = None
        self._node_writer_kw = dict(node_writer or {})
        self.cdi = CdiFollower(settings.cdi.spec_dir, self.health.inventories,
                               lambda: (h for r in self.runtimes for h in r.view.hcas),
                               self.files, check_seconds=cdi_check_seconds)
        self.supervisor = Supervisor()
        self.overlaps = PoolOverlaps(settings)
        self.node_judge = NodeJudge(settings, self.runtimes, self.overlaps)
        # Kubernetes Events about the node (and, handed to the DRA driver, its claims).
        self.node_events: NodeEvents | None = None
        self.http: MetricsServer | None = None
        self.snapshot = StatusSnapshot(
            runtimes=self.runtimes, lifecycle=self.lifecycle, allocations=self.allocations,
            health=self.health, reader=self.reader, files=self.files,
            supervisor=self.supervisor, judge=self.node_judge, dra=self.dra,
            recorder=lambda: self._recorder,
            health_poll_seconds=settings.health_poll_seconds,
            read_deadline=self.read_deadline, lldp=self.lldp,
            node_writer=lambda: self.node_writer)
        self._tasks: list[asyncio.Task[None]] = []

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

    def status(self) -> Status:
        """The daemon's state now, as one frozen record (what the endpoints read)."""
        return self.snapshot.take()

    # --- SIGHUP -----------------------------------------------------------------------

    def rescan(self) -> None:
        """Rediscover now and check the kubelet's socket and ours (what SIGHUP means)."""
        lifecycle = self.lifecycle
        gone = [] if lifecycle is None else [
            r for r, s in lifecycle.servers.items() if not os.path.exists(s.path)]
        kubelet = os.path.exists(os.path.join(self.settings.kubelet_dir, KUBELET_SOCKET))
        log.info("rescan asked (SIGHUP): rediscovering the node; kubelet.sock %s%s",
                 "is there" if kubelet else "is missing",
                 f"; our socket is gone for {', '.join(gone)}" if gone else "")
        self.health.poke(full=True)
        if lifecycle is not None:
            for resource in gone:
                lifecycle.request(resource, "rescan: our socket is gone", hurry=True)

    # --- running ----------------------------------------------------------------------

    async def start(self) -> None:
        """Discover, then serve and register, then watch; returns once started."""
        # Both front ends watch the kubelet's directories from the moment they serve: the
        # inotify bindings load beside the first discovery, whose reads leave the GIL free
        # much of the time, rather than on the loop while the kubelet registers us. So are
        # the Events client's credentials read (with a kubeconfig: the YAML parser loaded).
        loading = asyncio.ensure_future(WORKERS.run(dirwatch.load, "rdma-hca-preload"))
        events = asyncio.ensure_future(self._start_events())
        try:
            inventory = await self.health.refresh()
        except BaseException:
            events.cancel()
            # The bindings' load ends on its own; what it raised is the failed start's.
            await asyncio.gather(events, loading, return_exceptions=True)
            raise
        await loading
        log.info("found %d RDMA HCA(s): %s", len(inventory.hcas),
                 ", ".join(h.name for h in inventory.hcas) or "none")
        await events
        try:
            self.overlaps.refuse_at_start(inventory.hcas)
        except ConfigError as exc:
            if self.node_events is not None:
                # Beside the exit, where `kubectl describe node` shows it; bounded.
                await self.node_events.refused_sent(str(exc))
            raise
        if self.node_events is not None:
            self.node_events.observe(inventory)
        if self.settings.metrics_address:
            server = MetricsServer(self.status, self.settings.metrics_address,
                                   on_scrape=self.health.want_counters,
                                   max_connections=self.settings.http.max_connections,
                                   probe_socket=self.probe_socket,
                                   # Two pods of one DaemonSet overlap only with DRA alone.
                                   share_port=(self.dra is not None and bool(self.settings.pod_uid)
                                               and not self.settings.device_plugin_enabled))
            await server.start()
            self.http = server
            self.health.on_counters = server.counters_read
            await self.health.refresh_counters()
        # What the followers do for later inventories is done once for the first one
        # before anything is served: a pod allocated at once must find its CDI devices.
        await self.node_judge.judge(inventory)
        if self.settings.cdi.enabled:
            await self.cdi.write(inventory)
        if self.lifecycle is not None:
            # DRA alone has no device-plugins directory to wait for.
            await self.lifecycle.start()
            self.supervisor.watch(self.lifecycle.tasks)
        if self.lldp is not None:
            await self.lldp.follow(inventory)
            await self._start_node_writer()
        # The followers take it from the inventory start has handed them already.
        seen = self.health.inventories.generation
        if self.dra is not None:
            await self.dra.start(inventory, events=(self.node_events.recorder
                                                    if self.node_events is not None else None))
            self.supervisor.watch(self.dra.tasks)
            self._tasks.append(self.supervisor.spawn(
                "dra-follow", self.health.follow(self.dra.update, seen)))
            if self.lldp is not None:
                self._tasks.append(self.supervisor.spawn(
                    "dra-neighbours", follow_neighbours(self.lldp, self.dra)))
        if self.lldp is not None:
            self._tasks.append(self.supervisor.spawn("lldp", self.lldp.run()))
            if self.node_writer is not None:
                self._tasks.append(self.supervisor.spawn("fabric-node-writer",
                                                         self.node_writer.run()))
                # Silent ports too, so that doctor tells them from ports not listened on.
                self._tasks.append(self.supervisor.spawn(
                    "fabric-node-follow", self.node_writer.follow(self.lldp.every_port)))
            self._tasks.append(self.supervisor.spawn(
                "lldp-follow", self.health.follow(self.lldp.follow, seen)))
        self._tasks.append(self.supervisor.spawn(
            "node-findings", self.health.follow(self.node_judge.judge, seen)))
        if self.node_events is not None:
            self._tasks.append(self.supervisor.spawn(
                "node-events", self.health.follow(self._tell_node, seen)))
        self._tasks.append(self.supervisor.spawn("health", self.health.run()))
        if self.settings.cdi.enabled:
            self._tasks.append(self.supervisor.spawn("cdi-spec", self.cdi.keep()))

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
        from rdma_hca.daemon.offer.nodeevents import start_node_events

        # Without credentials the DRA driver refuses to start, in words of its own.
        self.node_events = await start_node_events(None, node, off=self.files,
                                                   wanted=self._offered,
                                                   quiet=self.dra is not None)

    async def _start_node_writer(self) -> None:
        """The Node writer, whichever front end runs; without the node's name or
        credentials one line says the label is off, and nothing else changes."""
        if self.node_writer is not None:
            return
        from rdma_hca.daemon.fabric.nodelabel import connect_node_writer

        self.node_writer = await connect_node_writer(self.settings.node_name, off=self.files,
                                                     **self._node_writer_kw)

    def _offered(self, hca: Hca) -> bool:
        """An HCA a pool or the DRA driver selects: the only ones the node's Events name."""
        if self.dra is not None and self.settings.dra.selectors.matches(hca):
            return True
        return any(p.selectors.matches(hca) for p in self.settings.pools)

    async def _tell_node(self, inventory: NodeInventory) -> None:
        if self.node_events is not None:
            self.node_events.observe(inventory)

    async def stop(self) -> None:
        """Stop every task and close every server, whatever state they are in.

        Each step gets STOP_STEP seconds: one that does not finish (a gRPC shutdown or a
        task that never ends) is named in the log and left, so a stop always returns and
        the steps after it still close their servers.
        """
        self.supervisor.stopping()
        tasks, self._tasks = self._tasks, []
        await cancel_all(tasks, within=STOP_STEP, what="the daemon's tasks")
        if self.lifecycle is not None:
            await self._stop_lifecycle(self.lifecycle)
        if self.dra is not None:
            await settle([self.dra.stop()], within=STOP_STEP, what="the DRA driver")
        if self.node_writer is not None:
            # Its tasks are the daemon's, cancelled above: this closes its client.
            await settle([self.node_writer.stop(close_api=True)], within=STOP_STEP,
                         what="the Node fabric writer")
        if self.http is not None:
            self.health.on_counters = None
            await settle([self.http.stop()], within=STOP_STEP, what="the HTTP server")
            self.http = None
        if self.node_events is not None:
            recorder, self.node_events = self.node_events.recorder, None
            await settle([recorder.close(grace=EVENTS_GRACE)], within=STOP_STEP,
                         what="the Event recorder")

    @staticmethod
    async def _stop_lifecycle(lifecycle: KubeletLifecycle) -> None:
        stopping = asyncio.ensure_future(lifecycle.stop())
        await settle([stopping], within=STOP_STEP, what="the kubelet lifecycle")
        if not stopping.done() or stopping.cancelled() or stopping.exception() is not None:
            # A lifecycle task that died re-raises in its stop; its servers must still go.
            for server in list(lifecycle.servers.values()):
                await settle([server.stop()], within=STOP_STEP, what=f"the {server.path} server")
            lifecycle.servers.clear()
            lifecycle.remove_sockets()

    async def _once_registered(self, then: Callable[[], None],
                               unless: set[asyncio.Future[Any]]) -> None:
        """Call ``then`` once the kubelet has registered every front end and made its
        first calls (or had REGISTERED_WAIT to), and what only the probes and scrapes use
        is loaded (off the loop), unless one of ``unless`` ends first.

        What start-up's end does (a full collection: 10 to 30 ms holding the GIL) would
        otherwise come in the middle of the kubelet's registration, which the device
        plugin's start begins but does not wait for.
        """
        async def registered() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + REGISTERED_WAIT
            while not self._registered() and loop.time() < deadline:
                await asyncio.sleep(REGISTERED_POLL)
            await asyncio.sleep(AFTER_REGISTERED)

        async def registered_and_loaded() -> None:
            await registered()
            await WORKERS.run(self.snapshot.preload, "rdma-hca-preload")

        waiting = asyncio.ensure_future(registered_and_loaded())
        try:
            await asyncio.wait({waiting, *unless}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if waiting.done() and not waiting.cancelled():
            then()

    def _registered(self) -> bool:
        return ((self.lifecycle is None or self.lifecycle.ready())
                and (self.dra is None or self.dra.stats().registered))

    async def run(self, stop: asyncio.Event,
                  on_started: Callable[[], None] | None = None) -> None:
        """Serve until ``stop`` is set or a root task dies (then :attr:`failed` is True);
        ``on_started`` is called once the daemon has started and the kubelet has
        registered it (see :meth:`_once_registered`)."""
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
            failed = asyncio.ensure_future(self.supervisor.failed.wait())
            try:
                if on_started is not None:
                    await self._once_registered(on_started, {stopped, failed})
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
                if self.lifecycle is not None:
                    self.lifecycle.remove_sockets()


async def follow_neighbours(lldp: LldpListener, dra: DraDriver) -> None:
    """The DRA driver's switch attributes follow the neighbours (from the current ones):
    the heard ones only, a silent port reaches no switch."""
    await dra.update_neighbours(_heard(lldp.neighbours.value))
    async for neighbours in lldp.neighbours.follow(lldp.neighbours.generation):
        await dra.update_neighbours(_heard(neighbours))


def _heard(neighbours: tuple[PortNeighbour, ...]) -> tuple[PortNeighbour, ...]:
    return tuple(n for n in neighbours if n.heard)
