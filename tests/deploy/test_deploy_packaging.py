"""Packaging smoke test: the wheel the image is built from installs and runs on its own.

This is what the Dockerfile's stages do, minus the container: run the build stage's own RUN
command (drop the devkit, build a wheel without dependencies), install the wheel into a fresh
venv (dependencies from the package index), run it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import REPO
from test_deploy_image import instructions

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
    # The build stage's command as the Dockerfile has it, run in the copy as in WORKDIR /src.
    command = build_stage_command().replace("pip wheel", f"{sys.executable} -m pip wheel "
                                            "--quiet").replace("/wheels", str(wheels))
    subprocess.run(["sh", "-ec", command], cwd=src, check=True, timeout=600,
                   capture_output=True)
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
    # No devkit on a node (issue: the image carries no harness code).
    run(venv / "bin" / "python", "-c",
        "import importlib.util as u, sys; sys.exit(u.find_spec('rdma_hca.devkit') is not None)")
    demo = subprocess.run([venv / "bin" / "rdma-hca", "demo"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert demo.returncode != 0
    assert "not in this installation" in demo.stderr and "Traceback" not in demo.stderr
    assert run(venv / "bin" / "kubectl-rdma_hca", "--version").stdout.strip()


def build_stage_command() -> str:
    """The RUN of the Dockerfile's build stage (between the first and second FROM)."""
    steps = instructions()
    froms = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    (command,) = [rest for word, rest in steps[froms[0]:froms[1]] if word == "RUN"]
    return command


def test_the_image_is_built_without_the_devkit() -> None:
    command = build_stage_command()
    assert command.startswith("rm -rf src/rdma_hca/devkit ")
    assert "pip wheel" in command
    runs = [rest for word, rest in instructions() if word == "RUN"]
    assert "find_spec('rdma_hca.devkit') is not None" in runs[-1]
