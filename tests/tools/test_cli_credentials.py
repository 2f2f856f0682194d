"""Without credentials, each command says what it tried and how to fix it with what that
command accepts: ``serve --dra`` has no --kubeconfig, ``doctor`` has."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return sim.gpu_node(tmp_path_factory.mktemp("creds") / "node")


def rdma_hca(argv: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it, with no credentials anywhere it could look."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
             and not k.startswith("RDMA_HCA_")}
    clean.update(HOME=str(home), **env)
    return subprocess.run([sys.executable, "-m", "rdma_hca.cli", *argv], env=clean,
                          capture_output=True, text=True, timeout=60, check=False)


def test_serve_dra_names_only_what_serve_accepts(gpu: SimNode, tmp_path: Path) -> None:
    # The driver's socket paths must fit a unix socket's 107 bytes, which a pytest temp
    # path may not: the kubelet root is a short directory under /tmp.
    with tempfile.TemporaryDirectory(prefix="kubelet-", dir="/tmp") as kubelet:
        result = rdma_hca(["serve", "--dra", "--no-device-plugin", "--sysfs-root",
                           str(gpu.sysfs_root), "--dev-root", str(gpu.dev_root),
                           "--kubelet-root", kubelet, "--metrics-address", ""],
                          tmp_path / "home", NODE_NAME="gpu-1")
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert errors[0].endswith(
        "config error: the DRA driver needs the API server: no usable API server credentials: "
        "tried the in-cluster service account (KUBERNETES_SERVICE_HOST is not set), then "
        f"$KUBECONFIG (not set), then {tmp_path / 'home' / '.kube' / 'config'} (missing): run "
        "it in a pod with its service account token mounted (the chart does when dra.enabled "
        "is true), or set KUBECONFIG to a kubeconfig file")
    serve_help = rdma_hca(["serve", "--help"], tmp_path).stdout
    assert "--kubeconfig" not in serve_help and "--context" not in serve_help


def test_doctor_names_its_kubeconfig_flag(tmp_path: Path) -> None:
    result = rdma_hca(["doctor"], tmp_path / "home")
    assert result.returncode == 2
    assert result.stderr == (
        "rdma-hca doctor: no usable API server credentials: tried --kubeconfig (not given), "
        f"then $KUBECONFIG (not set), then {tmp_path / 'home' / '.kube' / 'config'} (missing), "
        "then the in-cluster service account (KUBERNETES_SERVICE_HOST is not set): pass "
        "--kubeconfig FILE or set KUBECONFIG to a kubeconfig file\n")
    assert "--kubeconfig" in rdma_hca(["doctor", "--help"], tmp_path).stdout
