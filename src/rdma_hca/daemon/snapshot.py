"""The daemon's state now, as the one frozen record /metrics and the probes read.

The endpoints never reach into the daemon's parts: each scrape or probe takes a
:class:`~rdma_hca.daemon.observe.status.Status` built here from them, cheaply (no
per-HCA work), so a render off the loop reads values no task can change under it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from rdma_hca import __version__
from rdma_hca.daemon.findings import NodeJudge
from rdma_hca.daemon.supervise import Supervisor
from rdma_hca.daemon.watch.health import HealthWatcher
from rdma_hca.daemon.watch.machine import MachineReader
from rdma_hca.kit.offloop import OffLoop

if TYPE_CHECKING:
    from rdma_hca.daemon.deviceplugin.allocations import AllocationStats
    from rdma_hca.daemon.deviceplugin.kubelet import KubeletLifecycle
    from rdma_hca.daemon.deviceplugin.runtime import PoolRuntime
    from rdma_hca.daemon.dra.driver import DraDriver
    from rdma_hca.daemon.fabric.listener import LldpListener
    from rdma_hca.daemon.fabric.nodelabel import NodeFabricWriter
    from rdma_hca.daemon.observe.status import LldpStatus, Status
    from rdma_hca.kube.events import EventRecorder

STALE_PASSES = 5  # /healthz fails after this many poll intervals without a health pass


class StatusSnapshot:
    """``recorder`` gives the node's Event recorder once start has made one, and
    ``node_writer`` the Node fabric writer; ``lifecycle`` and ``allocations`` are None
    when no pool is served (the DRA driver alone), and ``runtimes`` is empty then."""

    def __init__(self, *, runtimes: Sequence[PoolRuntime],
                 lifecycle: KubeletLifecycle | None,
                 allocations: AllocationStats | None, health: HealthWatcher, reader: MachineReader,
                 files: OffLoop, supervisor: Supervisor, judge: NodeJudge,
                 dra: DraDriver | None, recorder: Callable[[], EventRecorder | None],
                 health_poll_seconds: float, read_deadline: float,
                 lldp: LldpListener | None = None,
                 node_writer: Callable[[], NodeFabricWriter | None] = lambda: None) -> None:
        self.runtimes = runtimes
        self.lifecycle = lifecycle
        self.allocations = allocations
        self.health = health
        self.reader = reader
        self.files = files
        self.supervisor = supervisor
        self.judge = judge
        self.dra = dra
        self.lldp = lldp
        self.node_writer = node_writer
        self.recorder = recorder
        self.started = time.time()
        self.health_stale_after = max(STALE_PASSES * health_poll_seconds,
                                      2 * read_deadline + 5.0)

    @staticmethod
    def preload() -> None:
        """Load the status records ahead of the first :meth:`take` (blocking: an import).

        No probe or scrape comes before the kubelet's registration, which need not wait
        for them: the daemon loads them once registered, off the loop.
        """
        from rdma_hca.daemon.observe import status  # noqa: F401

    def take(self) -> Status:
        """The daemon's state now, as one frozen record."""
        from rdma_hca.daemon.observe.status import DraStatus, PoolStatus, Status

        inv = self.health.inventory
        recorder = self.recorder()
        dra = self.dra.stats() if self.dra is not None else None
        lifecycle, allocations = self.lifecycle, self.allocations
        return Status(
            version=__version__,
            hcas=inv.hcas if inv is not None else (),
            gpus=inv.gpus if inv is not None else (),
            events=None if recorder is None else _event_counts(recorder),
            lldp=self._lldp(),
            pools=() if lifecycle is None else tuple(
                PoolStatus(
                    resource=r.resource_name,
                    devices=len(r.state.devices),
                    healthy=r.state.healthy_count(),
                    hcas=r.selected_hca_count,
                    missing=r.missing_hcas,
                    registered=bool(lifecycle.registered.get(r.resource_name)),
                    registrations=lifecycle.registrations.get(r.resource_name, 0),
                    selected=r.selected_hcas,
                )
                for r in self.runtimes
            ),
            kubelet_restarts=0 if lifecycle is None else lifecycle.kubelet_restarts,
            allocations={} if allocations is None else dict(allocations.total),
            allocate_seconds={} if allocations is None else allocations.latency(),
            allocate_created={} if allocations is None else dict(allocations.created),
            ipv6_ready=self.judge.ipv6_ready,
            counters=self.health.counters,
            state_changes=self.health.state_changes,
            sysfs_stalls=self.reader.stalls_total + self.files.stalls_total + (
                dra.file_stalls if dra is not None else 0),
            discovery_errors=self.health.discovery_errors,
            started=self.started,
            health_last_pass=self.health.last_pass,
            dead_tasks=tuple(self.supervisor.dead),
            health_stale_after=self.health_stale_after,
            dra=None if dra is None else DraStatus(
                registered=dra.registered,
                registrations=dra.registrations,
                prepared_claims=dra.prepared_claims,
                publish_error=dra.publish_error,
                published=dra.published,
                prepares=dra.prepares,
                unprepares=dra.unprepares,
                prepare_seconds=dra.prepare_seconds,
                bandwidth_capacity=dra.bandwidth_capacity,
                bandwidth_held=dra.bandwidth_held,
                api_requests=dra.api_requests,
                api_wait_seconds=dra.api_wait_seconds,
                status_refused=dra.status_refused,
                status_dropped=dra.status_dropped,
                status_pending=dra.status_pending,
                attributes_dropped=dra.attributes_dropped,
                admin_access_claims=dra.admin_access_claims,
            ),
        )

    def _lldp(self) -> LldpStatus | None:
        if self.lldp is None:
            return None
        from rdma_hca.daemon.observe.status import LldpStatus

        s = self.lldp.stats()
        writer = self.node_writer()
        return LldpStatus(
            node_writes=None if writer is None else writer.stats.writes,
            node_write_errors=0 if writer is None else writer.stats.errors,
            listening=s.off is None, neighbours=s.neighbours,
            last_frame_age={k: max(0.0, s.now - at) for k, at in s.last_frame.items()},
            ports=s.ports, frames=s.frames, dropped=s.dropped, holds=s.holds)

def _event_counts(recorder: EventRecorder) -> Mapping[str, int]:
    # Loaded with the recorder: a daemon without Events never imports the API client.
    from rdma_hca.daemon.offer.nodeevents import stats

    return stats(recorder)
