"""``rdma-hca doctor`` cluster view and DeviceClasses that trap users: a class written as
every DRA guide shows (``device.driver == "rdma-hca.io"``) also matches the node-wide
device ``all-hcas``. The slices are the driver's own (``DeviceOffer.build`` over a simulated
node), served with the classes over real HTTP by the fake API server; what the doctor
says of a class is checked against a CEL engine."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel

from rdma_hca.contract.dra import NODE_DEVICE, hca_selector
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.devkit.kube.apiserver import serve, write_kubeconfig
from rdma_hca.devkit.kube.cluster import FakeCluster
from rdma_hca.devkit.kube.objects import (
    CREATED,
    daemonset,
    device_class,
    node,
    pod,
    resource_slice,
)
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import Mode
from rdma_hca.tools.doctor import main

NOW = dt.datetime.fromisoformat(CREATED.replace("Z", "+00:00")) + dt.timedelta(hours=17)
DRIVER = "rdma-hca.io"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
TITLE = f"DeviceClasses of {DRIVER}"
GUIDE = f'device.driver == "{DRIVER}"'
BY_NAME = f'{GUIDE} && device.attributes["{DRIVER}"].netdev == "eth0"'
# The chart's two classes (deploy/helm/.../dra-deviceclass.yaml), as rendered in shared mode.
ATTRS = f'device.attributes["{DRIVER}"]'
IS_NODE = f'("kind" in {ATTRS} && {ATTRS}.kind == "node")'
CHART_HCA = f"{GUIDE} && !{IS_NODE}"
CHART_EXTENDED = f"{GUIDE} && {IS_NODE}"


@pytest.fixture
def sim(tmp_path: Path) -> SimNode:
    return gpu_node(tmp_path / "sim", hcas=2, bond=False, gid_table_size=8)


def published(sim: SimNode, mode: Mode = Mode.SHARED) -> list[dict[str, Any]]:
    inventory = discover_node(sim.sysfs_root, sim.dev_root)
    return list(DeviceOffer.build(inventory.hcas, DRIVER, mode, True, inventory.rdma_cm).devices)


def fake_cluster(devices: list[dict[str, Any]], classes: dict[str, str]) -> FakeCluster:
    return FakeCluster(
        nodes=[node("e01-cn-a")],
        daemonsets={("kube-system", "ack-rdma-dp-ds"): daemonset(desired=1, ready=1)},
        pods=[pod("ack-rdma-dp-ds-7x2kq", "e01-cn-a")],
        resource_slices=[resource_slice("e01-cn-a", devices, generation=2)],
        device_classes=[device_class(name, cel) for name, cel in classes.items()],
    )


def doctor(cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str],
           *extra: str) -> tuple[int, str]:
    with serve(cluster) as url:
        config = write_kubeconfig(tmp_path / "kubeconfig", url)
        status = main(["--kubeconfig", str(config), *extra], env={},
                      home=tmp_path / "home", now=NOW)
    return status, capsys.readouterr().out


def test_a_class_selecting_only_the_driver_fails_and_says_why_and_how_to_fix(
        sim: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = fake_cluster(published(sim), {
        "rdma": GUIDE, "rdma-by-name": BY_NAME, DRIVER: CHART_HCA,
        f"{DRIVER}-extended": CHART_EXTENDED, "gpu.example.com": 'device.driver == "gpu"'})
    status, out = doctor(cluster, tmp_path, capsys)
    assert status == 1, out
    (line,) = [x for x in out.splitlines() if TITLE in x]
    # Only the class naming an HCA-only attribute fails allocation outright.
    assert line == (
        f"✗ {TITLE}: 2 select {DRIVER} without selecting the kind of device: rdma, "
        "rdma-by-name (its selector names netdev, which all-hcas lacks: allocation fails "
        'for every claim of it with "CEL runtime error: no such key: netdev"). They also '
        f"match the node-wide device {NODE_DEVICE} (every HCA of a node), so a claim for "
        '"an HCA" may get the whole node')
    assert (f'how to fix: add device.attributes["{DRIVER}"].kind == "hca" to the class\'s '
            "selector") in out
    # Nothing else fails: the slices themselves are fine.
    assert out.endswith("✗ 1 of 6 checks failed\n")
    assert [r.path for r in cluster.requests].count(CLASSES) == 1


def test_the_trap_in_json(sim: SimNode, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    status, out = doctor(fake_cluster(published(sim), {"rdma": GUIDE}), tmp_path, capsys,
                         "--json")
    assert status == 1
    (check,) = [c for c in json.loads(out)["checks"] if c["name"] == TITLE]
    assert (check["subject"], check["ok"]) == ("cluster", False)
    assert check["detail"].startswith(f"1 select {DRIVER} without selecting the kind of "
                                      "device: rdma. They")
    assert hca_selector(DRIVER) in check["fix"] and "kubectl edit deviceclass rdma" in check["fix"]


def test_the_charts_classes_pass(sim: SimNode, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    cluster = fake_cluster(published(sim), {DRIVER: CHART_HCA,
                                            f"{DRIVER}-extended": CHART_EXTENDED,
                                            "fixed": f"{GUIDE} && {hca_selector(DRIVER)}"})
    status, out = doctor(cluster, tmp_path, capsys)
    assert status == 0, out
    assert TITLE not in out
    assert [r.path for r in cluster.requests].count(CLASSES) == 1


def test_without_a_node_wide_device_no_class_traps_and_none_is_read(
        sim: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Exclusive mode: HCAs only, so the guide's class matches exactly what it means.
    cluster = fake_cluster(published(sim, Mode.EXCLUSIVE), {"rdma": GUIDE})
    status, out = doctor(cluster, tmp_path, capsys)
    assert status == 0, out
    assert TITLE not in out
    assert not any(r.path == CLASSES for r in cluster.requests)


def test_classes_that_may_not_be_listed_leave_the_rest_standing(
        sim: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = fake_cluster(published(sim), {"rdma": GUIDE})
    cluster.forbidden.add("deviceclasses")
    status, out = doctor(cluster, tmp_path, capsys)
    assert status == 0, out
    assert TITLE not in out and "all-hcas" in out


# --- what the doctor says of a class holds under a CEL engine ------------------------------


def _cel_device(device: dict[str, Any]) -> Any:
    """A published device as DRA CEL sees it: attributes grouped by domain."""
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in device["attributes"].items():
        domain, _, name = key.rpartition("/")
        grouped.setdefault(domain or DRIVER, {})[name] = next(iter(value.values()))
    return json_to_cel({"driver": DRIVER, "attributes": grouped})


def _matches(expression: str, device: dict[str, Any]) -> bool:
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate({"device": _cel_device(device)})
    if isinstance(result, celpy.CELEvalError):
        raise result
    return bool(result)


def test_the_trap_and_its_fix_under_cel(sim: SimNode) -> None:
    devices = {d["name"]: d for d in published(sim)}
    wide, hca = devices.pop(NODE_DEVICE), devices["mlx5-0"]
    assert _matches(GUIDE, wide) and _matches(GUIDE, hca)  # the trap
    fixed = f"{GUIDE} && {hca_selector(DRIVER)}"  # the fix the doctor prints
    assert not _matches(fixed, wide) and _matches(fixed, hca)
    assert _matches(CHART_HCA, hca) and not _matches(CHART_HCA, wide)
    with pytest.raises(celpy.CELEvalError, match="netdev"):
        _matches(BY_NAME, wide)  # "no such key" on the node-wide device
    assert not _matches(f"{fixed} && " + BY_NAME.split(" && ")[1], wide)
