"""The LLDP families of /metrics: the neighbour info series, the frame age, the counters;
named as promtool wants them."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from test_serve_process import metric_samples

from rdma_hca.contract.fabric import PortNeighbour
from rdma_hca.daemon.observe.metrics import render
from rdma_hca.daemon.observe.status import LldpStatus, Status

LLDP = LldpStatus(
    listening=True,
    neighbours=(PortNeighbour("mlx5_0", 1, "eth0", "0c:42:a1:00:00:01", "Ethernet1",
                              "leaf-1", "to gpu-1"),
                PortNeighbour("mlx5_1", 1, "eth1", "0c:42:a1:00:00:02", "Ethernet2")),
    last_frame_age={("mlx5_0", 1): 12.5, ("mlx5_1", 1): 3.0, ("mlx5_2", 1): 400.0},
    ports={"eth0": ("mlx5_0", 1), "eth1": ("mlx5_1", 1), "eth2": ("mlx5_2", 1)},
    frames={"eth0": 7, "eth1": 3, "eth2": 900},
    dropped={"rate": 880, "malformed": 4, "truncated": 0},
    holds=2)


def test_each_neighbour_is_an_info_series_with_its_frame_age() -> None:
    s = metric_samples(render(Status(version="1", lldp=LLDP)).decode())
    assert s["rdma_hca_lldp_listening"] == [({}, 1.0)]
    assert s["rdma_hca_lldp_neighbor_info"] == [
        ({"hca": "mlx5_0", "port": "1", "netdev": "eth0", "switch": "leaf-1",
          "switch_port": "Ethernet1", "chassis_id": "0c:42:a1:00:00:01"}, 1.0),
        # No system name: the switch is its chassis ID.
        ({"hca": "mlx5_1", "port": "1", "netdev": "eth1", "switch": "0c:42:a1:00:00:02",
          "switch_port": "Ethernet2", "chassis_id": "0c:42:a1:00:00:02"}, 1.0)]
    assert ({"hca": "mlx5_2", "port": "1"}, 400.0) in s["rdma_hca_lldp_last_frame_age_seconds"]
    assert ({"hca": "mlx5_2", "port": "1", "netdev": "eth2"}, 900.0) in s[
        "rdma_hca_lldp_frames_received_total"]
    assert ({"reason": "rate"}, 880.0) in s["rdma_hca_lldp_frames_dropped_total"]
    assert s["rdma_hca_lldp_neighbor_holds_total"] == [({}, 2.0)]


def test_without_the_capability_the_gauge_says_so_and_without_lldp_nothing_shows() -> None:
    off = metric_samples(render(Status(version="1", lldp=LldpStatus(listening=False))).decode())
    assert off["rdma_hca_lldp_listening"] == [({}, 0.0)]
    assert "rdma_hca_lldp_neighbor_info" not in off or not off["rdma_hca_lldp_neighbor_info"]
    none = render(Status(version="1")).decode()
    assert "rdma_hca_lldp" not in none


def test_promtool_finds_nothing_to_lint() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: it comes with Debian's prometheus package")
    text = render(Status(version="1", lldp=LLDP)).decode()
    result = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                            capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
