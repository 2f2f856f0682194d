"""A signal at any moment of start-up ends ``rdma-hca`` with its documented status and one
line, never a traceback or a silent death.

The moments are found, not timed: the child's memory map shows which extension modules it
has loaded, so each signal lands while a known part of start-up runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode

SRC = str(Path(__file__).parents[2] / "src")


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RDMA_HCA_")}
    env["PYTHONPATH"] = SRC
    return env


def loaded(pid: int, marker: str) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def wait_for(proc: subprocess.Popen[str], marker: str) -> None:
    """Until the child has mapped a file whose path holds ``marker`` (or has ended)."""
    deadline = time.monotonic() + 60
    while not loaded(proc.pid, marker):
        assert proc.poll() is None, "the child ended before the moment came"
        assert time.monotonic() < deadline, f"{marker} never loaded"
        time.sleep(0.001)


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return sim.gpu_node(tmp_path_factory.mktemp("signals") / "node")


def serve_argv(gpu: SimNode, plugin_dir: Path) -> list[str]:
    return [sys.executable, "-m", "rdma_hca.cli", "serve", "--sysfs-root", str(gpu.sysfs_root),
            "--dev-root", str(gpu.dev_root), "--kubelet-dir", str(plugin_dir),
            "--metrics-address", ""]


# json's C module loads while the CLI's own modules load (before main runs; serve loads
# yaml's only for a config file); gRPC's core while serve's daemon modules load (before its
# event loop takes the signals over).
MOMENTS = {"cli-imports": "_json.", "daemon-imports": "cygrpc"}


@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)],
                         ids=["INT", "TERM"])
def test_serve_stopped_while_starting(gpu: SimNode, tmp_path: Path, moment: str,
                                      sig: signal.Signals, status: int) -> None:
    proc = subprocess.Popen(serve_argv(gpu, tmp_path), env=child_env(), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        wait_for(proc, MOMENTS[moment])
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err, err
    assert proc.returncode == status, err
    lines = err.strip().splitlines()
    assert lines[-1].endswith(f"rdma-hca serve: {sig.name} while starting; stopped before "
                              "serving anything") or "stopping:" in lines[-1], err
    assert list(tmp_path.iterdir()) == [], "a socket was left behind"


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["INT", "TERM"])
def test_a_tool_stopped_while_starting(gpu: SimNode, sig: signal.Signals,
                                       status: int) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "rdma_hca.cli", "discover",
                             "--sysfs-root", str(gpu.sysfs_root)], env=child_env(), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        wait_for(proc, "_yaml")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err, err
    assert (proc.returncode, err) == (status, f"rdma-hca discover: stopped by {sig.name}\n")


def test_the_installed_command_takes_the_signals_over_as_early(gpu: SimNode,
                                                               tmp_path: Path) -> None:
    # What pip writes for the console script: `rdma-hca` imports the CLI, then calls main.
    script = tmp_path / "rdma-hca"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom rdma_hca.cli import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), "discover", "--sysfs-root", str(gpu.sysfs_root)],
                            env=child_env(), text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(proc, "_yaml")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (130, "rdma-hca discover: stopped by SIGINT\n"), err
