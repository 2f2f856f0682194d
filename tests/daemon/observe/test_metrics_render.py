"""The exposition rendered from one status record: names, labels and values."""

from __future__ import annotations

from dataclasses import replace

from test_serve_process import metric_samples

from rdma_hca.daemon.observe.metrics import render
from rdma_hca.daemon.observe.status import PoolStatus, Status
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
