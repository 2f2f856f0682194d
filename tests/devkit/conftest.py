"""The fake API server and a client of it, for the devkit's tests of that server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.kube.client import ApiClient
from rdma_hca.kube.credentials import load_credentials


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
async def client(api: FakeApiServer, tmp_path: Path) -> AsyncIterator[ApiClient]:
    creds = load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")),
                             context=None, env={}, home=tmp_path)
    c = ApiClient(creds)
    yield c
    await c.close()
