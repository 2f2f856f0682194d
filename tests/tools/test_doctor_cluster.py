"""``rdma-hca doctor`` cluster view against a fake API server over real HTTP."""

from __future__ import annotations

import datetime as dt
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdma_hca.devkit.kube.apiserver import serve, write_kubeconfig
from rdma_hca.devkit.kube.cluster import TOKEN, FakeCluster
from rdma_hca.devkit.kube.objects import CREATED, daemonset, node, pod
from rdma_hca.tools.doctor import main

NOW = dt.datetime.fromisoformat(CREATED.replace("Z", "+00:00")) + dt.timedelta(hours=17)


@pytest.fixture
def cluster() -> FakeCluster:
    """The seed guide's healthy cluster: two RDMA nodes, both pods ready, 1k each."""
    return FakeCluster(
        nodes=[node("e01-cn-a"), node("e01-cn-b")],
        daemonsets={("kube-system", "ack-rdma-dp-ds"): daemonset(desired=2, ready=2)},
        pods=[pod("ack-rdma-dp-ds-7x2kq", "e01-cn-a"), pod("ack-rdma-dp-ds-9fzlm", "e01-cn-b")],
    )


@pytest.fixture
def kubeconfig(cluster: FakeCluster, tmp_path: Path) -> Iterator[Path]:
    with serve(cluster) as url:
        yield write_kubeconfig(tmp_path / "kubeconfig", url)


def doctor(argv: list[str], tmp_path: Path) -> int:
    # An empty environment and home keep the developer's own kubeconfig out of the test.
    return main(argv, env={}, home=tmp_path / "home", now=NOW)


def test_healthy_cluster_prints_kubectl_columns_and_passes(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = doctor(["--kubeconfig", str(kubeconfig)], tmp_path)
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    assert lines[0] == ("NAME             DESIRED   CURRENT   READY   UP-TO-DATE   AVAILABLE"
                        "   NODE SELECTOR   AGE")
    assert lines[1] == ("ack-rdma-dp-ds   2         2         2       2            2"
                        "           <none>          17h")
    assert "✗" not in out
    assert "e01-cn-a   ack-rdma-dp-ds-7x2kq" in out
    assert "capacity 1k, allocatable 1k" in out
    assert "all 5 checks passed" in out
    # The client authenticates every request and lists only the DaemonSet's pods.
    assert {r.authorization for r in cluster.requests} == {f"Bearer {TOKEN}"}
    pod_requests = [r for r in cluster.requests if r.path.endswith("/pods")]
    selector = pod_requests[0].query["labelSelector"]
    assert selector == ["app=ack-rdma-dp,component=rdma-device-plugin"]


def test_node_at_zero_fails_and_points_at_node_doctor(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.nodes[1] = node("e01-cn-b", hca="0")
    status = doctor(["--kubeconfig", str(kubeconfig)], tmp_path)
    out = capsys.readouterr().out
    assert status == 1
    assert "✗ node e01-cn-b: rdma/hca advertised: the plugin pod runs but the node shows 0" in out
    assert ("kubectl -n kube-system exec ack-rdma-dp-ds-9fzlm -- rdma-hca doctor --node"
            in out)
    assert "✓ node e01-cn-a: rdma/hca advertised" in out


def test_node_without_the_resource_fails(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.nodes[0] = node("e01-cn-a", hca=None)
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 1
    assert "the plugin pod runs but the node shows nothing" in capsys.readouterr().out


def test_allocatable_below_capacity_means_an_unhealthy_hca(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.nodes[0] = node("e01-cn-a", hca="1000", allocatable="0")
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 1
    out = capsys.readouterr().out
    assert "allocatable 0 < capacity 1k: some HCA is unhealthy" in out
    assert "how to fix: check the node's HCA ports:" in out


def test_labelled_node_without_pod_is_told_to_match_the_selector(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.daemonsets[("kube-system", "ack-rdma-dp-ds")] = daemonset(
        desired=2, ready=2, node_selector={"rdma.hca/enabled": "true"}
    )
    cluster.nodes.append(
        node("e01-cn-c", hca=None, labels={"feature.node.kubernetes.io/rdma.capable": "true"})
    )
    cluster.nodes.append(node("cpu-node", hca=None))
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 1
    out = capsys.readouterr().out
    assert "✗ node e01-cn-c: plugin pod: has an RDMA label but no pod of ack-rdma-dp-ds" in out
    assert "kubectl label node e01-cn-c rdma.hca/enabled=true" in out
    assert "rdma.hca/enabled=true   17h" in out  # the NODE SELECTOR column
    # A node with no label, pod or resource is not an RDMA node: nothing to report.
    assert "node cpu-node" not in out
    # The DaemonSet's own line names the node it does not cover.
    assert ("✗ DaemonSet kube-system/ack-rdma-dp-ds: 2 of 2 pods ready; nodes without a ready "
            "pod: e01-cn-c") in out
    assert "2 of 6 checks failed" in out


def test_labelled_node_matching_the_selector_points_at_taints(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.nodes.append(node("e01-cn-c", hca=None, labels={"rdma.hca/enabled": "true"}))
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 1
    assert "kubectl describe node e01-cn-c" in capsys.readouterr().out


def test_stale_count_on_a_node_without_pod_fails(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.nodes.append(node("e01-cn-c", hca="1k", allocatable="0"))
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 1
    assert "advertises rdma/hca but no pod of ack-rdma-dp-ds" in capsys.readouterr().out


def test_daemonset_not_ready(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.daemonsets[("kube-system", "ack-rdma-dp-ds")] = daemonset(desired=2, ready=1)
    cluster.pods[1] = pod("ack-rdma-dp-ds-9fzlm", "e01-cn-b", ready=False,
                          waiting="CrashLoopBackOff")
    cluster.nodes[1] = node("e01-cn-b", hca="1k", allocatable="0")
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 1
    out = capsys.readouterr().out
    assert "ack-rdma-dp-ds   2         2         1       2            1" in out
    assert ("✗ DaemonSet kube-system/ack-rdma-dp-ds: 1 of 2 pods ready, 1 available; nodes "
            "without a ready pod: e01-cn-b") in out
    assert "kubectl -n kube-system logs ds/ack-rdma-dp-ds" in out
    assert "ack-rdma-dp-ds-9fzlm not ready (CrashLoopBackOff)" in out
    assert "kubectl -n kube-system logs ack-rdma-dp-ds-9fzlm" in out


def test_not_ready_pod_on_not_ready_node_says_fix_the_node_first(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.nodes[1] = node("e01-cn-b", ready=False)
    cluster.pods[1] = pod("ack-rdma-dp-ds-9fzlm", "e01-cn-b", ready=False)
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 1
    assert "the node is NotReady, fix it first" in capsys.readouterr().out


def test_daemonset_scheduling_nothing_fails(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.daemonsets[("kube-system", "ack-rdma-dp-ds")] = daemonset(
        desired=0, ready=0, node_selector={"rdma.hca/enabled": "true"})
    cluster.pods.clear()
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 1
    assert "schedules no pods (DESIRED 0" in capsys.readouterr().out


def test_forbidden_names_the_verb_resource_and_permission(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.forbidden.add("nodes")
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "RBAC denied list nodes at cluster scope" in err
    assert 'cannot list resource "nodes"' in err  # the server's own words are kept
    assert "kubectl create clusterrole rdma-hca-doctor --verb=get,list" in err


def test_forbidden_daemonset_names_the_namespace(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.forbidden.add("daemonsets")
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 2
    assert ("RBAC denied get daemonsets.apps in namespace kube-system"
            in capsys.readouterr().err)


def test_wrong_token_is_unauthorized(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.token = "rotated"
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 2
    assert "HTTP 401 Unauthorized" in capsys.readouterr().err


def test_missing_daemonset_asks_whether_the_chart_is_installed(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.daemonsets.clear()
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 1
    out = capsys.readouterr().out
    assert "✗ DaemonSet kube-system/ack-rdma-dp-ds: not found (HTTP 404)" in out
    assert "is the chart installed? helm install ack-rdma-device-plugin" in out
    # Without the DaemonSet no pods are listed.
    assert not any(r.path.endswith("/pods") for r in cluster.requests)


def test_other_namespace_and_name_are_used(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.daemonsets[("rdma", "my-dp")] = daemonset(desired=2, ready=2, name="my-dp",
                                                      namespace="rdma")
    argv = ["--kubeconfig", str(kubeconfig), "--namespace", "rdma", "--name", "my-dp"]
    assert doctor(argv, tmp_path) == 1
    # The pods live in kube-system in the fixture, so none are found in "rdma".
    out = capsys.readouterr().out
    assert "has no pod of it" not in out
    assert "DaemonSet rdma/my-dp: 2 of 2 pods ready" in out
    assert "/apis/apps/v1/namespaces/rdma/daemonsets/my-dp" in [r.path for r in cluster.requests]


def test_unreachable_server_names_the_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    assert doctor(["--kubeconfig", str(config), "--timeout", "2"], tmp_path) == 2
    err = capsys.readouterr().err
    assert f"API server http://127.0.0.1:{port} is unreachable" in err


def test_no_kubeconfig_anywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor([], tmp_path) == 2
    err = capsys.readouterr().err
    assert "no usable API server credentials: tried --kubeconfig (not given)" in err
    assert "--kubeconfig FILE" in err


def test_kubeconfig_flag_naming_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert doctor(["--kubeconfig", str(tmp_path / "nope")], tmp_path) == 2
    assert "does not exist" in capsys.readouterr().err


def test_malformed_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters:\n- name: x\n  cluster: {server: [unclosed\n")
    assert doctor(["--kubeconfig", str(bad)], tmp_path) == 2
    err = capsys.readouterr().err
    assert "is not valid YAML at line" in err


def test_zero_nodes(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.nodes.clear()
    cluster.daemonsets[("kube-system", "ack-rdma-dp-ds")] = daemonset(desired=0, ready=0)
    cluster.pods.clear()
    assert doctor(["--kubeconfig", str(kubeconfig)], tmp_path) == 1
    assert "✗ nodes: the API server lists 0 nodes" in capsys.readouterr().out


def test_json_output(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.nodes[1] = node("e01-cn-b", hca="1k", allocatable="999")
    assert doctor(["--kubeconfig", str(kubeconfig), "--json"], tmp_path) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    assert doc["daemonSet"]["desired"] == 2
    assert doc["daemonSet"]["age"] == "17h"
    assert doc["daemonSet"]["upToDate"] == 2
    assert doc["daemonSet"]["nodeSelector"] == "<none>"
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert nodes["e01-cn-a"]["ok"] is True
    assert nodes["e01-cn-b"] == {
        "name": "e01-cn-b", "pod": "ack-rdma-dp-ds-9fzlm", "podReady": True,
        "capacity": "1k", "allocatable": "999", "rdmaLabelled": False, "ok": False,
    }
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert [c["subject"] for c in failed] == ["e01-cn-b"]
    assert "rdma-hca doctor --node" in failed[0]["fix"]


def test_json_error_is_an_object_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor(["--json"], tmp_path) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    assert "no usable API server credentials" in doc["error"]


def test_custom_resource_name(
    cluster: FakeCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert doctor(["--kubeconfig", str(kubeconfig), "--resource", "example.com/rdma"],
                  tmp_path) == 1
    assert "example.com/rdma advertised: the plugin pod runs but the node shows nothing" in (
        capsys.readouterr().out)


@pytest.mark.parametrize("argv", [["--resource", "no-slash"], ["--timeout", "0"],
                                  ["--bogus-flag"]])
def test_usage_errors_exit_2(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert doctor(argv, tmp_path) == 2
    assert capsys.readouterr().err.strip()


def test_label_selector_as_sent_to_the_api_server() -> None:
    from rdma_hca.kube.credentials import label_selector

    selector = {
        "matchLabels": {"b": "2", "a": "1"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["x", "y"]},
            {"key": "zone", "operator": "NotIn", "values": ["z"]},
            {"key": "rdma", "operator": "Exists"},
            {"key": "cpu-only", "operator": "DoesNotExist"},
        ],
    }
    assert label_selector(selector) == (
        "a=1,b=2,tier in (x,y),zone notin (z),rdma,!cpu-only")
