"""The daemon's Node Events with events.enabled and the device plugin alone: a port down
and back on the Node, an HCA leaving sysfs and coming back, and a refused config said on
the Node before the start fails."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.settings.model import ConfigError, Mode, PoolConfig, Selectors, Settings

NODE = "gpu-node-1"


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kc")))
        yield server


def settings(node: SimNode, plugin_dir: Path, **kw: object) -> Settings:
    base = Settings(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                    kubelet_dir=str(plugin_dir), metrics_address="",
                    health_poll_seconds=0.05, node_name=NODE, events_enabled=True)
    return replace(base, **kw)  # type: ignore[arg-type]


async def test_the_device_plugin_tells_the_node_of_a_port_down_and_back(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        api: FakeApiServer) -> None:
    d = Daemon(settings(node, plugin_dir), netlink=False)
    await d.start()
    try:
        node.set_port("mlx5_0", up=False)
        assert await wait_until(lambda: bool(api.events(reason="HcaPortDown")), 10)
        node.set_port("mlx5_0", up=True)
        assert await wait_until(lambda: bool(api.events(reason="HcaPortUp")), 10)
        # The server stores an Event before its answer reaches the recorder, which counts it.
        assert await wait_until(lambda: (d.status().events or {}).get("created") == 2, 10)
        assert (d.status().events or {}).get("dropped") == 0
    finally:
        await d.stop()
    (down,) = api.events(reason="HcaPortDown", kind="Node", name=NODE)
    assert "mlx5_0" in down["note"] and down["type"] == "Warning"
    (up,) = api.events(reason="HcaPortUp", kind="Node", name=NODE)
    assert up["type"] == "Normal"


async def test_an_hca_that_leaves_sysfs_and_comes_back_is_told_both_ways(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        api: FakeApiServer) -> None:
    """A driver reload: the HCA's sysfs entry and device nodes go, then come back."""
    d = Daemon(settings(node, plugin_dir), netlink=False)
    await d.start()
    try:
        node.remove_hca("mlx5_3")
        assert await wait_until(lambda: bool(api.events(reason="HcaDeviceGone")), 10)
        node.add_hca(node.specs["mlx5_3"])
        assert await wait_until(lambda: bool(api.events(reason="HcaDeviceBack")), 10)
    finally:
        await d.stop()
    (gone,) = api.events(reason="HcaDeviceGone", kind="Node", name=NODE)
    assert "mlx5_3" in gone["note"] and gone["type"] == "Warning"
    (back,) = api.events(reason="HcaDeviceBack", kind="Node", name=NODE)
    assert "mlx5_3" in back["note"] and back["type"] == "Normal"


async def test_without_events_enabled_the_device_plugin_sends_nothing(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        api: FakeApiServer) -> None:
    d = Daemon(settings(node, plugin_dir, events_enabled=False), netlink=False)
    await d.start()
    try:
        assert d.node_events is None
    finally:
        await d.stop()
    assert api.requests == []


async def test_a_refused_config_is_a_warning_on_the_node_before_the_exit(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        api: FakeApiServer) -> None:
    pools = (
        PoolConfig(selectors=Selectors(names=("mlx5_[0-3]",))),
        PoolConfig(resource_name="rdma/storage", mode=Mode.EXCLUSIVE,
                   selectors=Selectors(names=("mlx5_?",), drivers=("mlx5_core",))),
    )
    d = Daemon(settings(node, plugin_dir, pools=pools), netlink=False)
    try:
        with pytest.raises(ConfigError) as err:
            await d.start()
    finally:
        await d.stop()
    (refused,) = api.events(reason="ConfigRefused", kind="Node", name=NODE)
    assert refused["type"] == "Warning"
    assert ("the HCAs mlx5_0, mlx5_1, mlx5_2, mlx5_3 are in the exclusive pool rdma/storage"
            in refused["note"])
    assert str(err.value) in refused["note"]
