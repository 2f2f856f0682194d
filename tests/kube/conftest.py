"""The strict fake API server (holding Node n1) and credentials for it, for the client's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.kube.credentials import Credentials, load_credentials


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node("n1")
        yield server


@pytest.fixture
def creds(api: FakeApiServer, tmp_path: Path) -> Credentials:
    """A kubeconfig for ``api`` with its token, as ``kubectl config view --raw`` prints it."""
    return load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")),
                            context=None, env={}, home=tmp_path)
