"""The daemon's state as one frozen record, for /metrics and the probes.

The HTTP endpoints read this record and nothing else of the daemon: the daemon
builds it from its parts (``wiring.Daemon.status``), so the endpoints never reach
into objects that other tasks are changing, and a scrape renders a value no task can
change under it (which is what lets it render off the event loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rdma_hca.contract.fabric import PortNeighbour
from rdma_hca.kit.histogram import HistogramCounts
from rdma_hca.node.model import Gpu, Hca


@dataclass(frozen=True, slots=True)
class PoolStatus:
    resource: str
    devices: int  # advertised to the kubelet
    healthy: int  # advertised Healthy
    hcas: int  # HCAs the pool selects
    missing: tuple[str, ...]  # HCAs the pool held that have vanished
    registered: bool
    registrations: int
    selected: tuple[str, ...] = ()  # names of the HCAs it selects now


@dataclass(frozen=True, slots=True)
class DraStatus:
    registered: bool  # with the kubelet's plugin watcher
    registrations: int
    prepared_claims: int
    publish_error: str | None  # why the node's ResourceSlice could not be published
    published: bool = True  # a slice was published since the driver started
    # Claims answered, by result ("ok", "error"), and each claim's Prepare time.
    prepares: Mapping[str, int] = field(default_factory=dict)
    unprepares: Mapping[str, int] = field(default_factory=dict)
    prepare_seconds: HistogramCounts = field(default_factory=HistogramCounts)
    # By HCA name, bits per second: what each HCA's device publishes (0: nothing) and
    # what the prepared claims hold of it.
    bandwidth_capacity: Mapping[str, int] = field(default_factory=dict)
    bandwidth_held: Mapping[str, int] = field(default_factory=dict)
    # The driver's API client: requests by (resource, verb, code), and seconds spent
    # waiting for a token by budget ("claims", "driver").
    api_requests: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    api_wait_seconds: Mapping[str, float] = field(default_factory=dict)
    # The claims' status.devices writes: refused (a 4xx other than 404, 409, 429), taken
    # without our entries (the API server's feature gate off), and claims whose write is
    # queued, backing off or going out.
    status_refused: int = 0
    status_dropped: int = 0
    status_pending: int = 0
    # Attributes and capacities left out of a device to keep within the API's limit.
    attributes_dropped: int = 0
    # Prepared claims given a device with admin access (they hold nothing of it).
    admin_access_claims: int = 0


@dataclass(frozen=True, slots=True)
class LldpStatus:
    """The LLDP listener (fabric.lldp): each port's neighbour and what the wire sent."""

    listening: bool  # False: off, the daemon may not open raw sockets (no CAP_NET_RAW)
    neighbours: tuple[PortNeighbour, ...] = ()
    # Seconds since each port's last frame, for the ports that had one (hca, port).
    last_frame_age: Mapping[tuple[str, int], float] = field(default_factory=dict)
    ports: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # netdev -> port
    frames: Mapping[str, int] = field(default_factory=dict)  # read, by netdev
    dropped: Mapping[str, int] = field(default_factory=dict)  # by reason
    holds: int = 0  # times a port's neighbour was held for churn
    # The Node writer's patches and failed passes; None: it does not run (no NODE_NAME or
    # no credentials).
    node_writes: int | None = None
    node_write_errors: int = 0


@dataclass(frozen=True, slots=True)
class Liveness:
    """What /healthz answers: ``ok``, or why not."""

    ok: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Status:
    version: str
    hcas: tuple[Hca, ...] = ()
    pools: tuple[PoolStatus, ...] = ()
    kubelet_restarts: int = 0
    allocations: Mapping[tuple[str, bool], int] = field(default_factory=dict)
    allocate_seconds: Mapping[str, HistogramCounts] = field(default_factory=dict)
    allocate_created: Mapping[str, float] = field(default_factory=dict)  # unix time
    ipv6_ready: bool = False
    counters: Mapping[tuple[str, int], Mapping[str, int]] = field(default_factory=dict)
    state_changes: Mapping[tuple[str, int], int] = field(default_factory=dict)
    sysfs_stalls: int = 0
    discovery_errors: Mapping[str, int] = field(default_factory=dict)
    started: float = 0.0  # unix time the daemon started
    health_last_pass: float | None = None  # unix time
    dead_tasks: tuple[str, ...] = ()
    health_stale_after: float = 10.0  # seconds without a completed pass that fail /healthz
    dra: DraStatus | None = None  # None: the DRA driver is off
    gpus: tuple[Gpu, ...] = ()  # the node's NVIDIA GPUs, for the join series
    # Kubernetes Events by outcome (created, patched, failed, dropped); None: no recorder.
    events: Mapping[str, int] | None = None
    lldp: LldpStatus | None = None  # None: fabric.lldp is off

    @property
    def ready(self) -> bool:
        """Every device plugin pool registered, and the DRA driver when it runs."""
        if not self.pools and self.dra is None:
            return False
        return not self.waiting

    @property
    def waiting(self) -> tuple[str, ...]:
        waiting = [p.resource for p in self.pools if not p.registered]
        if self.dra is not None and not self.dra.registered:
            waiting.append("the DRA driver (plugin watcher)")
        if self.dra is not None and not self.dra.published:
            waiting.append("the DRA driver's ResourceSlice (none published since start)")
        return tuple(waiting)

    def liveness(self, now: float) -> Liveness:
        """Alive unless a root task died or the health loop stopped completing passes."""
        if self.dead_tasks:
            return Liveness(False, "task ended unexpectedly: " + ", ".join(self.dead_tasks))
        # Before its first pass the loop is judged from the start: a first pass that
        # never ends is as dead as a later one.
        last = self.health_last_pass if self.health_last_pass is not None else self.started
        age = now - last
        if age > self.health_stale_after:
            return Liveness(False, f"the health loop has not completed a pass for {age:.0f} s "
                                   f"(limit {self.health_stale_after:g} s)")
        return Liveness(True)
