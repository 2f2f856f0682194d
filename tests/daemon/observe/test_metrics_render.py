"""The exposition rendered from one status record: names, labels and values."""

from __future__ import annotations

from dataclasses import replace

from test_serve_process import metric_samples

from rdma_hca.daemon.observe.metrics import render
from rdma_hca.daemon.observe.status import DraStatus, PoolStatus, Status
from rdma_hca.kit.histogram import Histogram
from rdma_hca.node.model import CharDevice, Hca, LinkLayer, Port


def hca(name: str, state: str, phys: str) -> Hca:
    port = Port(number=1, state=state, phys_state=phys, link_layer=LinkLayer.ETHERNET,
                rate="400 Gb/sec (4X NDR)", rate_gbps=400.0, netdevs=("eth0",), gids=())
    return Hca(name=name, driver="mlx5_core", node_guid=None, fw_ver=None, board_id=None,
               hca_type=None, pci_address=None, pci_vendor=None, pci_device=None,
               numa_node=None, ports=(port,),
               uverbs=CharDevice("uverbs0", "/dev/infiniband/uverbs0", True))


STATUS = Status(
    version="9.9.9",
    hcas=(hca("mlx5_0", "ACTIVE", "LinkUp"), hca("mlx5_1", "UNKNOWN", "UNKNOWN")),
    pools=(PoolStatus("rdma/hca", 1000, 0, 2, ("mlx5_7",), True, 3),),
    counters={("mlx5_0", 1): {"port_rcv_data": 10, "link_downed": 2}},
    state_changes={("mlx5_1", 1): 4},
    sysfs_stalls=2,
    discovery_errors={"memory": 1},
    health_last_pass=1234.5,
)


def test_every_contract_name_with_its_labels_and_values() -> None:
    s = metric_samples(render(STATUS, http_rejected=5).decode())
    assert s["rdma_hca_build_info"] == [({"version": "9.9.9"}, 1.0)]
    assert ({"hca": "mlx5_1", "port": "1", "state": "UNKNOWN"}, 1.0) in s["rdma_hca_port_state"]
    assert ({"hca": "mlx5_1", "port": "1", "state": "DOWN"}, 0.0) in s["rdma_hca_port_state"]
    assert ({"hca": "mlx5_0", "port": "1"}, 50e9) in s["rdma_hca_port_rate_bytes_per_second"]
    assert s["rdma_hca_port_receive_bytes_total"] == [({"hca": "mlx5_0", "port": "1"}, 40.0)]
    assert s["rdma_hca_port_link_downed_total"] == [({"hca": "mlx5_0", "port": "1"}, 2.0)]
    assert ({"hca": "mlx5_1", "port": "1"}, 4.0) in s["rdma_hca_port_state_changes_total"]
    assert s["rdma_hca_pool_hcas"] == [({"resource": "rdma/hca"}, 2.0)]
    assert s["rdma_hca_hca_missing"] == [({"resource": "rdma/hca", "hca": "mlx5_7"}, 1.0)]
    assert s["rdma_hca_registrations_total"] == [({"resource": "rdma/hca"}, 3.0)]
    assert s["rdma_hca_sysfs_stalls_total"] == [({}, 2.0)]
    assert ({"reason": "memory"}, 1.0) in s["rdma_hca_discovery_errors_total"]
    assert ({"reason": "fd"}, 0.0) in s["rdma_hca_discovery_errors_total"]
    assert s["rdma_hca_http_connections_rejected_total"] == [({}, 5.0)]
    assert s["rdma_hca_health_last_pass_timestamp_seconds"] == [({}, 1234.5)]
    assert s["process_resident_memory_bytes"][0][1] > 0
    assert "rdma_hca_port_rate_gbps" not in s


def test_no_pass_yet_means_no_timestamp_sample() -> None:
    s = metric_samples(render(replace(STATUS, health_last_pass=None)).decode())
    assert not s.get("rdma_hca_health_last_pass_timestamp_seconds")


def test_alerting_series_exist_at_zero_for_every_known_label_set() -> None:
    status = replace(STATUS, pools=(
        PoolStatus("rdma/hca", 1000, 1000, 2, (), True, 1, selected=("mlx5_0", "mlx5_1")),
        PoolStatus("rdma/ib", 10, 0, 0, ("mlx5_9",), False, 0),
    ), allocations={("rdma/hca", True): 4})
    s = metric_samples(render(status).decode())
    assert sorted((lab["resource"], lab["result"], v)
                  for lab, v in s["rdma_hca_allocations_total"]) == [
        ("rdma/hca", "error", 0.0), ("rdma/hca", "ok", 4.0),
        ("rdma/ib", "error", 0.0), ("rdma/ib", "ok", 0.0)]
    assert sorted((lab["resource"], lab["hca"], v) for lab, v in s["rdma_hca_hca_missing"]) == [
        ("rdma/hca", "mlx5_0", 0.0), ("rdma/hca", "mlx5_1", 0.0), ("rdma/ib", "mlx5_9", 1.0)]


def test_the_info_series_carries_what_joins_an_hca_to_other_series() -> None:
    first = replace(STATUS.hcas[0], pci_address="0000:3b:00.0", pci_bus_id="0000:3b:00.0",
                    pcie_root="pci0000:3a", numa_node=1, fw_ver="28.39.1002",
                    board_id="MT_0000000838", node_guid="b859:9f03:00d4:3c22")
    s = metric_samples(render(replace(STATUS, hcas=(first, STATUS.hcas[1]))).decode())
    info = {lab["hca"]: lab for lab, v in s["rdma_hca_hca_info"] if v == 1.0}
    assert info["mlx5_0"] == {
        "hca": "mlx5_0", "port": "1", "netdev": "eth0", "link_layer": "Ethernet",
        "driver": "mlx5_core", "pci_address": "0000:3b:00.0", "numa_node": "1",
        "pcie_root": "pci0000:3a", "firmware_version": "28.39.1002",
        "board_id": "MT_0000000838", "node_guid": "b859:9f03:00d4:3c22"}
    assert info["mlx5_1"]["numa_node"] == "" and info["mlx5_1"]["pci_address"] == ""


def test_each_gpu_has_an_info_series_in_dcgms_bus_id_form() -> None:
    from rdma_hca.node.model import Gpu

    gpus = (Gpu("0000:3b:00.0", "0x2330", 0, "pci0000:3a"), Gpu("0000:c1:00.0", None, None, None))
    s = metric_samples(render(replace(STATUS, gpus=gpus)).decode())
    assert sorted(s["rdma_hca_gpu_info"], key=lambda x: x[0]["pci_address"]) == [
        ({"pci_bus_id": "00000000:3B:00.0", "pci_address": "0000:3b:00.0",
          "pcie_root": "pci0000:3a", "numa_node": "0", "device": "0x2330"}, 1.0),
        ({"pci_bus_id": "00000000:C1:00.0", "pci_address": "0000:c1:00.0", "pcie_root": "",
          "numa_node": "", "device": ""}, 1.0)]


def test_dra_claim_outcomes_and_prepare_times_come_from_the_snapshot() -> None:
    assert "rdma_hca_dra_prepare_total" not in render(STATUS).decode()  # DRA off
    h = Histogram((0.01, 0.1))
    for seconds in (0.002, 0.05, 3.0):
        h.observe(seconds)
    dra = DraStatus(True, 1, 0, None, prepares={"error": 2}, prepare_seconds=h.counts())
    s = metric_samples(render(replace(STATUS, dra=dra)).decode())
    # Both results at 0 until they happen: increase() sees the first error.
    assert s["rdma_hca_dra_prepare_total"] == [
        ({"result": "ok"}, 0.0), ({"result": "error"}, 2.0)]
    assert s["rdma_hca_dra_unprepare_total"] == [
        ({"result": "ok"}, 0.0), ({"result": "error"}, 0.0)]
    assert s["rdma_hca_dra_prepare_seconds_bucket"] == [
        ({"le": "0.01"}, 1.0), ({"le": "0.1"}, 2.0), ({"le": "+Inf"}, 3.0)]
    assert s["rdma_hca_dra_prepare_seconds_count"] == [({}, 3.0)]
    assert s["rdma_hca_dra_prepare_seconds_sum"][0][1] == 3.052


def test_the_api_clients_counts_come_from_the_snapshot() -> None:
    dra = DraStatus(True, 1, 0, None,
                    api_requests={("resourceclaims", "get", "200"): 3,
                                  ("resourceslices", "update", "<error>"): 1},
                    api_wait_seconds={"claims": 0.0, "driver": 1.5})
    s = metric_samples(render(replace(STATUS, dra=dra)).decode())
    assert s["rdma_hca_api_requests_total"] == [
        ({"resource": "resourceclaims", "verb": "get", "code": "200"}, 3.0),
        ({"resource": "resourceslices", "verb": "update", "code": "<error>"}, 1.0)]
    assert s["rdma_hca_api_rate_limit_wait_seconds_total"] == [
        ({"budget": "claims"}, 0.0), ({"budget": "driver"}, 1.5)]


def test_the_claim_status_writers_counts_come_from_the_snapshot() -> None:
    assert "rdma_hca_dra_claim_status" not in render(STATUS).decode()  # DRA off
    s = metric_samples(render(replace(STATUS, dra=DraStatus(True, 1, 0, None))).decode())
    # At 0 from the start: the first refusal is an increase, not a new series.
    assert s["rdma_hca_dra_claim_status_refused_total"] == [({}, 0.0)]
    assert s["rdma_hca_dra_claim_status_dropped_total"] == [({}, 0.0)]
    assert s["rdma_hca_dra_claim_status_pending"] == [({}, 0.0)]
    assert s["rdma_hca_dra_admin_access_prepared"] == [({}, 0.0)]
    dra = DraStatus(True, 1, 0, None, status_refused=3, status_dropped=2, status_pending=7,
                    admin_access_claims=2)
    s = metric_samples(render(replace(STATUS, dra=dra)).decode())
    assert s["rdma_hca_dra_admin_access_prepared"] == [({}, 2.0)]
    assert s["rdma_hca_dra_claim_status_refused_total"] == [({}, 3.0)]
    assert s["rdma_hca_dra_claim_status_dropped_total"] == [({}, 2.0)]
    assert s["rdma_hca_dra_claim_status_pending"] == [({}, 7.0)]


def test_attributes_left_out_of_a_device_are_counted_from_the_snapshot() -> None:
    s = metric_samples(render(replace(STATUS, dra=DraStatus(True, 1, 0, None))).decode())
    assert s["rdma_hca_dra_attributes_dropped_total"] == [({}, 0.0)]  # there from the start
    dra = DraStatus(True, 1, 0, None, attributes_dropped=4)
    s = metric_samples(render(replace(STATUS, dra=dra)).decode())
    assert s["rdma_hca_dra_attributes_dropped_total"] == [({}, 4.0)]


def test_allocate_latency_is_written_as_the_client_histogram_writes_it() -> None:
    """The Allocate histogram is kept as plain counts; its text is what a prometheus_client
    Histogram labelled by resource writes for the same observations, _created included."""
    from prometheus_client import CollectorRegistry
    from prometheus_client import Histogram as ClientHistogram
    from prometheus_client.exposition import generate_latest

    from rdma_hca.daemon.deviceplugin.allocations import BUCKETS, AllocationStats

    stats = AllocationStats(["rdma/hca", "rdma/idle"])
    client = ClientHistogram("rdma_hca_allocate_duration_seconds", "Time to answer Allocate",
                             ["resource"], registry=None, buckets=BUCKETS)
    client.labels("rdma/hca")
    client.labels("rdma/idle")
    for resource, seconds in (("rdma/hca", 0.0003), ("rdma/hca", 0.0001), ("rdma/hca", 2.0),
                              ("rdma/late", 0.01)):
        stats.observe(resource, seconds, True)
        client.labels(resource).observe(seconds)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(client)
    want = generate_latest(registry).decode()
    got = render(replace(STATUS, allocate_seconds=stats.latency(),
                         allocate_created=stats.created)).decode()
    start = got.index("# HELP rdma_hca_allocate_duration_seconds ")
    ours = got[start:]

    def created_dropped(text: str) -> list[str]:
        # The creation times are each side's own clock readings.
        return [line.rpartition(" ")[0] if "_created{" in line else line
                for line in text.splitlines()]

    assert created_dropped(ours) == created_dropped(want)
    assert 'rdma_hca_allocate_duration_seconds_count{resource="rdma/late"} 1.0' in ours
    # With no pool (the DRA driver alone), the family is there without series, as before.
    empty = ClientHistogram("rdma_hca_allocate_duration_seconds", "Time to answer Allocate",
                            ["resource"], registry=None, buckets=BUCKETS)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(empty)
    alone = render(STATUS).decode()
    assert alone.endswith(generate_latest(registry).decode())
