"""Fixtures for the deployment tests: the real `helm` binary and a chart renderer."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import (
    CHART,
    CURRENT_CLUSTER_APIS,
    RenderFn,
    ensure_helm,
    run_helm,
    set_args,
)


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The helm binary, with its config, cache and data dirs kept out of the home dir."""
    binary = ensure_helm()
    home = tmp_path_factory.mktemp("helm-home")
    keys = ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")
    saved = {key: os.environ.get(key) for key in keys}
    for key in saved:
        os.environ[key] = str(home / key.lower())
    yield binary
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def render(helm: Path) -> RenderFn:
    """Render the chart into kube-system and return its objects.

    `render({"mode": "exclusive"})` passes `--set mode=exclusive`. `api_versions` are the
    kinds the simulated API server serves (helm's `--api-versions`; by default those of a
    current cluster, whose discovery helm reads on install), `kube_version` its version.
    """

    rendered: dict[tuple[Any, ...], str] = {}

    def _render(values: Mapping[str, str] | None = None, *,
                api_versions: tuple[str, ...] = CURRENT_CLUSTER_APIS,
                kube_version: str | None = None) -> list[dict[str, Any]]:
        key = (tuple(sorted((values or {}).items())), api_versions, kube_version)
        if key not in rendered:
            extra: list[str] = []
            for api in api_versions:
                extra += ["--api-versions", api]
            if kube_version is not None:
                extra += ["--kube-version", kube_version]
            result = run_helm(
                helm, "template", "ack-rdma-device-plugin", str(CHART),
                "--namespace", "kube-system", *set_args(values or {}), *extra,
            )
            assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
            rendered[key] = result.stdout
        # Parsed afresh each time, so a test may change what it gets.
        return [doc for doc in yaml.safe_load_all(rendered[key]) if doc]

    return _render
