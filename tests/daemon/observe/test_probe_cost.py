"""What the chart's exec probe costs: ``python -m rdma_hca.tools.probe readyz`` runs every
few seconds in the pod's CPU request, so it imports nothing beyond what the interpreter
loads for ``-m`` and its own few modules (no argparse, socket, typing; none of the daemon's
gRPC, Prometheus or YAML), and the chart's probe periods keep it within a third of the
request at the measured cost per call."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from rdma_hca.daemon.observe.httpserver import MetricsServer
from rdma_hca.daemon.observe.status import PoolStatus, Status
from rdma_hca.kit.probe import probe_socket_path

READY = Status(version="t", pools=(PoolStatus("rdma/hca", 1000, 1000, 9, (), True, 1),),
               health_stale_after=float("inf"))
# The probe's own modules; everything else must be loaded by the interpreter anyway.
OWN = {"rdma_hca", "rdma_hca.tools", "rdma_hca.tools.probe", "rdma_hca.kit",
       "rdma_hca.kit.exitcodes", "rdma_hca.kit.probe", "_socket", "__future__"}
HEAVY = {"grpc", "prometheus_client", "yaml", "lightkube", "httpx", "asyncio", "argparse",
         "socket", "selectors", "typing", "logging", "json", "re", "enum", "dataclasses"}


@pytest.fixture
def probe_dir() -> Iterator[str]:
    # Unix socket paths are limited to 107 bytes: a short directory under /tmp.
    with tempfile.TemporaryDirectory(prefix="probe-", dir="/tmp") as d:
        yield d


def imported(argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str],
                                                              set[str]]:
    """Run ``python -X importtime`` with ``argv``: the process and the modules it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env,
                          capture_output=True, text=True, timeout=60)
    names = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    names.discard("imported package")
    return done, names


async def test_the_charts_probe_imports_only_its_own_modules(probe_dir: str) -> None:
    server = MetricsServer(lambda: READY, "127.0.0.1:0",
                           probe_socket=probe_socket_path(probe_dir, "pod-cost"))
    await server.start()
    env = {**os.environ, "POD_UID": "pod-cost", "TMPDIR": probe_dir}
    try:
        done, names = await asyncio.to_thread(
            imported, ["-m", "rdma_hca.tools.probe", "readyz"], env)
    finally:
        await server.stop()
    assert done.returncode == 0 and done.stdout == "registered with the kubelet\n"
    _, interpreter = imported(["-c", "import runpy"], env)  # what -m loads anyway
    assert "runpy" in interpreter and "rdma_hca.kit.probe" in names
    assert names & HEAVY == set()
    assert names - interpreter - OWN == set()


def test_any_other_command_line_still_gets_argparse(probe_dir: str) -> None:
    env = {**os.environ, "POD_UID": "pod-none", "TMPDIR": probe_dir}
    done = subprocess.run([sys.executable, "-m", "rdma_hca.tools.probe", "readyz", "--dir",
                           probe_dir, "--timeout", "0.5"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.startswith(
        "rdma-hca probe readyz: no probe socket at ")
    done = subprocess.run([sys.executable, "-m", "rdma_hca.tools.probe", "ready"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "invalid choice: 'ready'" in done.stderr
    done = subprocess.run([sys.executable, "-m", "rdma_hca.tools.probe", "--help"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "healthz" in done.stdout
