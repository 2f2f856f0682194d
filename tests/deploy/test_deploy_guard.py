"""The install guard against the provider's own DaemonSet, and NOTES.txt per cluster.

`helm template` never reaches a cluster, so `lookup` returns an empty map there and the guard
cannot fire. The guard's decision is therefore a named template taking what `lookup` returned;
the chart calls it with the real `lookup`, and these tests call it from a throw-away parent
chart (see `parent_chart`) with the DaemonSet a cluster would hold, through the real helm.
`helm install --dry-run=server` would run the real `lookup`, but needs an API server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import CHART, VAP_API, parent_chart, run_helm

GUARD_CALL = """\
{{- include "rdma.guardForeignDaemonSet" (dict "existing" .Values.existing
    "release" .Release.Name "namespace" .Release.Namespace) -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: guard-passed
"""

FAIL = ("DaemonSet kube-system/ack-rdma-dp-ds exists and is not managed by this release "
        "(the provider's ack-rdma-device-plugin?): disable the provider's component first")


def providers_daemonset(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "ack-rdma-dp-ds", "namespace": "kube-system",
                            "labels": {"app": "ack-rdma-dp"}}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta,
            "spec": {"selector": {"matchLabels": {"app": "ack-rdma-dp"}}}}


def ours(release: str = "ack-rdma-device-plugin", namespace: str = "kube-system") -> dict[str, str]:
    return {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace}


def run_guard(helm: Path, tmp_path: Path, existing: dict[str, Any] | None,
              release: str = "ack-rdma-device-plugin") -> tuple[int, str]:
    chart = parent_chart(tmp_path, GUARD_CALL)
    values = tmp_path / "existing.yaml"
    values.write_text(yaml.safe_dump({"existing": existing or {}}))
    result = run_helm(helm, "template", release, str(chart), "-n", "kube-system",
                      "-f", str(values))
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize(
    "existing",
    [
        providers_daemonset(),  # the provider's add-on: no Helm annotations at all
        providers_daemonset({"deprecated.daemonset.template.generation": "3"}),
        providers_daemonset(ours(release="someone-else")),
        providers_daemonset(ours(namespace="default")),
    ],
    ids=["provider", "other-annotations", "other-release", "other-namespace"],
)
def test_guard_stops_next_to_a_daemonset_this_release_does_not_manage(
        helm: Path, tmp_path: Path, existing: dict[str, Any]) -> None:
    status, output = run_guard(helm, tmp_path, existing)
    assert status != 0
    (line,) = [ln for ln in output.splitlines() if "ack-rdma-dp-ds exists" in ln]
    assert FAIL in line
    assert "Replacing the provider's ack-rdma-device-plugin" in line


@pytest.mark.parametrize("existing", [None, providers_daemonset(ours())],
                         ids=["none", "our-own-upgrade"])
def test_guard_lets_a_fresh_install_and_an_upgrade_through(
        helm: Path, tmp_path: Path, existing: dict[str, Any] | None) -> None:
    status, output = run_guard(helm, tmp_path, existing)
    assert status == 0, output
    assert "name: guard-passed" in output


def test_the_daemonset_template_calls_the_guard_with_lookup() -> None:
    text = (CHART / "templates" / "daemonset.yaml").read_text()
    assert ('include "rdma.guardForeignDaemonSet" (dict "existing" (lookup "apps/v1" '
            '"DaemonSet" "kube-system" "ack-rdma-dp-ds")') in text


def test_install_doc_has_the_replacement_section() -> None:
    doc = (CHART.parents[2] / "docs" / "install.md").read_text()
    assert "## Replacing the provider's ack-rdma-device-plugin" in doc


NOTES_CALL = """\
notes: {{ include "rdma.notes" (dict "Values" (index .Values "ack-rdma-device-plugin")
    "Capabilities" .Capabilities "Release" .Release) | toJson }}
"""


def rendered_notes(helm: Path, tmp_path: Path, *args: str) -> str:
    chart = parent_chart(tmp_path, NOTES_CALL)
    result = run_helm(helm, "template", "ack-rdma-device-plugin", str(chart), "-n",
                      "kube-system", "--show-only", "templates/probe.yaml", *args)
    assert result.returncode == 0, result.stderr
    notes: str = yaml.safe_load(result.stdout)["notes"]
    return " ".join(notes.split())


def test_notes_on_a_cluster_with_admission_policies(helm: Path, tmp_path: Path) -> None:
    text = rendered_notes(helm, tmp_path, "--api-versions", VAP_API)
    assert "ack-rdma-dp-require-hostnetwork refuses other pods" in text
    assert "NO admission policy" not in text


def test_notes_on_a_cluster_without_them(helm: Path, tmp_path: Path) -> None:
    text = rendered_notes(helm, tmp_path, "--kube-version", "1.28.0")
    assert "installed NO admission policy" in text
    assert "its RDMA fails at run time" in text
    switched = rendered_notes(helm, tmp_path / "b", "--set",
                              "ack-rdma-device-plugin.nonHostNetwork.enabled=true")
    assert "No IPC_LOCK warning policy is installed" in switched


def test_install_prints_the_notes(helm: Path) -> None:
    # The real NOTES.txt through `helm install` (a client-side dry run serves no policy kind).
    result = run_helm(helm, "install", "ack-rdma-device-plugin", str(CHART), "--dry-run=client",
                      "-n", "kube-system", "--set", "metrics.podMonitor.enabled=true",
                      "--set", "metrics.prometheusRule.enabled=true")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split("NOTES:", 1)[1].split())
    assert "installed NO admission policy" in text
    assert "no PodMonitor was installed" in text
    assert "no alerts were installed" in text
    assert "rdma-hca doctor --node" in text


def test_notes_warn_while_the_image_is_the_unpublished_placeholder(helm: Path,
                                                                   tmp_path: Path) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    placeholder = values["image"]["repository"]
    assert ('{{- define "rdma.unpublishedImage" -}}' + placeholder + "{{- end -}}") in helpers
    text = rendered_notes(helm, tmp_path / "default")
    assert (f"WARNING: image.repository is still {placeholder}, the chart's placeholder: no "
            "image is published there, so the plugin pods cannot pull it (ImagePullBackOff)"
            ) in text
    assert ("helm upgrade ack-rdma-device-plugin <chart> -n kube-system --reuse-values "
            "--set image.repository=<registry>/rdma-hca") in text
    set_ = rendered_notes(helm, tmp_path / "set", "--set",
                          "ack-rdma-device-plugin.image.repository=ghcr.io/acme/rdma-hca")
    assert "WARNING: image.repository" not in set_
    assert "rdma-hca is installed as DaemonSet ack-rdma-dp-ds" in set_


def test_install_notes_warn_of_the_placeholder_image_and_not_of_a_real_one(helm: Path) -> None:
    def notes(*args: str) -> str:
        result = run_helm(helm, "install", "ack-rdma-device-plugin", str(CHART),
                          "--dry-run=client", "-n", "kube-system", *args)
        assert result.returncode == 0, result.stderr
        return " ".join(result.stdout.split("NOTES:", 1)[1].split())

    assert "WARNING: image.repository is still" in notes()
    assert "WARNING: image.repository" not in notes(
        "--set", "image.repository=registry.example.com/rdma-hca")
