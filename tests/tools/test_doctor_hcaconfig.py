"""``rdma-hca doctor`` cluster view: the claims and templates whose HcaConfig parameters
the driver would refuse at Prepare, found over real HTTP to the fake API server and
worded as the driver words them."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.contract.hcaconfig import FIX
from rdma_hca.devkit.kube.apiserver import serve, write_kubeconfig
from rdma_hca.devkit.kube.cluster import FakeCluster
from rdma_hca.devkit.kube.objects import CREATED, daemonset, node, pod, resource_slice
from rdma_hca.tools.doctor import main

NOW = dt.datetime.fromisoformat(CREATED.replace("Z", "+00:00")) + dt.timedelta(hours=17)
DRIVER = "rdma-hca.io"
TITLE = f"HcaConfig parameters of {DRIVER}"
Obj = dict[str, Any]


def params(**fields: Any) -> Obj:
    return {"apiVersion": "rdma-hca.io/v1", "kind": "HcaConfig", **fields}


def devices(*parameters: Any, driver: str = DRIVER) -> Obj:
    return {"requests": [{"name": "hca", "exactly": {"deviceClassName": DRIVER}}],
            "config": [{"opaque": {"driver": driver, "parameters": p}} for p in parameters]}


def claim(namespace: str, name: str, *parameters: Any, driver: str = DRIVER) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
            "spec": {"devices": devices(*parameters, driver=driver)}}


def template(namespace: str, name: str, *parameters: Any) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"namespace": namespace, "name": name},
            "spec": {"spec": {"devices": devices(*parameters)}}}


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster(
        nodes=[node("e01-cn-a")],
        daemonsets={("kube-system", "ack-rdma-dp-ds"): daemonset(desired=1, ready=1)},
        pods=[pod("ack-rdma-dp-ds-7x2kq", "e01-cn-a")],
        resource_slices=[resource_slice("e01-cn-a")],
        resource_claims=[claim("ml", "good", params(trafficClass=106)),
                         claim("ml", "other-driver", {"x": 1}, driver="gpu.example.com"),
                         claim("ml", "trainer-hca", params(trafficClass=1),
                               params(trafficClass=300))],
        resource_claim_templates=[template("ml", "tuned", params(gidFamily="ipv4")),
                                  template("batch", "typo", params(gidindex=3))],
    )


@pytest.fixture
def kubeconfig(cluster: FakeCluster, tmp_path: Path) -> Iterator[Path]:
    with serve(cluster) as url:
        yield write_kubeconfig(tmp_path / "kubeconfig", url)


def doctor(kubeconfig: Path, tmp_path: Path, *extra: str) -> int:
    return main(["--kubeconfig", str(kubeconfig), *extra], env={}, home=tmp_path / "home",
                now=NOW)


def test_claims_and_templates_the_driver_would_refuse_are_listed_with_the_fix(
        kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = doctor(kubeconfig, tmp_path)
    out = capsys.readouterr().out
    assert status == 1, out
    (line,) = [x for x in out.splitlines() if TITLE in x]
    assert line.startswith("✗")
    assert ("2 object(s) pass parameters the driver refuses, so their pods fail to start "
            "(ClaimPrepareFailed): ResourceClaim ml/trainer-hca: HcaConfig field "
            '"trafficClass": 300 is not accepted: an integer 0-255; ResourceClaimTemplate '
            'batch/typo: HcaConfig field "gidindex" is not known: the fields are apiVersion, '
            "kind, gidIndex, gidFamily, trafficClass, serviceLevel, managementDevices") in line
    assert "good" not in line and "other-driver" not in line and "tuned" not in line
    assert FIX in out


def test_the_json_carries_the_check(
        kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor(kubeconfig, tmp_path, "--json") == 1
    report = json.loads(capsys.readouterr().out)
    (found,) = [c for c in report["checks"] if c["name"] == TITLE]
    assert found["ok"] is False and found["fix"] == FIX
    assert "ml/trainer-hca" in found["detail"]


def test_good_parameters_add_no_line(
        cluster: FakeCluster, kubeconfig: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster.resource_claims[:] = cluster.resource_claims[:2]
    cluster.resource_claim_templates[:] = cluster.resource_claim_templates[:1]
    status = doctor(kubeconfig, tmp_path)
    out = capsys.readouterr().out
    assert status == 0, out
    assert TITLE not in out
    paths = [r.path for r in cluster.requests]
    assert "/apis/resource.k8s.io/v1/resourceclaims" in paths
    assert "/apis/resource.k8s.io/v1/resourceclaimtemplates" in paths


def test_claims_it_may_not_list_are_a_note_naming_the_permission(
        cluster: FakeCluster, kubeconfig: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster.forbidden.add("resourceclaimtemplates")
    status = doctor(kubeconfig, tmp_path)
    out = capsys.readouterr().out
    assert status == 0, out
    (line,) = [x for x in out.splitlines() if TITLE in x]
    assert line.startswith("✓") and "not checked: RBAC denied listing claims" in line
    assert "--resource=resourceclaims.resource.k8s.io,resourceclaimtemplates." in line


def test_without_the_dra_api_claims_are_not_asked_for(
        cluster: FakeCluster, kubeconfig: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster.resource_slices = None  # no resource.k8s.io/v1
    doctor(kubeconfig, tmp_path)
    assert TITLE not in capsys.readouterr().out
    assert not any("resourceclaim" in r.path for r in cluster.requests)
