"""`kubectl rdma-hca doctor`: the real kubectl finds the `kubectl-rdma_hca` entry point on
PATH and runs our CLI with the rest of the command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import ensure_kubectl


@pytest.fixture(scope="module")
def kubectl() -> Path:
    return ensure_kubectl()


def plugin_path() -> Path:
    """The directory of the installed `kubectl-rdma_hca` script (the venv's bin)."""
    found = shutil.which("kubectl-rdma_hca", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("kubectl-rdma_hca is not installed next to the interpreter: reinstall the "
                    "package (`make venv`), which creates its console scripts", pytrace=False)
    return Path(found).parent


def run_kubectl(kubectl: Path, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{plugin_path()}{os.pathsep}/usr/bin:/bin", "HOME": str(home)}
    return subprocess.run([str(kubectl), *args], capture_output=True, text=True, timeout=60,
                          env=env, check=False)


def test_kubectl_lists_the_plugin(kubectl: Path, tmp_path: Path) -> None:
    result = run_kubectl(kubectl, "plugin", "list", home=tmp_path)
    assert "kubectl-rdma_hca" in result.stdout, result.stdout + result.stderr


def test_kubectl_rdma_hca_doctor_runs_our_doctor(kubectl: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    result = run_kubectl(kubectl, "rdma-hca", "doctor", "--kubeconfig", str(missing),
                         home=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (f"rdma-hca doctor: kubeconfig {missing} does not exist: "
                                     "pass an existing file to --kubeconfig")
    version = run_kubectl(kubectl, "rdma-hca", "--version", home=tmp_path)
    assert "0.1.0" in version.stdout + version.stderr
