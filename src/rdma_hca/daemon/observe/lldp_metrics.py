"""The LLDP families of ``/metrics`` (fabric.lldp): each port's neighbour as an info
series, the age of its last frame, what the wire sent, read and dropped, and the writes of
the Node's fabric label."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from rdma_hca.daemon.observe.status import LldpStatus


def lldp_families(lldp: LldpStatus) -> Iterator[Metric]:
    listening = GaugeMetricFamily(
        "rdma_hca_lldp_listening",
        "1 while the daemon listens for LLDP; 0 when it may not (no CAP_NET_RAW)")
    listening.add_metric([], 1.0 if lldp.listening else 0.0)
    yield listening
    info = GaugeMetricFamily(
        "rdma_hca_lldp_neighbor_info",
        "1 for each HCA port with an LLDP neighbour: the switch (system name, else chassis "
        "ID), its port, its chassis ID, and the netdev the frames came in on",
        labels=["hca", "port", "netdev", "switch", "switch_port", "chassis_id"])
    for n in lldp.neighbours:
        info.add_metric([n.hca, str(n.port), n.netdev, n.switch, n.switch_port,
                         n.chassis_id], 1.0)
    yield info
    age = GaugeMetricFamily(
        "rdma_hca_lldp_last_frame_age_seconds",
        "Seconds since the port's last LLDP frame (ports that had one)",
        labels=["hca", "port"])
    for (hca, port), seconds in sorted(lldp.last_frame_age.items()):
        age.add_metric([hca, str(port)], seconds)
    yield age
    frames = CounterMetricFamily(
        "rdma_hca_lldp_frames_received", "LLDP frames read, by netdev (dropped ones too)",
        labels=["hca", "port", "netdev"])
    for netdev, count in sorted(lldp.frames.items()):
        hca, port = lldp.ports.get(netdev, ("", 0))
        frames.add_metric([hca, str(port), netdev], count)
    yield frames
    dropped = CounterMetricFamily(
        "rdma_hca_lldp_frames_dropped",
        "LLDP frames dropped, by reason: rate (beyond the per-port limit, not parsed), "
        "oversized, truncated, not-lldp, missing-tlv, malformed", labels=["reason"])
    for reason, count in sorted(lldp.dropped.items()):
        dropped.add_metric([reason], count)
    yield dropped
    holds = CounterMetricFamily(
        "rdma_hca_lldp_neighbor_holds",
        "Times a port's LLDP neighbour kept changing and was held at its last one")
    holds.add_metric([], lldp.holds)
    yield holds
    if lldp.node_writes is not None:
        writes = CounterMetricFamily(
            "rdma_hca_fabric_node_writes",
            "Patches of the Node's fabric block label and neighbours annotation")
        writes.add_metric([], lldp.node_writes)
        yield writes
        errors = CounterMetricFamily(
            "rdma_hca_fabric_node_write_errors",
            "Passes of the Node writer the API server failed (each retried with backoff)")
        errors.add_metric([], lldp.node_write_errors)
        yield errors
