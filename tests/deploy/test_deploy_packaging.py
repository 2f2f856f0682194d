"""Packaging smoke test: the wheel the image is built from installs and runs on its own.

This is what the Dockerfile's stages do, minus the container: build a wheel without
dependencies, install it into a fresh venv (dependencies from the package index), run it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import REPO

from rdma_hca.devkit.sim.nodes import gpu_node


def run(*cmd: str | Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                            timeout=timeout, check=False)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path: Path) -> None:
    # Build from a copy of what the Dockerfile copies, so the shared working tree gets no
    # build/ or egg-info churn from the build.
    src = tmp_path / "src-copy"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "src", src / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    wheels = tmp_path / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", wheels, src)
    (wheel,) = wheels.glob("rdma_hca-*.whl")

    venv = tmp_path / "venv"
    created = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True,
                             text=True, timeout=300, check=False)
    if created.returncode != 0:
        pytest.fail("cannot create a venv with pip (Debian: apt-get install python3-venv):\n"
                    + created.stderr, pytrace=False)
    run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-cache-dir", wheel)

    version = run(venv / "bin" / "rdma-hca", "--version")
    assert "0.1.0" in version.stdout + version.stderr

    node = gpu_node(tmp_path / "node")
    found = run(venv / "bin" / "rdma-hca", "discover", "--sysfs-root", node.sysfs_root,
                "--dev-root", node.dev_root, timeout=60)
    assert "mlx5_0" in found.stdout
    assert "mlx5_7" in found.stdout
    # The installed copy must be the one that ran, not the repository's editable install.
    where = run(venv / "bin" / "python", "-c", "import rdma_hca; print(rdma_hca.__file__)")
    assert str(venv) in where.stdout
