"""A DRA stage per test: a small simulated GPU node, the fake API server, the kubelet
emulator and the driver, all over real sockets."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

# The driver builds its API client within the read deadline, imports included: a test that
# shortens the deadline (to see a hung API server cost one) must not find the HTTP stack's
# first import in it, as the first DRA test of a fresh worker process would on a busy machine.
import httpx2  # noqa: F401
import lightkube.config.client_adapter  # noqa: F401
import pytest
import yaml

from rdma_hca.daemon.dra.kubeapi import SliceApi
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode

# The slice publisher's spacing in these tests: the product's 2.5 s only delays the
# write that follows a start, and the spacing has tests of its own (with their clock, or
# a spacing they set). A test that means to count writes under the product's spacing
# passes slice_spacing to its stage.
SLICE_SPACING = 0.2


@pytest.fixture(autouse=True)
def _short_slice_spacing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DraStage, "default_slice_spacing", SLICE_SPACING)


@pytest.fixture
def dra_node(tmp_path: Path) -> SimNode:
    """mlx5_0..mlx5_3 on two NUMA nodes, plus the bonded mlx5_bond_0."""
    return sim.gpu_node(tmp_path / "node", hcas=4, gid_table_size=8)


@pytest.fixture
def api() -> AsyncIterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
async def client(api: FakeApiServer, tmp_path: Path) -> AsyncIterator[SliceApi]:
    """The driver's own API layer, connected to ``api``."""
    c = await SliceApi.connect(str(api.write_kubeconfig(tmp_path / "kc")), 5.0)
    yield c
    await c.close()


@pytest.fixture
async def stage(dra_node: SimNode, tmp_path: Path,
                api: FakeApiServer) -> AsyncIterator[DraStage]:
    async with DraStage(dra_node, tmp_path / "stage", api=api) as s:
        assert await s.registered(), s.kubelet and s.kubelet.events.refused
        assert await s.until(lambda: bool(s.devices()))
        yield s


# --- the real helm, through the deployment tests' helpers --------------------------------

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deploy"))
from deploy_support import CHART, RenderFn, ensure_helm, run_helm, set_args  # noqa: E402


@pytest.fixture(scope="session")
def dra_render(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RenderFn]:
    """Render the chart into kube-system: ``dra_render({"dra.enabled": "true"})``."""
    binary = ensure_helm()
    home = tmp_path_factory.mktemp("helm-home")
    env = {key: str(home / key.lower())
           for key in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)

    def render(values: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        result = run_helm(binary, "template", "ack-rdma-device-plugin", str(CHART),
                          "--namespace", "kube-system", *set_args(values or {}))
        assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]

    yield render
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
