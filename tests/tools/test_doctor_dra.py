"""``rdma-hca doctor`` cluster view: the DRA driver's ResourceSlices against the nodes, over
real HTTP to the fake API server."""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.devkit.kube.apiserver import serve, write_kubeconfig
from rdma_hca.devkit.kube.cluster import TOKEN, FakeCluster
from rdma_hca.devkit.kube.objects import (
    CREATED,
    daemonset,
    device_class,
    dra_device,
    node,
    pod,
    resource_slice,
)
from rdma_hca.tools.doctor import main
from rdma_hca.tools.doctor.draobjects import parse_device_class
from rdma_hca.tools.doctor.slices import selects_driver

NOW = dt.datetime.fromisoformat(CREATED.replace("Z", "+00:00")) + dt.timedelta(hours=17)
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
EXEC_B = "kubectl -n kube-system exec ack-rdma-dp-ds-9fzlm -- rdma-hca doctor --node"


@pytest.fixture
def cluster() -> FakeCluster:
    """Two RDMA nodes, both pods ready, each publishing its slice of four HCAs."""
    return FakeCluster(
        nodes=[node("e01-cn-a"), node("e01-cn-b")],
        daemonsets={("kube-system", "ack-rdma-dp-ds"): daemonset(desired=2, ready=2)},
        pods=[pod("ack-rdma-dp-ds-7x2kq", "e01-cn-a"), pod("ack-rdma-dp-ds-9fzlm", "e01-cn-b")],
        resource_slices=[resource_slice("e01-cn-a", generation=3),
                         resource_slice("e01-cn-b")],
    )


@pytest.fixture
def url(cluster: FakeCluster) -> Iterator[str]:
    with serve(cluster) as served:
        yield served


@pytest.fixture
def kubeconfig(url: str, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", url)


def doctor(kubeconfig: Path, tmp_path: Path, *extra: str) -> int:
    # An empty environment and home keep the developer's own kubeconfig out of the test.
    return main(["--kubeconfig", str(kubeconfig), *extra], env={}, home=tmp_path / "home",
                now=NOW)


def run_json(kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
             *extra: str) -> tuple[int, dict[str, Any]]:
    status = doctor(kubeconfig, tmp_path, "--json", *extra)
    return status, json.loads(capsys.readouterr().out)


def slice_requests(cluster: FakeCluster) -> list[list[str]]:
    return [r.query.get("fieldSelector", []) for r in cluster.requests if r.path == SLICES]


def test_matching_slices_pass_and_are_listed_per_node(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = doctor(kubeconfig, tmp_path)
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    header = lines.index("NODE       RESOURCESLICES   POOL       GENERATION   DEVICES   TAINTED"
                         "   LINK DOWN   OK")
    assert lines[header + 1] == ("e01-cn-a   1                e01-cn-a   3            4"
                                 "         0         0           ✓")
    assert lines[header + 2].startswith("e01-cn-b   1                e01-cn-b   1   ")
    assert ("✓ node e01-cn-a: ResourceSlice: e01-cn-a-rdma-hca.io-x7k2p: pool e01-cn-a "
            "generation 3, 4 device(s), none tainted or down") in out
    assert "✓ ResourceSlices of rdma-hca.io: 2 slice(s) on 2 node(s), none stale" in out
    assert "all 8 checks passed" in out
    # One list for all nodes, selected by driver as the real API allows; with slices found
    # there is no need to look at DeviceClasses.
    assert slice_requests(cluster) == [["spec.driver=rdma-hca.io"]]
    assert not any(r.path == CLASSES for r in cluster.requests)


def test_node_with_ready_pod_but_no_slice_fails(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.resource_slices is not None
    del cluster.resource_slices[1]
    assert doctor(kubeconfig, tmp_path) == 1
    out = capsys.readouterr().out
    assert ("✗ node e01-cn-b: ResourceSlice: none of driver rdma-hca.io although DRA is in use "
            "and the plugin pod is ready") in out
    assert "kubectl -n kube-system logs ack-rdma-dp-ds-9fzlm" in out
    assert "e01-cn-b   0                <none>     <none>       0" in out
    assert "✓ node e01-cn-a: ResourceSlice" in out
    assert "1 of 8 checks failed" in out


def test_no_slice_on_a_node_whose_pod_is_not_ready_is_left_to_the_pod_check(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.resource_slices is not None
    del cluster.resource_slices[1]
    cluster.pods[1] = pod("ack-rdma-dp-ds-9fzlm", "e01-cn-b", ready=False,
                          waiting="CrashLoopBackOff")
    assert doctor(kubeconfig, tmp_path) == 1
    out = capsys.readouterr().out
    assert "node e01-cn-b: ResourceSlice" not in out
    assert "ack-rdma-dp-ds-9fzlm not ready (CrashLoopBackOff)" in out


def test_device_class_alone_means_dra_is_in_use(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.resource_slices = []
    cluster.device_classes = [device_class("gpu.example.com", 'device.driver == "gpu.example"'),
                              device_class("rdma-hca.io", 'device.driver == "rdma-hca.io"')]
    status, doc = run_json(kubeconfig, tmp_path, capsys)
    assert status == 1
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert [(c["subject"], c["name"]) for c in failed] == [
        ("e01-cn-a", "ResourceSlice"), ("e01-cn-b", "ResourceSlice")]
    assert doc["dra"]["inUse"] is True
    assert doc["dra"]["inUseBecause"] == "DeviceClass rdma-hca.io"
    assert any(r.path == CLASSES for r in cluster.requests)


def test_no_slice_and_no_device_class_means_dra_not_in_use(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.resource_slices = []
    cluster.device_classes = [device_class("gpu.example.com", 'device.driver == "gpu.example"')]
    assert doctor(kubeconfig, tmp_path) == 0
    out = capsys.readouterr().out
    assert "- DRA is not in use for driver rdma-hca.io" in out
    assert "RESOURCESLICES" not in out
    assert "all 5 checks passed" in out


def test_stale_slice_of_a_deleted_node_fails_with_the_delete_command(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.resource_slices is not None
    cluster.resource_slices.append(resource_slice("e01-cn-gone", name="e01-cn-gone-slice"))
    status, doc = run_json(kubeconfig, tmp_path, capsys)
    assert status == 1
    assert doc["dra"]["staleSlices"] == [{"name": "e01-cn-gone-slice",
                                          "nodeName": "e01-cn-gone"}]
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert len(failed) == 1
    assert failed[0]["subject"] == "cluster"
    assert failed[0]["detail"] == "1 stale: they name node(s) that do not exist (e01-cn-gone)"
    assert failed[0]["fix"].endswith("kubectl delete resourceslice e01-cn-gone-slice")
    # The node that does not exist gets no row of its own.
    assert [n["node"] for n in doc["dra"]["nodes"]] == ["e01-cn-a", "e01-cn-b"]


def test_tainted_device_fails_and_points_at_the_node_doctor(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.resource_slices is not None
    devices = [dra_device("mlx5_0"), dra_device("mlx5_1", down=True), dra_device("mlx5_2"),
               dra_device("mlx5_3", down=True, taint=False)]
    cluster.resource_slices[1] = resource_slice("e01-cn-b", devices, generation=7)
    assert doctor(kubeconfig, tmp_path) == 1
    out = capsys.readouterr().out
    assert ("✗ node e01-cn-b: DRA devices: 2 of 4 down: mlx5-1 (mlx5_1) tainted "
            "rdma-hca.io/link-down and linkState down; mlx5-3 (mlx5_3) linkState down") in out
    assert f"how to fix: check the HCA ports on the node: {EXEC_B}" in out
    assert ("e01-cn-b   1                e01-cn-b   7            4         1         2"
            "           ✗") in out
    assert "✓ node e01-cn-a: ResourceSlice" in out


def test_two_slices_on_one_node_fail_and_name_the_extra_one(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.resource_slices is not None
    cluster.resource_slices.append(resource_slice("e01-cn-a", name="old-pool-slice",
                                                  pool="old-pool", generation=9))
    status, doc = run_json(kubeconfig, tmp_path, capsys)
    assert status == 1
    row = next(n for n in doc["dra"]["nodes"] if n["node"] == "e01-cn-a")
    assert row["slices"] == ["e01-cn-a-rdma-hca.io-x7k2p", "old-pool-slice"]
    assert row["pools"] == ["e01-cn-a", "old-pool"]
    assert row["ok"] is False
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert [c["subject"] for c in failed] == ["e01-cn-a"]
    assert "2 slices" in failed[0]["detail"]
    # The slice in the pool named after the node stays; the other one is the extra.
    assert failed[0]["fix"].endswith("kubectl delete resourceslice old-pool-slice")
    node_a = next(n for n in doc["nodes"] if n["name"] == "e01-cn-a")
    assert node_a["ok"] is False


def _split_pool(node_name: str, sizes: list[int], generation: int = 2,
                count: int | None = None) -> list[dict[str, Any]]:
    out, start = [], 0
    for i, size in enumerate(sizes):
        devices = [dra_device(f"mlx5_{n}") for n in range(start, start + size)]
        start += size
        s = resource_slice(node_name, devices, name=f"{node_name}-rdma-hca.io-{i}-abcde",
                           generation=generation)
        s["spec"]["pool"]["resourceSliceCount"] = count or len(sizes)
        out.append(s)
    return out


def test_a_pool_split_over_several_slices_passes(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.resource_slices = [resource_slice("e01-cn-a"), *_split_pool("e01-cn-b",
                                                                        [64, 64, 64, 8])]
    assert doctor(kubeconfig, tmp_path) == 0
    out = capsys.readouterr().out
    assert ("✓ node e01-cn-b: ResourceSlice: 4 slices: pool e01-cn-b generation 2, 200 "
            "device(s), none tainted or down") in out


def test_an_incomplete_or_overlapping_pool_fails(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.resource_slices = [resource_slice("e01-cn-a"),
                               *_split_pool("e01-cn-b", [64, 64, 8], count=4)]
    assert doctor(kubeconfig, tmp_path) == 1
    assert "pool e01-cn-b is incomplete: 3 of 4 slices at generation 2" in \
        capsys.readouterr().out
    twice = _split_pool("e01-cn-b", [3, 3])
    twice[1]["spec"]["devices"][0] = dra_device("mlx5_0")
    cluster.resource_slices = [resource_slice("e01-cn-a"), *twice]
    assert doctor(kubeconfig, tmp_path) == 1
    assert "device(s) mlx5-0 in more than one slice of pool e01-cn-b" in capsys.readouterr().out


def test_no_dra_api_is_one_line_and_no_failure(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.resource_slices = None  # the API server answers 404 for resource.k8s.io/v1
    assert doctor(kubeconfig, tmp_path) == 0
    out = capsys.readouterr().out
    assert ("- DRA is not available on this cluster (the API server does not serve "
            "resource.k8s.io/v1") in out
    assert "RESOURCESLICES" not in out
    assert "all 5 checks passed" in out
    assert not any(r.path == CLASSES for r in cluster.requests)


def test_no_dra_api_behind_a_proxy_answering_plain_text(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.resource_slices = None
    cluster.plain_404 = True
    assert doctor(kubeconfig, tmp_path) == 0
    assert "- DRA is not available on this cluster" in capsys.readouterr().out


def test_no_dra_api_in_json(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.resource_slices = None
    status, doc = run_json(kubeconfig, tmp_path, capsys)
    assert status == 0
    assert doc["dra"]["available"] is False
    assert doc["dra"]["inUse"] is False
    assert doc["dra"]["nodes"] == []
    assert "not available" in doc["dra"]["note"]


def test_forbidden_slices_name_the_permission_and_do_not_fail(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.forbidden.add("resourceslices")
    status = doctor(kubeconfig, tmp_path)
    captured = capsys.readouterr()
    assert status == 0, captured.out
    assert captured.err == ""
    notes = [line for line in captured.out.splitlines() if "ResourceSlices not checked" in line]
    assert len(notes) == 1
    assert "RBAC denied list resourceslices.resource.k8s.io at cluster scope" in notes[0]
    assert 'cannot list resource "resourceslices"' in notes[0]  # the server's own words
    assert ("kubectl create clusterrole rdma-hca-doctor-dra --verb=list "
            "--resource=resourceslices.resource.k8s.io,deviceclasses.resource.k8s.io") in notes[0]
    assert "all 5 checks passed" in captured.out


def test_forbidden_device_classes_without_slices_is_a_note(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.resource_slices = []
    cluster.forbidden.add("deviceclasses")
    status, doc = run_json(kubeconfig, tmp_path, capsys)
    assert status == 0
    assert doc["dra"]["inUse"] is False
    assert "deviceclasses.resource.k8s.io" in doc["dra"]["note"]


def test_dra_only_node_without_the_extended_resource_passes(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.nodes[1] = node("e01-cn-b", hca=None)
    assert doctor(kubeconfig, tmp_path) == 0
    out = capsys.readouterr().out
    assert ("✓ node e01-cn-b: rdma/hca advertised: not advertised: the node offers its HCAs "
            "through DRA only") in out


def test_node_moved_from_the_device_plugin_to_dra_is_not_unhealthy(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The kubelet keeps the device plugin's count at 0 allocatable; the pod runs DRA alone.
    cluster.nodes[1] = node("e01-cn-b", hca="1k", allocatable="0")
    cluster.pods[1] = pod("ack-rdma-dp-ds-9fzlm", "e01-cn-b",
                          env={"RDMA_HCA_DEVICE_PLUGIN_ENABLED": "false"})
    assert doctor(kubeconfig, tmp_path) == 0
    out = capsys.readouterr().out
    assert ("✓ node e01-cn-b: rdma/hca advertised: capacity 1k at 0 allocatable is left from "
            "the device plugin (the kubelet keeps it); the node now offers its HCAs through "
            "DRA") in out
    assert "/status/capacity/rdma~1hca" in out
    assert "unhealthy" not in out


def test_zero_allocatable_with_the_device_plugin_running_is_still_unhealthy(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.nodes[1] = node("e01-cn-b", hca="1k", allocatable="0")
    cluster.pods[1] = pod("ack-rdma-dp-ds-9fzlm", "e01-cn-b",
                          env={"RDMA_HCA_DEVICE_PLUGIN_ENABLED": "true"})
    assert doctor(kubeconfig, tmp_path) == 1
    out = capsys.readouterr().out
    assert "✗ node e01-cn-b: rdma/hca advertised: allocatable 0 < capacity 1k: some HCA is " \
           "unhealthy" in out


def test_json_carries_the_slice_facts(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.resource_slices is not None
    cluster.resource_slices[1] = resource_slice(
        "e01-cn-b", [dra_device("mlx5_0"), dra_device("mlx5_1", down=True)], generation=2)
    status, doc = run_json(kubeconfig, tmp_path, capsys)
    assert status == 1
    assert doc["dra"]["driver"] == "rdma-hca.io"
    assert doc["dra"]["available"] is True
    assert doc["dra"]["inUse"] is True
    assert doc["dra"]["note"] is None
    assert doc["dra"]["nodes"][1] == {
        "node": "e01-cn-b", "slices": ["e01-cn-b-rdma-hca.io-x7k2p"], "pools": ["e01-cn-b"],
        "generation": 2, "devices": 2, "tainted": 1, "linkDown": 1, "ok": False,
        "nodeDevice": None,
    }


def test_other_driver_name_is_asked_for(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Slices of rdma-hca.io exist, but the doctor asks about another driver: none of those.
    assert doctor(kubeconfig, tmp_path, "--dra-driver", "hca.example.com") == 0
    assert slice_requests(cluster) == [["spec.driver=hca.example.com"]]
    assert "DRA is not in use for driver hca.example.com" in capsys.readouterr().out


def test_bad_driver_name_is_a_usage_error(
    kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert doctor(kubeconfig, tmp_path, "--dra-driver", "Not_A.Name") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--dra-driver 'Not_A.Name' is not a DRA driver name" in err


def _get(url: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{url}{SLICES}?{urllib.parse.urlencode(query)}",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_fake_server_selects_slices_by_field_like_the_real_one(url: str) -> None:
    status, body = _get(url, {"fieldSelector": "spec.nodeName=e01-cn-b,spec.driver=rdma-hca.io"})
    assert status == 200
    assert [s["spec"]["nodeName"] for s in body["items"]] == ["e01-cn-b"]
    status, body = _get(url, {"fieldSelector": "spec.nodeName!=e01-cn-b"})
    assert [s["spec"]["nodeName"] for s in body["items"]] == ["e01-cn-a"]
    status, body = _get(url, {"fieldSelector": "spec.driver==other.example"})
    assert body["items"] == []
    status, body = _get(url, {"fieldSelector": "spec.pool.name=e01-cn-a"})
    assert status == 400
    assert body["message"] == "field label not supported: spec.pool.name"


@pytest.mark.parametrize(("expression", "selected"), [
    ('device.driver == "rdma-hca.io"', True),
    ("device.driver=='rdma-hca.io'", True),
    ('"rdma-hca.io" == device.driver && device.attributes["rdma-hca.io"].linkState == "up"',
     True),
    ('device.driver == "rdma-hca.io.example"', False),
    ('device.driver != "rdma-hca.io"', False),
])
def test_device_class_selecting_the_driver(expression: str, selected: bool) -> None:
    parsed = parse_device_class(device_class("c", expression))
    assert selects_driver(parsed, "rdma-hca.io") is selected


def test_server_error_on_slices_fails_that_check_only(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.broken.add("resourceslices")
    assert doctor(kubeconfig, tmp_path) == 1
    out = capsys.readouterr().out
    assert ("✗ ResourceSlices of rdma-hca.io: could not be listed: GET "
            in out)
    assert "HTTP 500: Internal error occurred: etcdserver: request timed out" in out
    # Everything else is still judged.
    assert "✓ node e01-cn-b: rdma/hca advertised" in out
    assert "1 of 6 checks failed" in out


def test_node_with_a_slice_but_no_pod_is_an_rdma_node(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster.resource_slices is not None
    cluster.nodes.append(node("e01-cn-c", hca=None))
    cluster.resource_slices.append(resource_slice("e01-cn-c"))
    assert doctor(kubeconfig, tmp_path) == 1
    out = capsys.readouterr().out
    assert ("✗ node e01-cn-c: plugin pod: has ResourceSlices of rdma-hca.io but no pod of "
            "ack-rdma-dp-ds runs there") in out
    assert "✓ node e01-cn-c: ResourceSlice" in out
    assert "e01-cn-c   1                e01-cn-c" in out
