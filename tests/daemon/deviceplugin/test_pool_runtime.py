"""Pools at run time on a simulated node: HCAs that vanish, pools that select nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from lifecycle_support import R, running, settings_for

from rdma_hca.daemon.deviceplugin.runtime import PoolRuntime
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import Mode, PoolConfig, Selectors, UnhealthyWhen


@pytest.mark.parametrize("mode", [Mode.SHARED, Mode.EXCLUSIVE])
async def test_a_vanished_hca_is_down_until_it_returns(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator, mode: Mode,
        caplog: pytest.LogCaptureFixture) -> None:
    total = len(node.hca_names)
    count = 1000 if mode is Mode.SHARED else total
    settings = settings_for(node, plugin_dir, pools=(PoolConfig(mode=mode),))
    async with running(settings) as d:
        runtime = d.runtimes[0]
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == count)
        spec = node.specs["mlx5_5"]
        node.remove_hca("mlx5_5")
        # Shared: the one verdict of the pool (unhealthyWhen any) is down. Exclusive:
        # the HCA's own ID stays advertised, Unhealthy.
        healthy = 0 if mode is Mode.SHARED else count - 1
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == healthy)
        assert kubelet.capacity(R) == count
        assert runtime.missing_hcas == ("mlx5_5",)
        assert runtime.selected_hca_count == total - 1
        await d.health.refresh()
        await d.health.refresh()
        said = [r for r in caplog.records if "mlx5_5: disappeared" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.WARNING
        node.add_hca(spec)
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == count)
        assert runtime.missing_hcas == ()


async def test_unhealthy_when_all_tolerates_a_vanished_hca(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    pools = (PoolConfig(unhealthy_when=UnhealthyWhen.ALL),)
    async with running(settings_for(node, plugin_dir, pools=pools)) as d:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        node.remove_hca("mlx5_5")
        assert await wait_until(lambda: d.runtimes[0].missing_hcas == ("mlx5_5",), 5)
        assert kubelet.allocatable(R) == 1000


async def test_a_pool_that_selects_nothing_advertises_nothing(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator,
        caplog: pytest.LogCaptureFixture) -> None:
    pools = (PoolConfig(selectors=Selectors(names=("mlx5_*",), drivers=("irdma",))),)
    async with running(settings_for(node, plugin_dir, pools=pools)) as d:
        await kubelet.wait_for(lambda: kubelet.registrations(R) == 1)
        await d.health.refresh()
        assert kubelet.capacity(R) == 0 and kubelet.allocatable(R) == 0
        assert d.runtimes[0].selected_hca_count == 0
        said = [r.getMessage() for r in caplog.records if "selects no HCA" in r.getMessage()]
        assert len(said) == 1
        assert "drivers=['irdma']" in said[0] and "names=" not in said[0]


async def test_why_a_pool_is_empty_on_an_empty_node(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    empty = SimNode(tmp_path / "empty")
    inventory = discover_node(str(empty.sysfs_root), str(empty.dev_root))
    runtime = PoolRuntime(PoolConfig())
    await runtime.update(inventory)
    assert runtime.state.devices == ()
    assert any("the node has no RDMA HCA" in r.getMessage() for r in caplog.records)


async def test_an_hca_back_under_a_new_name_is_not_missing() -> None:
    from dataclasses import replace

    from test_pool import gpu_hcas, inv

    hcas = gpu_hcas()
    runtime = PoolRuntime(PoolConfig())
    await runtime.update(inv(*hcas))
    await runtime.update(inv(*hcas[1:]))
    assert runtime.missing_hcas == ("mlx5_0",)
    # A driver reload may rename it; the PCI address says it is the same device.
    await runtime.update(inv(replace(hcas[0], name="mlx5_9"), *hcas[1:]))
    assert runtime.missing_hcas == ()
    assert all(d.healthy for d in runtime.state.devices)


async def test_a_vanished_hca_sharing_a_pci_address_stays_missing() -> None:
    from test_pool import gpu_hcas, hca, inv

    hcas = gpu_hcas()
    bond = hca("mlx5_bond_0", 9, pci=hcas[0].pci_address)
    runtime = PoolRuntime(PoolConfig())
    await runtime.update(inv(*hcas, bond))
    await runtime.update(inv(*hcas))
    # mlx5_0 holds that address but was always there: the bond has not come back.
    assert runtime.missing_hcas == ("mlx5_bond_0",)
