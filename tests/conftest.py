"""Shared fixtures: simulated nodes written under each test's tmp_path, a kubelet emulator."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    """The GPU node with small GID tables, so a daemon's start-up discovery stays cheap."""
    return sim.gpu_node(tmp_path / "node", gid_table_size=8)


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    """An empty device-plugins directory, as the kubelet keeps it."""
    d = tmp_path / "dp"
    d.mkdir()
    return d


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[KubeletEmulator]:
    """A running kubelet emulator on ``plugin_dir``."""
    k = KubeletEmulator(plugin_dir)
    await k.start()
    yield k
    stopping = asyncio.ensure_future(k.stop())
    done, _ = await asyncio.wait({stopping}, timeout=20.0)
    if not done:
        # Say where it is stuck before the run's timeout ends it without a word.
        for task in asyncio.all_tasks():
            task.print_stack(file=sys.stderr)
        raise AssertionError("the kubelet emulator did not stop within 20 s (stacks above)")
    stopping.result()


@pytest.fixture
def gpu_node(tmp_path: Path) -> SimNode:
    """8 RoCE v2 HCAs mlx5_0..mlx5_7 (IPv4) plus the bonded mlx5_bond_0."""
    return sim.gpu_node(tmp_path / "gpu")


@pytest.fixture
def gpu_node_ipv6(tmp_path: Path) -> SimNode:
    """The GPU node with global IPv6 GIDs as well (non-hostNetwork RDMA can work)."""
    return sim.gpu_node(tmp_path / "gpu6", ipv6=True)


@pytest.fixture
def ib_node(tmp_path: Path) -> SimNode:
    """One two-port InfiniBand HCA with umad and issm per port."""
    return sim.infiniband_node(tmp_path / "ib")


@pytest.fixture
def erdma_node(tmp_path: Path) -> SimNode:
    """Two eRDMA HCAs with unknown NUMA node."""
    return sim.erdma_node(tmp_path / "erdma")


@pytest.fixture
def soft_roce_node(tmp_path: Path) -> SimNode:
    """rxe0 on eth0 and siw0 on eth1, neither with a PCI parent."""
    return sim.soft_roce_node(tmp_path / "soft", siw=True)
