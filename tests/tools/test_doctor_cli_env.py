"""``rdma-hca doctor`` run through ``cli.main(env=...)`` reads that environment, not the
process's: the kubeconfig, the home directory and the node view's settings come from it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdma_hca import cli
from rdma_hca.devkit.kube.apiserver import serve, write_kubeconfig
from rdma_hca.devkit.kube.cluster import FakeCluster
from rdma_hca.devkit.kube.objects import daemonset, node, pod
from rdma_hca.devkit.sim import nodes as sim


@pytest.fixture
def url() -> Iterator[str]:
    cluster = FakeCluster(
        nodes=[node("e01-cn-a")],
        daemonsets={("kube-system", "ack-rdma-dp-ds"): daemonset(desired=1, ready=1)},
        pods=[pod("ack-rdma-dp-ds-7x2kq", "e01-cn-a")],
    )
    with serve(cluster) as served:
        yield served


@pytest.fixture(autouse=True)
def _process_env_points_elsewhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The process's own variables name nothing usable: only the given env can work."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "process-kubeconfig-missing"))
    monkeypatch.setenv("HOME", str(tmp_path / "process-home"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


def _doctor(capsys: pytest.CaptureFixture[str], argv: list[str],
            env: dict[str, str]) -> tuple[int, str, str]:
    code = cli.main(["doctor", *argv], env=env)
    out, err = capsys.readouterr()
    return code, out, err


def test_kubeconfig_comes_from_the_given_environment(
        url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_kubeconfig(tmp_path / "given-kubeconfig", url)
    code, out, err = _doctor(capsys, ["--json"], {"KUBECONFIG": str(config),
                                                  "HOME": str(tmp_path / "given-home")})
    assert code == 0, err
    assert json.loads(out)["ok"] is True


def test_home_kubeconfig_comes_from_the_given_home(
        url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "given-home"
    (home / ".kube").mkdir(parents=True)
    write_kubeconfig(home / ".kube" / "config", url)
    code, out, err = _doctor(capsys, ["--json"], {"HOME": str(home)})
    assert code == 0, err
    assert json.loads(out)["ok"] is True


def test_no_credentials_in_the_given_environment_names_its_places(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "given-home"
    code, _, err = _doctor(capsys, [], {"HOME": str(home)})
    assert code == 2
    # The process's KUBECONFIG is set but is not the one looked at.
    assert "$KUBECONFIG (not set)" in err, err
    assert str(home / ".kube" / "config") in err
    assert "process-kubeconfig-missing" not in err and "process-home" not in err


def test_node_view_settings_come_from_the_given_environment(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = sim.gpu_node(tmp_path / "node", hcas=1, gid_table_size=8)
    monkeypatch.setenv("RDMA_HCA_NON_HOST_NETWORK", "false")
    env = {"RDMA_HCA_SYSFS_ROOT": str(gpu.sysfs_root), "RDMA_HCA_DEV_ROOT": str(gpu.dev_root),
           "RDMA_HCA_NON_HOST_NETWORK": "true"}
    _, out, _ = _doctor(capsys, ["--node", "--json",
                                 "--readyz-url", "http://127.0.0.1:1/readyz"], env)
    assert json.loads(out)["nonHostNetwork"] is True
