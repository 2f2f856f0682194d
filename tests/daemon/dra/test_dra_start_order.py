"""The driver registers with the kubelet before its API client can send: lightkube's HTTP
stack and the TLS context are built off the loop meanwhile. A Prepare that comes first
waits for the client; a client that cannot be built ends the start, sockets removed."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from dra_support import DRIVER, NODE

from rdma_hca.daemon.dra.driver import DraDriver
from rdma_hca.daemon.dra.kubeletplugin.options import DraConfigError
from rdma_hca.daemon.watch.health import HealthWatcher
from rdma_hca.devkit.dra.kubelet import DraKubelet
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kube.client import _build_http
from rdma_hca.kube.credentials import Credentials
from rdma_hca.kube.errors import KubeconfigError
from rdma_hca.node.deadline_reader import NodeReader
from rdma_hca.node.model import NodeInventory

GATE_WAIT = 10.0  # a test that fails never leaves the build's thread waiting longer


class GatedBuild:
    """lightkube's HTTP client, built only once the test lets it through (as a slow import
    or a slow certificate read would); ``fail`` instead raises what a bad kubeconfig does."""

    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail
        self.entered = threading.Event()
        self.go = threading.Event()

    def __call__(self, creds: Credentials, timeout: float) -> Any:
        self.entered.set()
        self.go.wait(GATE_WAIT)
        if self.fail is not None:
            raise KubeconfigError(self.fail)
        return _build_http(creds, timeout)


@dataclass
class Pieces:
    stage: DraStage  # for its configuration only: the driver is started by hand
    kubelet: DraKubelet
    inventory: NodeInventory


@pytest.fixture
async def pieces(dra_node: SimNode, tmp_path: Path,
                 api: FakeApiServer) -> AsyncIterator[Pieces]:
    work = tmp_path / "s"
    work.mkdir()
    stage = DraStage(dra_node, work, api=api, node_name=NODE)
    api.add_node(NODE)
    kubelet = DraKubelet(stage.root, NODE)
    await kubelet.start()
    reader = NodeReader(dra_node.sysfs_root, dra_node.dev_root, deadline=5.0)
    inventory = await HealthWatcher([], reader, poll_seconds=60.0, flap_hold_seconds=0.0,
                                    events=None).refresh()
    try:
        yield Pieces(stage, kubelet, inventory)
    finally:
        await kubelet.stop()
        shutil.rmtree(stage.root, ignore_errors=True)


def _result(device: str) -> dict[str, str]:
    return {"request": "hca", "driver": DRIVER, "pool": NODE, "device": device}


async def _entered(gate: GatedBuild) -> bool:
    return await asyncio.to_thread(gate.entered.wait, GATE_WAIT)


async def test_registration_comes_while_the_client_is_built_and_a_prepare_waits_for_it(
        pieces: Pieces, api: FakeApiServer) -> None:
    gate = GatedBuild()
    driver = DraDriver(pieces.stage.config(), http=gate)
    starting = asyncio.create_task(driver.start(pieces.inventory))
    try:
        assert await _entered(gate)
        assert await pieces.kubelet.wait_registered(DRIVER, 1, 10.0)
        assert driver.stats().registered and not starting.done()
        uid = api.add_claim("ns", "early", [_result("mlx5-0")])
        prepare = asyncio.create_task(pieces.kubelet.prepare(DRIVER, [("ns", uid, "early")]))
        await asyncio.sleep(0.3)
        # Waiting for the client: nothing went out, nothing was answered.
        assert not prepare.done() and api.count() == 0
        gate.go.set()
        resp = await asyncio.wait_for(prepare, 10.0)
        assert resp.claims[uid].error == ""
        assert [d.device_name for d in resp.claims[uid].devices] == ["mlx5-0"]
        await asyncio.wait_for(starting, 10.0)
        assert api.count("GET", "/resourceclaims/early") == 1
    finally:
        gate.go.set()
        await asyncio.gather(starting, return_exceptions=True)
        await driver.stop()


async def test_a_prepare_while_the_build_fails_gets_the_claims_error(
        pieces: Pieces, api: FakeApiServer) -> None:
    gate = GatedBuild(fail="kubeconfig /x, context test: a certificate or key is not valid "
                           "PEM (no start line): fix the kubeconfig")
    config = pieces.stage.config()
    driver = DraDriver(config, http=gate)
    starting = asyncio.create_task(driver.start(pieces.inventory))
    try:
        assert await _entered(gate)
        assert await pieces.kubelet.wait_registered(DRIVER, 1, 10.0)
        uid = api.add_claim("ns", "early", [_result("mlx5-0")])
        prepare = asyncio.create_task(pieces.kubelet.prepare(DRIVER, [("ns", uid, "early")]))
        await asyncio.sleep(0.3)
        assert not prepare.done()
        gate.go.set()
        with pytest.raises(DraConfigError) as err:
            await asyncio.wait_for(starting, 10.0)
        assert str(err.value) == f"the DRA driver needs the API server: {gate.fail}"
        # Answered before the driver stopped, or refused by a driver that is gone: either
        # way the claim is not prepared, and nothing of the driver is left behind.
        try:
            resp = await asyncio.wait_for(prepare, 10.0)
        except Exception:  # the connection closed with the driver's server
            pass
        else:
            assert gate.fail in resp.claims[uid].error
            assert "cannot read ResourceClaim ns/early" in resp.claims[uid].error
        assert not os.path.exists(config.endpoint)
        assert not os.path.exists(config.registration_socket)
        assert driver.tasks == [] and api.count() == 0
    finally:
        gate.go.set()
        await asyncio.gather(starting, return_exceptions=True)
        await driver.stop()


async def test_a_client_that_cannot_be_built_ends_the_start_with_the_sockets_removed(
        pieces: Pieces) -> None:
    gate = GatedBuild(fail="kubeconfig /x: cannot read a certificate or key (Permission "
                           "denied): fix the kubeconfig")
    gate.go.set()
    config = pieces.stage.config()
    driver = DraDriver(config, http=gate)
    with pytest.raises(DraConfigError, match=r"^the DRA driver needs the API server: "
                                             r"kubeconfig /x: cannot read"):
        await asyncio.wait_for(driver.start(pieces.inventory), 10.0)
    assert not os.path.exists(config.endpoint)
    assert not os.path.exists(config.registration_socket)
    assert driver.tasks == [] and driver.events is None
    with pytest.raises(RuntimeError, match="not started"):
        driver.helper  # noqa: B018


def test_serve_with_a_certificate_that_is_not_pem_exits_2_in_one_line(
        dra_node: SimNode, tmp_path: Path) -> None:
    """The real build, in the real process: the certificate is read only once the driver
    has registered, and its error still ends serve as a missing kubeconfig does."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {
            "server": "https://127.0.0.1:9",
            "certificate-authority-data": base64.b64encode(b"not a certificate").decode()}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    env = {k: v for k, v in os.environ.items()
           if k != "KUBERNETES_SERVICE_HOST" and not k.startswith("RDMA_HCA_")}
    env.update(KUBECONFIG=str(kubeconfig), NODE_NAME=NODE, HOME=str(tmp_path))
    # Unix socket paths must fit 107 bytes: the kubelet root is a short directory.
    with tempfile.TemporaryDirectory(prefix="kubelet-", dir="/tmp") as kubelet:
        result = subprocess.run(
            [sys.executable, "-m", "rdma_hca.cli", "serve", "--dra", "--no-device-plugin",
             "--sysfs-root", str(dra_node.sysfs_root), "--dev-root", str(dra_node.dev_root),
             "--kubelet-root", kubelet, "--metrics-address", ""],
            env=env, capture_output=True, text=True, timeout=60, check=False)
        left = [str(p) for p in Path(kubelet).rglob("*") if p.is_socket()]
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert errors[0].endswith(
        f"config error: the DRA driver needs the API server: kubeconfig {kubeconfig}, "
        "context c: a certificate or key is not valid PEM (NO_CERTIFICATE_OR_CRL_FOUND): fix "
        "the kubeconfig"), result.stderr
    assert left == []
