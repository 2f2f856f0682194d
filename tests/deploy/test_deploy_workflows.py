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


def _commands(text: str, program: str) -> list[str]:
    """Every `program ...` command in the fenced code blocks of a page, continuation lines
    joined."""
    out: list[str] = []
    blocks = text.split("```")[1::2]
    for block in blocks:
        joined = block.replace("\\\n", " ")
        out += [" ".join(line.split()) for line in joined.splitlines()
                if line.strip().lstrip("$ ").startswith(program)]
    return out


def test_release_pushes_the_chart_next_to_the_image() -> None:
    jobs = release()["jobs"]
    chart = jobs["chart"]
    assert chart["needs"] == ["test", "image"]
    assert chart["permissions"] == {"contents": "read", "packages": "write"}
    uses = {str(s.get("uses", "")).split("@")[0] for s in chart["steps"]}
    assert "azure/setup-helm" in uses
    (push,) = [s for s in chart["steps"] if "helm push" in str(s.get("run", ""))]
    script = push["run"]
    assert "helm package deploy/helm/ack-rdma-device-plugin --destination dist" in script
    assert "helm registry login ghcr.io" in script and "--password-stdin" in script
    assert ('helm push "dist/ack-rdma-device-plugin-${version}.tgz" '
            '"oci://ghcr.io/${owner}/charts"') in script
    # The image job pushes to the same owner's registry.
    (meta,) = [s for s in jobs["image"]["steps"] if s.get("id") == "meta"]
    assert meta["with"]["images"] == "ghcr.io/${{ github.repository_owner }}/rdma-hca"
    # A tag whose version the chart does not carry stops the release before anything is pushed.
    (check,) = [s for s in jobs["test"]["steps"] if "Chart.yaml" in str(s.get("run", ""))]
    assert 'grep -qx "version: ${version}" deploy/helm/ack-rdma-device-plugin/Chart.yaml' \
        in check["run"]


def test_the_package_the_release_pushes_installs(helm: Path, tmp_path: Path) -> None:
    from deploy_support import CHART, run_helm

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    packaged = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert packaged.returncode == 0, packaged.stderr
    tgz = tmp_path / f"ack-rdma-device-plugin-{chart['version']}.tgz"
    assert tgz.is_file()
    result = run_helm(helm, "template", "ack-rdma-device-plugin", str(tgz), "-n", "kube-system",
                      "--set", "image.repository=ghcr.io/acme/rdma-hca")
    assert result.returncode == 0, result.stderr
    (ds,) = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "DaemonSet"]
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/acme/rdma-hca:{chart['appVersion']}"


def test_the_readme_installs_from_the_published_chart_with_the_image_set() -> None:
    readme = (REPO / "README.md").read_text()
    installs = _commands(readme, "helm install")
    assert installs, "the README has no helm install"
    for command in installs:
        assert "oci://ghcr.io/<owner>/charts/ack-rdma-device-plugin" in command, command
        assert "--set image.repository=ghcr.io/<owner>/rdma-hca" in command, command
    install_doc = (REPO / "docs" / "install.md").read_text()
    assert any("oci://ghcr.io/<owner>/charts/ack-rdma-device-plugin" in c
               and "--set image.repository=" in c for c in _commands(install_doc, "helm install"))


def test_every_helm_upgrade_in_the_docs_keeps_the_installed_values() -> None:
    # Without --reuse-values an upgrade resets every value not given again (the image too).
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    upgrades = {page.name: _commands(page.read_text(), "helm upgrade") for page in pages}
    assert upgrades["dra.md"], "docs/dra.md has no helm upgrade"
    for page, commands in upgrades.items():
        for command in commands:
            assert "--reuse-values" in command, f"{page}: {command}"


def test_the_readme_names_npm_among_what_make_test_needs() -> None:
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Try it")
    section = readme[start:readme.index("```", start)]
    assert "npm" in section and "make test" in section
