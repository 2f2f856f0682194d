"""Shared fixtures: simulated nodes written under each test's tmp_path, a kubelet emulator."""

from __future__ import annotations

import ast
import asyncio
import gc
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode


def _parse_without_gc(parse: Callable[..., Any]) -> Callable[..., Any]:
    """``ast.parse`` with the garbage collector held off while it runs.

    Before 3.11.8 every ``ast.parse`` of the process shares one recursion counter while it
    builds the tree's objects (CPython gh-106905). An allocation there can start a
    collection, a finalizer then runs Python code, the GIL passes to another thread, and an
    ``ast.parse`` over there (3.11's traceback formatting calls one per frame) leaves the
    counter off: the first fails with "SystemError: AST constructor recursion depth
    mismatch". pytest parses on the main thread (assertion rewriting of modules imported
    late, its own tracebacks) while the tests' threads format theirs. With no collection
    inside, a parse runs without giving up the GIL, so no other can come between.
    """
    lock = threading.RLock()  # a finalizer run by a refcount drop may parse too
    held = [0, False]  # parses under way, and whether the collector was on before them

    def guarded(*args: Any, **kwargs: Any) -> Any:
        with lock:
            if held[0] == 0:
                held[1] = gc.isenabled()
                gc.disable()
            held[0] += 1
        try:
            return parse(*args, **kwargs)
        finally:
            with lock:
                held[0] -= 1
                if held[0] == 0 and held[1]:
                    gc.enable()

    return guarded


if sys.version_info < (3, 11, 8):
    ast.parse = _parse_without_gc(ast.parse)


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
