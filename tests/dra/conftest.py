"""A DRA stage per test: a small simulated GPU node, the fake API server, the kubelet
emulator and the driver, all over real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rdma_hca.devkit.dra.apiserver import FakeApiServer
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.sim import nodes as sim


@pytest.fixture
def dra_node(tmp_path: Path) -> sim.SimNode:
    """mlx5_0..mlx5_3 on two NUMA nodes, plus the bonded mlx5_bond_0."""
    return sim.gpu_node(tmp_path / "node", hcas=4, gid_table_size=8)


@pytest.fixture
def api() -> AsyncIterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
async def stage(dra_node: sim.SimNode, tmp_path: Path,
                api: FakeApiServer) -> AsyncIterator[DraStage]:
    async with DraStage(dra_node, tmp_path / "stage", api=api) as s:
        assert await s.registered(), s.kubelet and s.kubelet.events.refused
        assert await s.until(lambda: bool(s.devices()))
        yield s
