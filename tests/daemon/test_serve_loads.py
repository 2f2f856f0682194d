"""``rdma-hca serve`` loads only what the configured front end runs.

The real command runs as a child process through its whole life (start, registration, a
scrape, SIGTERM), and writes the modules it ever loaded as it exits: the device plugin
never imports the DRA driver or the API client, and the DRA driver alone never imports
the device plugin (its pools, its gRPC service, its protobuf messages).
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_serve_process import (
    child_env,
    free_port,
    http_get,
    serve,
    serve_argv,
    wait_registered,
)

from rdma_hca.devkit.dra.kubelet import DraKubelet
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until

DRIVER = "rdma-hca.io"
NODE = "node-a"
WAIT = 20.0
DEVICE_PLUGIN = "rdma_hca.daemon.deviceplugin"
DEVICE_PLUGIN_MESSAGES = "rdma_hca.daemon._proto.api_pb2"  # the v1beta1 device plugin API
DRA = "rdma_hca.daemon.dra"
API_STACK = ("rdma_hca.kube", "lightkube", "httpx2", "httpcore2")

# The command as `rdma-hca` runs it, with the modules it loaded written out at its exit.
LOADS = """
import atexit, json, os, runpy, sys

def _write():
    with open(os.environ["SERVE_LOADED_MODULES"], "w") as fh:
        json.dump(sorted(sys.modules), fh)

atexit.register(_write)
runpy.run_module("rdma_hca.cli", run_name="__main__", alter_sys=True)
"""


def _recording(argv: list[str]) -> list[str]:
    """``argv`` (``python -m rdma_hca.cli ...``) through LOADS."""
    assert argv[1:3] == ["-m", "rdma_hca.cli"], argv
    return [argv[0], "-c", LOADS, *argv[3:]]


def _under(modules: list[str], *packages: str) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


@pytest.fixture
def kubelet_root() -> Iterator[str]:
    # Unix socket paths are limited to 107 bytes: a short root under /tmp.
    root = tempfile.mkdtemp(prefix="loads-", dir="/tmp")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def dra_node(tmp_path: Path) -> SimNode:
    return gpu_node(tmp_path / "dra-node", hcas=4, gid_table_size=8)


async def test_the_device_plugin_loads_nothing_of_the_dra_driver_or_the_api_client(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator, tmp_path: Path) -> None:
    out = tmp_path / "modules.json"
    port = free_port()
    argv = _recording(serve_argv(node, plugin_dir, metrics_port=port))
    async with serve(argv, child_env(SERVE_LOADED_MODULES=str(out))) as proc:
        await wait_registered(kubelet)
        status, _ = await http_get(port, "/metrics")
        assert status == 200
        proc.send(signal.SIGTERM)
        assert await proc.wait_exit() == 0, proc.stderr
    loaded = json.loads(out.read_text())
    # What it runs is there: the list is the whole run's.
    assert f"{DEVICE_PLUGIN}.kubelet" in loaded and DEVICE_PLUGIN_MESSAGES in loaded
    assert _under(loaded, DRA, *API_STACK) == []


async def test_the_dra_driver_alone_loads_nothing_of_the_device_plugin(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path) -> None:
    out = tmp_path / "modules.json"
    port = free_port()
    with FakeApiServer() as api:
        api.add_node(NODE)
        env = child_env(KUBECONFIG=str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                        NODE_NAME=NODE, SERVE_LOADED_MODULES=str(out))
        kubelet = DraKubelet(kubelet_root, NODE)
        await kubelet.start()
        argv = [sys.executable, "-c", LOADS, "serve", "--dra", "--no-device-plugin",
                "--sysfs-root", str(dra_node.sysfs_root),
                "--dev-root", str(dra_node.dev_root),
                "--kubelet-root", kubelet_root, "--metrics-address", f"127.0.0.1:{port}",
                "--dra-start-jitter-seconds", "0"]
        try:
            async with serve(argv, env) as proc:
                assert await kubelet.wait_registered(DRIVER, timeout=WAIT), proc.stderr
                assert await wait_until(lambda: len(api.slices(NODE)) == 1, WAIT)
                status, text = await http_get(port, "/metrics")
                assert status == 200 and "rdma_hca_dra_registered 1.0" in text
                proc.send(signal.SIGTERM)
                assert await proc.wait_exit() == 0, proc.stderr
        finally:
            await kubelet.stop()
    loaded = json.loads(out.read_text())
    assert f"{DRA}.driver" in loaded and "lightkube" in loaded
    assert _under(loaded, DEVICE_PLUGIN, DEVICE_PLUGIN_MESSAGES) == []

