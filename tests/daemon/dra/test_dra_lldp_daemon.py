"""`serve` with fabric.lldp and DRA: a frame on an HCA's netdev becomes its device's switch
attributes in the slice, the neighbour on /metrics; the wire stands in for the raw
sockets (a socket pair per netdev, read by the daemon's event loop)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lldp_support import SWITCH_A, Wires

from rdma_hca.contract.fabric import SWITCH, SWITCH_PORT
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.dra.kubelet import DraKubelet
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.node.lldp import build_frame
from rdma_hca.settings.model import CdiConfig, DraConfig, FabricConfig, Settings

DRIVER = "rdma-hca.io"
NODE = "node-a"


@pytest.fixture
def kubelet_root() -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="dra-l-", dir="/tmp")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _devices(api: FakeApiServer) -> dict[str, dict[str, object]]:
    return {d["name"]: d for s in api.slices(NODE) for d in s["spec"]["devices"]}


@pytest.mark.slow  # the publisher spaces the second write
async def test_a_frame_becomes_the_devices_switch(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path, api: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    kubelet = DraKubelet(kubelet_root, NODE)
    await kubelet.start()
    settings = Settings(
        sysfs_root=str(dra_node.sysfs_root), dev_root=str(dra_node.dev_root),
        kubelet_root=kubelet_root, node_name=NODE, metrics_address="",
        device_plugin_enabled=False, dra=DraConfig(enabled=True, start_jitter_seconds=0),
        cdi=CdiConfig(spec_dir=str(tmp_path / "cdi")), fabric=FabricConfig(lldp=True))
    os.makedirs(settings.kubelet_dir, exist_ok=True)
    daemon = Daemon(settings, netlink=False)
    assert daemon.lldp is not None
    wires = Wires()
    daemon.lldp.opener = wires
    try:
        await daemon.start()
        assert await wait_until(lambda: "mlx5-0" in _devices(api), 10.0)
        assert f"{DRIVER}/{SWITCH}" not in _devices(api)["mlx5-0"]["attributes"]
        # The bond is heard on its members.
        assert set(daemon.lldp.stats().netdevs) >= {"eth0", "ens241f0np0", "ens241f1np1"}
        wires.send("eth0", build_frame(SWITCH_A, "Ethernet7", system_name="leaf-1"))

        def switched() -> bool:
            attrs = _devices(api)["mlx5-0"]["attributes"]
            return attrs.get(f"{DRIVER}/{SWITCH}") == {"string": "leaf-1"}

        assert await wait_until(switched, 10.0)
        attrs = _devices(api)["mlx5-0"]["attributes"]
        assert attrs[f"{DRIVER}/{SWITCH_PORT}"] == {"string": "Ethernet7"}
        status = daemon.status().lldp
        assert status is not None and status.listening
        assert [(n.hca, n.switch) for n in status.neighbours] == [("mlx5_0", "leaf-1")]
    finally:
        await daemon.stop()
        await kubelet.stop()
        wires.close()
