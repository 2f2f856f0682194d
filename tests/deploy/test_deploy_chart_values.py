"""The chart's newer values, what it renders on older clusters, and its metadata."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_support import CHART, VAP_API, RenderFn, run_helm, set_args
from test_deploy_chart import container, one, pod_spec

NFD_AVAILABLE = "feature.node.kubernetes.io/rdma.available"


def kinds(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objs)


def test_image_digest_wins_over_the_tag(render: RenderFn) -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    c = container(render({"image.digest": digest, "image.tag": "9.9.9",
                          "image.repository": "registry.example.com/rdma-hca"}))
    assert c["image"] == f"registry.example.com/rdma-hca@{digest}"


def test_pull_secrets_annotations_and_labels_reach_the_pod(render: RenderFn) -> None:
    objs = render({"imagePullSecrets[0].name": "regcred", "podAnnotations.team": "ml",
                   "podLabels.team": "ml", "podLabels.app\\.kubernetes\\.io/name": "other"})
    spec = pod_spec(objs)
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    meta = one(objs, "DaemonSet")["spec"]["template"]["metadata"]
    assert meta["annotations"]["team"] == "ml"
    assert "checksum/config" in meta["annotations"]
    assert meta["labels"]["team"] == "ml"
    # A pod label may never change the DaemonSet's selector labels.
    assert meta["labels"]["app.kubernetes.io/name"] == "ack-rdma-device-plugin"
    assert "imagePullSecrets" not in pod_spec(render())


def test_update_strategy_is_a_value(render: RenderFn) -> None:
    ds = one(render({"updateStrategy.type": "OnDelete", "updateStrategy.rollingUpdate": "null"}),
             "DaemonSet")
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    ds = one(render({"updateStrategy.rollingUpdate.maxUnavailable": "10%"}), "DaemonSet")
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}


def test_empty_affinity_keeps_the_default_and_null_removes_it(
        render: RenderFn, helm: Path, tmp_path: Path) -> None:
    # What the values comment says: Helm merges maps, so {} changes nothing; null deletes.
    values = tmp_path / "values.yaml"
    values.write_text("affinity: {}\n")
    result = run_helm(helm, "template", "x", str(CHART), "-f", str(values))
    assert result.returncode == 0, result.stderr
    ds = next(d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "DaemonSet")
    assert NFD_AVAILABLE in yaml.safe_dump(ds["spec"]["template"]["spec"]["affinity"])
    assert "affinity" not in pod_spec(render({"affinity": "null"}))
    comment = (CHART / "values.yaml").read_text()
    assert "`affinity: {}` keeps this default" in comment
    assert "Set `affinity: {}` to run on every node" not in comment


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"image.digest": "sha256:abc"}, "digest"),
        ({"imagePullSecrets[0].nam": "x"}, "nam"),
        ({"updateStrategy.type": "Recreate"}, "type"),
        ({"metrics.bindAddress": "[::1]"}, "bindAddress"),
        ({"metrics.podMonitor.interval": "30"}, "interval"),
        ({"metrics.prometheusRule.enable": "true"}, "enable"),
    ],
)
def test_schema_rejects_bad_new_values(helm: Path, values: dict[str, str],
                                       complaint: str) -> None:
    result = run_helm(helm, "template", "x", str(CHART), *set_args(values))
    assert result.returncode != 0
    assert complaint in result.stderr, result.stderr


def test_policies_render_only_where_the_api_server_serves_them(render: RenderFn) -> None:
    with_vap = kinds(render(api_versions=(VAP_API,)))
    assert with_vap.count("ValidatingAdmissionPolicy") == 2
    without = render(api_versions=())
    assert kinds(without) == ["ConfigMap", "DaemonSet", "ServiceAccount"]


@pytest.mark.parametrize("version", ["1.26.0", "1.29.0"])
def test_installs_on_clusters_without_admission_policies(helm: Path, render: RenderFn,
                                                         version: str) -> None:
    # An old cluster: helm takes the version and the served kinds from the API server.
    objs = render(api_versions=(), kube_version=version)
    assert kinds(objs) == ["ConfigMap", "DaemonSet", "ServiceAccount"]
    for obj in objs:
        kubernetes_validate.validate(obj, "1.26.0", strict=True)
    too_old = run_helm(helm, "template", "x", str(CHART), "--kube-version", "1.25.9")
    assert too_old.returncode != 0
    assert "kubeVersion" in too_old.stderr or "incompatible" in too_old.stderr


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.26.0-0"
    assert chart["home"].startswith("https://")
    assert chart["sources"] and all(s.startswith("https://") for s in chart["sources"])
    assert chart["maintainers"] and all(m["name"] for m in chart["maintainers"])


def leaf_values(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted value names and defaults, down to the objects users set key by key."""
    free_form = {"selectors", "nodeSelector", "affinity", "tolerations", "resources",
                 "podAnnotations", "podLabels", "labels", "updateStrategy"}
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = prefix + key
        if isinstance(value, dict) and value and key not in free_form:
            out.update(leaf_values(value, name + "."))
        else:
            out[name] = value
    return out


def readme_rows() -> dict[str, str]:
    """`name` -> default cell of the chart README's values table."""
    rows: dict[str, str] = {}
    for line in (CHART / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def test_chart_readme_lists_every_value_with_its_default() -> None:
    values = leaf_values(yaml.safe_load((CHART / "values.yaml").read_text()))
    rows = readme_rows()
    assert sorted(values) == sorted(rows), "the README's table and values.yaml differ"
    for name, default in values.items():
        shown = yaml.safe_load(rows[name].strip("`")) if rows[name] != "" else None
        assert shown == default, f"{name}: README says {rows[name]}, values.yaml {default!r}"


def test_the_readme_and_the_chart_archive(helm: Path, tmp_path: Path) -> None:
    result = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (archive,) = tmp_path.glob("ack-rdma-device-plugin-*.tgz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    base = "ack-rdma-device-plugin/"
    assert {base + "README.md", base + "files/alerts.yaml", base + "files/dashboard.json",
            base + "values.schema.json"} <= names


def test_global_values_are_accepted_so_the_chart_can_be_a_subchart(helm: Path) -> None:
    # Helm hands every subchart its parent's `global:` values; a strict schema must allow them.
    result = run_helm(helm, "template", "x", str(CHART), "--set", "global.imageRegistry=r.io")
    assert result.returncode == 0, result.stderr
