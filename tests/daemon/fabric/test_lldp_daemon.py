"""The device plugin front end with fabric.lldp: the neighbours and /metrics need no DRA;
with it off, nothing listens."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lldp_support import SWITCH_A, Wires

from rdma_hca.daemon.observe.metrics import render
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.node.lldp import build_frame
from rdma_hca.settings.model import FabricConfig, Settings


def _settings(node: SimNode, plugin_dir: Path, lldp: bool) -> Settings:
    return Settings(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                    kubelet_dir=str(plugin_dir), metrics_address="", health_poll_seconds=0.05,
                    fabric=FabricConfig(lldp=lldp))


async def test_the_device_plugin_hears_the_neighbours(node: SimNode, plugin_dir: Path,
                                                      kubelet: KubeletEmulator) -> None:
    daemon = Daemon(_settings(node, plugin_dir, True), netlink=False)
    assert daemon.lldp is not None
    wires = Wires()
    daemon.lldp.opener = wires
    try:
        await daemon.start()
        assert "eth0" in wires.far  # mlx5_0's netdev
        wires.send("eth0", build_frame(SWITCH_A, "Ethernet3", system_name="leaf-4"))
        assert await wait_until(lambda: bool(daemon.lldp and daemon.lldp.neighbours.value),
                                5.0)
        text = render(daemon.status()).decode()
        assert 'switch="leaf-4"' in text and 'switch_port="Ethernet3"' in text
        assert "rdma_hca_lldp_listening 1.0" in text
    finally:
        await daemon.stop()
        wires.close()
    await asyncio.sleep(0)
    assert daemon.lldp.stats().netdevs == ()  # the stop closed every socket


async def test_off_by_default_nothing_listens(node: SimNode, plugin_dir: Path,
                                              kubelet: KubeletEmulator) -> None:
    daemon = Daemon(_settings(node, plugin_dir, False), netlink=False)
    try:
        await daemon.start()
        assert daemon.lldp is None and daemon.status().lldp is None
        assert "rdma_hca_lldp" not in render(daemon.status()).decode()
    finally:
        await daemon.stop()
