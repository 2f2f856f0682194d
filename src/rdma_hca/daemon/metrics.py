"""``/metrics``, ``/healthz`` and ``/readyz`` on one small asyncio HTTP server.

Gauges are computed from the daemon at scrape time (a custom collector), so the
metrics never hold a second copy of the state that could drift from what the
kubelet is told. Only the Allocate histogram accumulates here, since latencies
exist nowhere else. The server runs on the daemon's event loop: no extra thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from rdma_hca.node.roce import ipv6_missing
from rdma_hca.node.sysfs import read_port_counters

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from rdma_hca.daemon.allocations import AllocationStats
    from rdma_hca.daemon.config import Settings
    from rdma_hca.daemon.kubelet import KubeletLifecycle
    from rdma_hca.daemon.runtime import PoolRuntime
    from rdma_hca.node.model import NodeInventory


class Daemon(Protocol):
    """What the endpoints read of the daemon."""

    settings: Settings
    runtimes: list[PoolRuntime]
    lifecycle: KubeletLifecycle
    allocations: AllocationStats

    @property
    def inventory(self) -> NodeInventory | None: ...

    def ready(self) -> bool: ...

log = logging.getLogger("rdma_hca.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PORT_STATES = ("ACTIVE", "DOWN", "INIT", "ARMED", "ACTIVE_DEFER")
COUNTERS = {
    "port_rcv_data": ("rdma_hca_port_receive_bytes_total", 4),
    "port_xmit_data": ("rdma_hca_port_transmit_bytes_total", 4),
    "port_rcv_packets": ("rdma_hca_port_receive_packets_total", 1),
    "port_xmit_packets": ("rdma_hca_port_transmit_packets_total", 1),
    "port_rcv_errors": ("rdma_hca_port_receive_errors_total", 1),
    "port_xmit_discards": ("rdma_hca_port_transmit_discards_total", 1),
    "link_downed": ("rdma_hca_port_link_downed_total", 1),
}


class DaemonCollector(Collector):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Metric]:
        d = self.daemon
        inv = d.inventory
        hcas = inv.hcas if inv is not None else ()
        g = GaugeMetricFamily("rdma_hca_hcas", "RDMA HCAs discovered on the node",
                              labels=["usable"])
        g.add_metric(["true"], sum(1 for h in hcas if h.usable))
        g.add_metric(["false"], sum(1 for h in hcas if not h.usable))
        yield g

        up = GaugeMetricFamily("rdma_hca_port_up", "1 when the port is ACTIVE and LinkUp",
                               labels=["hca", "port", "link_layer"])
        state = GaugeMetricFamily("rdma_hca_port_state", "1 for the port's current state",
                                  labels=["hca", "port", "state"])
        rate = GaugeMetricFamily("rdma_hca_port_rate_gbps", "Port rate in Gb/s",
                                 labels=["hca", "port"])
        counters = {
            name: CounterMetricFamily(metric.removesuffix("_total"),
                                      f"Port counter {name} from sysfs", labels=["hca", "port"])
            for name, (metric, _) in COUNTERS.items()
        }
        for h in hcas:
            for p in h.ports:
                labels = [h.name, str(p.number)]
                up.add_metric([*labels, p.link_layer.value], 1.0 if p.is_up else 0.0)
                for s in PORT_STATES:
                    state.add_metric([*labels, s], 1.0 if p.state == s else 0.0)
                if p.rate_gbps is not None:
                    rate.add_metric(labels, p.rate_gbps)
                # Read at scrape time: the kernel keeps the counters, we keep nothing.
                values = read_port_counters(d.settings.sysfs_root, h.name, p.number)
                for name, (_, scale) in COUNTERS.items():
                    if name in values:
                        counters[name].add_metric(labels, values[name] * scale)
        yield up
        yield state
        yield rate
        yield from counters.values()

        total = GaugeMetricFamily("rdma_hca_pool_devices", "Devices advertised to the kubelet",
                                  labels=["resource"])
        healthy = GaugeMetricFamily("rdma_hca_pool_devices_healthy",
                                    "Devices advertised as Healthy", labels=["resource"])
        registered = GaugeMetricFamily("rdma_hca_registered",
                                       "1 while registered with the kubelet", labels=["resource"])
        regs = CounterMetricFamily("rdma_hca_registrations",
                                   "Successful registrations with the kubelet",
                                   labels=["resource"])
        for r in d.runtimes:
            name = r.resource_name
            total.add_metric([name], len(r.state.devices))
            healthy.add_metric([name], r.state.healthy_count())
            registered.add_metric([name], 1.0 if d.lifecycle.registered.get(name) else 0.0)
            regs.add_metric([name], d.lifecycle.registrations.get(name, 0))
        yield total
        yield healthy
        yield registered
        yield regs

        allocs = CounterMetricFamily("rdma_hca_allocations", "Allocate calls answered",
                                     labels=["resource", "result"])
        for (resource, ok), n in sorted(d.allocations.total.items()):
            allocs.add_metric([resource, "ok" if ok else "error"], n)
        yield allocs
        restarts = CounterMetricFamily("rdma_hca_kubelet_restarts",
                                       "Times kubelet.sock was created again")
        restarts.add_metric([], d.lifecycle.kubelet_restarts)
        yield restarts
        ipv6 = GaugeMetricFamily(
            "rdma_hca_ipv6_ready",
            "1 when every RoCE HCA has a global IPv6 RoCE v2 GID (non-hostNetwork RDMA works)")
        # Judged from the pools' HCAs whether or not the switch is on: the node findings
        # only look when it is, and an operator reads this gauge to decide whether to
        # turn it on.
        pool_hcas = {h.name: h for r in d.runtimes for h in r.view.hcas}
        ipv6.add_metric([], 0.0 if ipv6_missing(pool_hcas.values()) else 1.0)
        yield ipv6


class MetricsServer:
    def __init__(self, daemon: Daemon, address: str) -> None:
        self.daemon = daemon
        host, _, port = address.rpartition(":")
        self.host = host.strip("[]") or None
        self.port = int(port)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(DaemonCollector(daemon))
        self.latency = Histogram(
            "rdma_hca_allocate_seconds", "Time to answer Allocate", ["resource"],
            registry=self.registry,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0),
        )
        self._server: asyncio.Server | None = None
        daemon.allocations.observers.append(self._observe)

    def _observe(self, resource: str, seconds: float, ok: bool) -> None:
        self.latency.labels(resource).observe(seconds)

    @property
    def bound_port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        log.info("serving /metrics, /healthz and /readyz on port %d", self.bound_port)

    async def stop(self) -> None:
        if self._observe in self.daemon.allocations.observers:
            self.daemon.allocations.observers.remove(self._observe)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    def respond(self, path: str) -> tuple[int, str, bytes]:
        path = path.split("?", 1)[0]
        if path == "/metrics":
            return 200, CONTENT_TYPE, generate_latest(self.registry)
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            if self.daemon.ready():
                return 200, "text/plain", b"registered with the kubelet\n"
            waiting = [r for r, ok in self.daemon.lifecycle.registered.items() if not ok]
            return 503, "text/plain", ("not registered yet: " + ", ".join(waiting) + "\n").encode()
        return 404, "text/plain", b"not found: try /metrics, /healthz or /readyz\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            line = request.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(line) < 2 or line[0] not in {"GET", "HEAD"}:
                status, ctype, body = 405, "text/plain", b"only GET is supported\n"
            else:
                status, ctype, body = self.respond(line[1])
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed",
                      503: "Service Unavailable"}[status]
            head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
            writer.write(head + (b"" if line and line[0] == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
