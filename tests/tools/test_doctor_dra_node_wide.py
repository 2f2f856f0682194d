"""``rdma-hca doctor`` cluster view and the node-wide device (``all-hcas``, ``kind: node``):
not an HCA, reported on its own with its hcaCount, failed only when it carries its taint.
The slices are the driver's own (``DeviceOffer.build`` over a simulated node), served over
real HTTP by the fake API server."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.contract.dra import NODE_DEVICE
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.devkit.kube.apiserver import serve, write_kubeconfig
from rdma_hca.devkit.kube.cluster import FakeCluster
from rdma_hca.devkit.kube.objects import (
    CREATED,
    daemonset,
    dra_device,
    node,
    pod,
    resource_slice,
)
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import Mode
from rdma_hca.tools.doctor import main, slices
from rdma_hca.tools.doctor.draobjects import parse_device

NOW = dt.datetime.fromisoformat(CREATED.replace("Z", "+00:00")) + dt.timedelta(hours=17)
DRIVER = "rdma-hca.io"
NODE_WIDE = "the node-wide device (rdma/hca through DRA)"


@pytest.fixture
def sim(tmp_path: Path) -> SimNode:
    return gpu_node(tmp_path / "sim", hcas=2, bond=False, gid_table_size=8)


def published(sim: SimNode, mode: Mode = Mode.SHARED) -> list[dict[str, Any]]:
    """The devices the driver publishes for the simulated node as it is now."""
    inventory = discover_node(sim.sysfs_root, sim.dev_root)
    return list(DeviceOffer.build(inventory.hcas, DRIVER, mode, True, inventory.rdma_cm).devices)


def doctor(devices: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str],
           *extra: str) -> tuple[int, str]:
    cluster = FakeCluster(
        nodes=[node("e01-cn-a")],
        daemonsets={("kube-system", "ack-rdma-dp-ds"): daemonset(desired=1, ready=1)},
        pods=[pod("ack-rdma-dp-ds-7x2kq", "e01-cn-a")],
        resource_slices=[resource_slice("e01-cn-a", devices, generation=2)],
    )
    with serve(cluster) as url:
        config = write_kubeconfig(tmp_path / "kubeconfig", url)
        status = main(["--kubeconfig", str(config), *extra], env={},
                      home=tmp_path / "home", now=NOW)
    return status, capsys.readouterr().out


def dra_table(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[1:2] == ["RESOURCESLICES"])
    return [line.split("   ") for line in lines[start:start + 2]]


def cells(row: list[str]) -> list[str]:
    return [c.strip() for c in row if c.strip()]


def test_the_driver_publishes_what_the_doctor_looks_for(sim: SimNode) -> None:
    wide = [d for d in published(sim) if slices.is_node_wide(parse_device(d), DRIVER)]
    assert [d["name"] for d in wide] == [NODE_DEVICE]


def test_a_healthy_shared_node_counts_its_hcas_and_names_the_node_wide_device(
        sim: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = doctor(published(sim), tmp_path, capsys)
    assert status == 0, out
    header, row = dra_table(out)
    assert cells(header) == ["NODE", "RESOURCESLICES", "POOL", "GENERATION", "DEVICES",
                             "TAINTED", "LINK DOWN", "NODE-WIDE", "OK"]
    assert cells(row) == ["e01-cn-a", "1", "e01-cn-a", "2", "2", "0", "0", "2 HCAs", "✓"]
    assert ("✓ node e01-cn-a: ResourceSlice: e01-cn-a-rdma-hca.io-x7k2p: pool e01-cn-a "
            f"generation 2, 2 device(s), none tainted or down, and {NODE_WIDE} all-hcas "
            "(hcaCount 2)") in out


def test_one_port_down_taints_that_hca_only(
        sim: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sim.set_port("mlx5_1", up=False)
    status, out = doctor(published(sim), tmp_path, capsys)
    assert status == 1
    _, row = dra_table(out)
    assert cells(row) == ["e01-cn-a", "1", "e01-cn-a", "2", "2", "1", "1", "2 HCAs", "✗"]
    assert ("✗ node e01-cn-a: DRA devices: 1 of 2 down: mlx5-1 (mlx5_1) tainted "
            "rdma-hca.io/link-down and linkState down (no new claim is placed on a tainted "
            f"device); {NODE_WIDE} is not tainted: pods asking for rdma/hca are still placed "
            "here") in out
    assert "DRA node-wide device" not in out


def test_every_port_down_taints_the_node_wide_device_too(
        sim: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sim.set_port("mlx5_0", up=False)
    sim.set_port("mlx5_1", up=False)
    status, out = doctor(published(sim), tmp_path, capsys)
    assert status == 1
    _, row = dra_table(out)
    assert cells(row) == ["e01-cn-a", "1", "e01-cn-a", "2", "2", "2", "2", "2 HCAs, tainted",
                          "✗"]
    assert "DRA devices: 2 of 2 down:" in out and "is not tainted" not in out
    assert (f"✗ node e01-cn-a: DRA node-wide device: {NODE_WIDE} all-hcas (hcaCount 2) is "
            "tainted rdma-hca.io/link-down: no HCA of the node is up, so no pod asking for "
            "rdma/hca through DRA is placed here") in out
    assert "how to fix: bring an HCA port up on the node: kubectl -n kube-system exec " \
           "ack-rdma-dp-ds-7x2kq -- rdma-hca doctor --node" in out


def test_json_carries_the_node_wide_device(
        sim: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = doctor(published(sim), tmp_path, capsys, "--json")
    assert status == 0
    row = json.loads(out)["dra"]["nodes"][0]
    assert (row["devices"], row["tainted"], row["linkDown"]) == (2, 0, 0)
    assert row["nodeDevice"] == {"name": "all-hcas", "hcaCount": 2, "linkState": "up",
                                 "taints": [], "tainted": False}


def test_exclusive_mode_has_no_node_wide_device_and_no_column(
        sim: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = doctor(published(sim, Mode.EXCLUSIVE), tmp_path, capsys)
    assert status == 0, out
    header, row = dra_table(out)
    assert "NODE-WIDE" not in cells(header)
    assert cells(row)[4] == "2"
    assert NODE_WIDE not in out


def test_a_device_without_kind_is_an_hca_whatever_its_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # An older driver: no kind attribute, so even a device named all-hcas is an HCA.
    old = dra_device("all_hcas")
    old["name"] = "all-hcas"
    status, out = doctor([dra_device("mlx5_0"), old], tmp_path, capsys)
    assert status == 0, out
    header, row = dra_table(out)
    assert "NODE-WIDE" not in cells(header) and cells(row)[4] == "2"
    assert "2 device(s), none tainted or down" in out and NODE_WIDE not in out
