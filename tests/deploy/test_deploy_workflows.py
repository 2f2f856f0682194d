"""GitHub workflows: actionlint-clean, and the release builds what docs/install.md promises."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import REPO

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.y*ml"))


def actionlint() -> str:
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent))
    assert found, "actionlint is missing: `make venv` installs it with the dev extra"
    return found


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=[w.name for w in WORKFLOWS])
def test_workflow_is_actionlint_clean(workflow: Path) -> None:
    binary = actionlint()
    result = subprocess.run([binary, "-no-color", str(workflow)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_finds_problems(tmp_path: Path) -> None:
    binary = actionlint()
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
                   "      - run: echo ${{ matrix.missing }}\n")
    result = subprocess.run([binary, "-no-color", str(bad)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode != 0


def release() -> dict[Any, Any]:
    loaded: dict[Any, Any] = yaml.safe_load((REPO / ".github/workflows/release.yml").read_text())
    return loaded


def test_release_runs_on_version_tags_only() -> None:
    # PyYAML reads the key `on` as True.
    assert release()[True] == {"push": {"tags": ["v*.*.*"]}}


def test_release_builds_both_architectures_with_an_sbom() -> None:
    jobs = release()["jobs"]
    assert jobs["image"]["needs"] == "test"
    (build,) = [s for s in jobs["image"]["steps"]
                if str(s.get("uses", "")).startswith("docker/build-push-action@")]
    options = build["with"]
    assert set(options["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert options["sbom"] is True and options["push"] is True
    assert options["context"] == "."
    uses = {str(s.get("uses", "")).split("@")[0] for s in jobs["image"]["steps"]}
    assert {"docker/setup-qemu-action", "docker/setup-buildx-action",
            "docker/login-action"} <= uses
    assert jobs["image"]["permissions"]["packages"] == "write"
    assert release()["permissions"] == {"contents": "read"}
