"""The Prometheus families of ``/metrics``, rendered from one :class:`Status` record.

Gauges and counters are derived from the status snapshot at scrape time, so the
metrics never hold a second copy of the state that could drift from what the kubelet
is told. Port counters come from the health loop's cache (read off the event loop),
never from sysfs at scrape time; the per-port families, most of the text, are written
by ``port_metrics`` and kept between scrapes. The names are a contract with the chart's
alerts and dashboard: change them only together.

This module is imported by the first scrape (``httpserver``), not at start: the Prometheus
client's package loads its HTTP servers and push-gateway code with it (about 50 ms, and
2.7 MiB with the standard library's http.server, urllib, email, wsgiref and gzip), which
registering with the kubelet does not need. The client still writes every family but the
per-port ones (about a hundred samples and its process collector): writing those too
would keep it out of the daemon, but as a second exposition writer and process collector
kept in step with the library by hand, more code than the registries they would replace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import metrics as client_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from rdma_hca.daemon.observe.lldp_metrics import lldp_families
from rdma_hca.daemon.observe.port_metrics import PortText, go_float
from rdma_hca.daemon.observe.status import DraStatus, Status

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ALLOCATE_SECONDS = "rdma_hca_allocate_duration_seconds"


class Collects(Protocol):
    """What renders families of its own beside the snapshot's (a client collector)."""

    def collect(self) -> Iterable[Metric]: ...


def _counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    # prometheus_client appends _total itself.
    return CounterMetricFamily(name.removesuffix("_total"), doc, labels=list(labels))


class StatusFamilies:
    """Every family derived from one snapshot (plus what the HTTP server counts), in the
    two parts that the per-port families (``port_metrics``) go between."""

    def __init__(self, status: Status, http_rejected: int = 0) -> None:
        self.status = status
        self.http_rejected = http_rejected

    def before_ports(self) -> Iterator[Metric]:
        s = self.status
        info = GaugeMetricFamily("rdma_hca_build_info", "Build information",
                                 labels=["version"])
        info.add_metric([s.version], 1.0)
        yield info
        g = GaugeMetricFamily("rdma_hca_hcas", "RDMA HCAs discovered on the node",
                              labels=["usable"])
        g.add_metric(["true"], sum(1 for h in s.hcas if h.usable))
        g.add_metric(["false"], sum(1 for h in s.hcas if not h.usable))
        yield g
        # DCGM names a GPU by its bus ID alone: this puts its PCIe root and NUMA node beside
        # it, the labels rdma_hca_hca_info carries for each HCA.
        gpus = GaugeMetricFamily(
            "rdma_hca_gpu_info", "1 for each NVIDIA GPU of the node, with its PCI bus ID as "
            "DCGM writes it, its PCIe root and NUMA node",
            labels=["pci_bus_id", "pci_address", "pcie_root", "numa_node", "device"])
        for gpu in s.gpus:
            gpus.add_metric([gpu.dcgm_bus_id, gpu.pci_address, gpu.pcie_root or "",
                             "" if gpu.numa_node is None else str(gpu.numa_node),
                             gpu.device or ""], 1.0)
        yield gpus

    def after_ports(self) -> Iterator[Metric]:
        s = self.status
        ipv6 = GaugeMetricFamily(
            "rdma_hca_ipv6_ready",
            "1 when every RoCE HCA has a global IPv6 RoCE v2 GID (non-hostNetwork RDMA works)")
        ipv6.add_metric([], 1.0 if s.ipv6_ready else 0.0)
        yield ipv6
        yield from self._pools(s)
        yield from self._daemon(s)
        yield from self._dra(s)
        if s.lldp is not None:
            yield from lldp_families(s.lldp)

    def _dra(self, s: Status) -> Iterator[Metric]:
        if s.dra is None:
            return
        registered = GaugeMetricFamily("rdma_hca_dra_registered",
                                       "1 while registered with the kubelet's plugin watcher")
        registered.add_metric([], 1.0 if s.dra.registered else 0.0)
        yield registered
        regs = _counter("rdma_hca_dra_registrations_total",
                        "Times the kubelet's plugin watcher registered the DRA driver")
        regs.add_metric([], s.dra.registrations)
        yield regs
        claims = GaugeMetricFamily("rdma_hca_dra_prepared_claims",
                                   "ResourceClaims prepared on this node")
        claims.add_metric([], s.dra.prepared_claims)
        yield claims
        admin = GaugeMetricFamily("rdma_hca_dra_admin_access_prepared",
                                  "ResourceClaims prepared on this node with admin access to "
                                  "a device (holding nothing of it)")
        admin.add_metric([], s.dra.admin_access_claims)
        yield admin
        published = GaugeMetricFamily("rdma_hca_dra_slice_published",
                                      "1 when the node's ResourceSlice matches the HCAs, 0 "
                                      "while publishing it fails")
        published.add_metric([], 0.0 if s.dra.publish_error else 1.0)
        yield published
        # Per claim, not per call: a NodePrepareResources answer is OK for the kubelet's
        # gRPC metrics even when it carries an error for one of its claims. Both results
        # from the start, as for Allocate.
        for name, doc, results in (
                ("rdma_hca_dra_prepare_total", "Claims NodePrepareResources answered",
                 s.dra.prepares),
                ("rdma_hca_dra_unprepare_total", "Claims NodeUnprepareResources answered",
                 s.dra.unprepares)):
            family = _counter(name, doc, ["result"])
            for result in ("ok", "error"):
                family.add_metric([result], results.get(result, 0))
            yield family
        # Every HCA at 0 from the start, so a held share appears as a change, not a new
        # series; an HCA gone while claims hold it keeps its held series. Bits per second,
        # as the capacity and the claims count them (100G is 1e11); Prometheus' naming
        # rules want bytes for a "_bits" name, so the names carry no unit.
        capacity = GaugeMetricFamily(
            "rdma_hca_dra_bandwidth_capacity",
            "Bandwidth the HCA's DRA device publishes as a consumable capacity, bits per "
            "second (0: none)",
            labels=["hca"])
        for hca, bits in sorted(s.dra.bandwidth_capacity.items()):
            capacity.add_metric([hca], float(bits))
        yield capacity
        held = GaugeMetricFamily(
            "rdma_hca_dra_bandwidth_held",
            "Bandwidth of the HCA held by the claims prepared on this node, bits per second",
            labels=["hca"])
        for hca, bits in sorted(s.dra.bandwidth_held.items()):
            held.add_metric([hca], float(bits))
        yield held
        h = s.dra.prepare_seconds
        buckets = [(go_float(b), float(n)) for b, n in zip(h.bounds, h.cumulative, strict=True)]
        buckets.append(("+Inf", float(h.count)))
        yield HistogramMetricFamily("rdma_hca_dra_prepare_seconds",
                                    "Time to prepare one claim of a NodePrepareResources call",
                                    buckets=buckets, sum_value=h.total)
        # The client's own counts; the known series are there from the start, at 0.
        sent = _counter("rdma_hca_api_requests_total",
                        "Requests the DRA driver sent the API server, retries included "
                        "(code <error>: no answer)", ["resource", "verb", "code"])
        for (resource, verb, code), n in sorted(s.dra.api_requests.items()):
            sent.add_metric([resource, verb, code], n)
        yield sent
        waited = _counter("rdma_hca_api_rate_limit_wait_seconds",
                          "Seconds the DRA driver's requests waited for a token of the "
                          "client-side rate limit, by budget (claims, driver)", ["budget"])
        for budget, seconds in sorted(s.dra.api_wait_seconds.items()):
            waited.add_metric([budget], seconds)
        yield waited
        yield from self._claim_status(s.dra)
        left_out = _counter("rdma_hca_dra_attributes_dropped_total",
                            "Attributes and capacities left out of a published device to "
                            "keep within the API's 32 per device (the least useful first), "
                            "each counted when it starts being left out")
        left_out.add_metric([], s.dra.attributes_dropped)
        yield left_out

    @staticmethod
    def _claim_status(dra: DraStatus) -> Iterator[Metric]:
        # At 0 from the start, so the first refusal is an increase an alert can see.
        refused = _counter("rdma_hca_dra_claim_status_refused_total",
                           "Claim status writes the API server refused with a 4xx other "
                           "than 404, 409 and 429 (each claim's state sent at most a few "
                           "times)")
        refused.add_metric([], dra.status_refused)
        yield refused
        dropped = _counter("rdma_hca_dra_claim_status_dropped_total",
                           "Claim status writes the API server took without the driver's "
                           "status.devices entries (its DRAResourceClaimDeviceStatus feature "
                           "gate is off)")
        dropped.add_metric([], dra.status_dropped)
        yield dropped
        pending = GaugeMetricFamily("rdma_hca_dra_claim_status_pending",
                                    "Claims whose status write is queued, backing off or "
                                    "going out")
        pending.add_metric([], dra.status_pending)
        yield pending

    def _pools(self, s: Status) -> Iterator[Metric]:
        total = GaugeMetricFamily("rdma_hca_pool_devices", "Devices advertised to the kubelet",
                                  labels=["resource"])
        healthy = GaugeMetricFamily("rdma_hca_pool_devices_healthy",
                                    "Devices advertised as Healthy", labels=["resource"])
        hcas = GaugeMetricFamily("rdma_hca_pool_hcas", "HCAs the pool selects",
                                 labels=["resource"])
        missing = GaugeMetricFamily("rdma_hca_hca_missing",
                                    "1 while an HCA the pool held has vanished, 0 for each "
                                    "one it holds", labels=["resource", "hca"])
        registered = GaugeMetricFamily("rdma_hca_registered",
                                       "1 while registered with the kubelet", labels=["resource"])
        regs = _counter("rdma_hca_registrations_total",
                        "Successful registrations with the kubelet", ["resource"])
        for p in s.pools:
            total.add_metric([p.resource], p.devices)
            healthy.add_metric([p.resource], p.healthy)
            hcas.add_metric([p.resource], p.hcas)
            # At 0 for every HCA held, so the series is there before the HCA vanishes.
            for name in p.selected:
                if name not in p.missing:
                    missing.add_metric([p.resource, name], 0.0)
            for name in p.missing:
                missing.add_metric([p.resource, name], 1.0)
            registered.add_metric([p.resource], 1.0 if p.registered else 0.0)
            regs.add_metric([p.resource], p.registrations)
        yield from (total, healthy, hcas, missing, registered, regs)
        allocs = _counter("rdma_hca_allocations_total", "Allocate calls answered",
                          ["resource", "result"])
        # Both results of every pool from the start: an alert on increase() of the error
        # series would miss the first errors of a series that appears with them.
        totals = {(p.resource, ok): 0 for p in s.pools for ok in (True, False)}
        totals.update(s.allocations)
        for (resource, ok), n in sorted(totals.items()):
            allocs.add_metric([resource, "ok" if ok else "error"], n)
        yield allocs

    def _daemon(self, s: Status) -> Iterator[Metric]:
        restarts = _counter("rdma_hca_kubelet_restarts_total",
                            "Times kubelet.sock was created again")
        restarts.add_metric([], s.kubelet_restarts)
        yield restarts
        stalls = _counter("rdma_hca_sysfs_stalls_total",
                          "Reads of the machine, and writes of the daemon's own files, "
                          "that passed their deadline")
        stalls.add_metric([], s.sysfs_stalls)
        yield stalls
        errors = _counter("rdma_hca_discovery_errors_total",
                          "Discoveries that failed (fd or memory errors) and kept the last "
                          "state", ["reason"])
        for reason in sorted({"fd", "memory", *s.discovery_errors}):
            errors.add_metric([reason], s.discovery_errors.get(reason, 0))
        yield errors
        rejected = _counter("rdma_hca_http_connections_rejected_total",
                            "HTTP connections refused over the connection cap")
        rejected.add_metric([], self.http_rejected)
        yield rejected
        if s.events is not None:
            events = _counter("rdma_hca_events_total",
                              "Kubernetes Events by outcome: created, patched (a repeat "
                              "counted in its series), failed (refused or unanswered), "
                              "dropped (the recorder's queue was full)", ["outcome"])
            for outcome in ("created", "patched", "failed", "dropped"):
                events.add_metric([outcome], s.events.get(outcome, 0))
            yield events
        if s.health_last_pass is not None:
            last = GaugeMetricFamily("rdma_hca_health_last_pass_timestamp_seconds",
                                     "Unix time the health loop last completed a pass")
            last.add_metric([], s.health_last_pass)
            yield last


    def allocate_latency(self) -> Iterator[Metric]:
        """Allocate latency by resource, the series a client ``Histogram`` labelled by
        resource writes (its ``_created`` too, unless the client's created series are off)."""
        s = self.status
        family = Metric(ALLOCATE_SECONDS, "Time to answer Allocate", "histogram")
        created = bool(getattr(client_metrics, "_use_created", True))
        for resource, h in s.allocate_seconds.items():
            for bound, n in zip(h.bounds, h.cumulative, strict=True):
                family.add_sample(ALLOCATE_SECONDS + "_bucket",
                                  {"resource": resource, "le": go_float(bound)}, float(n))
            family.add_sample(ALLOCATE_SECONDS + "_bucket", {"resource": resource, "le": "+Inf"},
                              float(h.count))
            family.add_sample(ALLOCATE_SECONDS + "_count", {"resource": resource},
                              float(h.count))
            family.add_sample(ALLOCATE_SECONDS + "_sum", {"resource": resource}, h.total)
            if created:
                family.add_sample(ALLOCATE_SECONDS + "_created", {"resource": resource},
                                  s.allocate_created.get(resource, s.started))
        yield family


class _Collect(Collector):
    """Families from a function, as the collector a registry renders."""

    def __init__(self, families: Callable[[], Iterable[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families()


_PROCESS = ProcessCollector(registry=None)


def render(status: Status, extra: Iterable[Collects] = (), http_rejected: int = 0,
           ports: PortText | None = None) -> bytes:
    """The exposition text of one snapshot; pure, so it may run on any thread. Pass the
    same ``ports`` to every call to keep the per-port text between scrapes."""
    return b"".join(render_parts(status, extra, http_rejected, ports))


def render_parts(status: Status, extra: Iterable[Collects] = (), http_rejected: int = 0,
                 ports: PortText | None = None) -> list[bytes]:
    """:func:`render`'s text in the three parts it is made of, the port text (most of
    it, and kept) in the middle: the HTTP server copies them once, into its response."""
    families = StatusFamilies(status, http_rejected)
    before = CollectorRegistry(auto_describe=False)
    before.register(_Collect(families.before_ports))
    after = CollectorRegistry(auto_describe=False)
    after.register(_Collect(families.after_ports))
    after.register(_PROCESS)
    after.register(_Collect(families.allocate_latency))
    for c in extra:
        after.register(_Collect(c.collect))
    port_text = (ports or PortText()).get(status.hcas, status.counters, status.state_changes)
    return [generate_latest(before), port_text, generate_latest(after)]
