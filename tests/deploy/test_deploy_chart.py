"""The Helm chart, rendered by the real helm and checked against the Kubernetes schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_support import CHART, RenderFn, run_helm, set_args

# The oldest Kubernetes with the admission policies (admissionregistration.k8s.io/v1) and
# the newest the installed kubernetes-validate knows; 1.26 (no policies) is checked apart.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())

VARIANTS: dict[str, dict[str, str]] = {
    "defaults": {},
    "non-hostnetwork": {"nonHostNetwork.enabled": "true"},
    "custom-resource": {"resourceName": "example.com/rdma"},
    "k0s-kubelet": {"kubeletDir": "/var/lib/k0s/kubelet"},
    "exclusive": {"mode": "exclusive"},
    "cdi": {"cdi.enabled": "true"},
    "no-metrics": {"metrics.enabled": "false"},
    "selectors": {"selectors.linkLayers[0]": "Ethernet", "selectors.names[0]": "mlx5_*"},
    "pod-extras": {"imagePullSecrets[0].name": "regcred", "podAnnotations.team": "ml",
                   "podLabels.team": "ml", "updateStrategy.type": "OnDelete",
                   "metrics.bindAddress": "::", "metrics.grafanaDashboard.enabled": "true",
                   "image.digest": "sha256:" + "ab" * 32},
}



def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def pod_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objs, "DaemonSet", "ack-rdma-dp-ds")["spec"]["template"]["spec"]
    return spec


def container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod_spec(objs)["containers"]
    assert len(containers) == 1
    return containers[0]


def config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    data = one(objs, "ConfigMap", "ack-rdma-dp-config")["data"]
    parsed: dict[str, Any] = yaml.safe_load(data["config.yaml"])
    return parsed


def mounts(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container(objs)["volumeMounts"]}


def volumes(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec(objs)["volumes"]}


@pytest.mark.parametrize("values", [[], ["--set", "nonHostNetwork.enabled=true"]],
                         ids=["defaults", "non-hostnetwork"])
def test_lint_strict_passes(helm: Path, values: list[str]) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), *values)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_object_is_valid_kubernetes(render: RenderFn, variant: str) -> None:
    objs = render(VARIANTS[variant])
    assert {o["kind"] for o in objs} >= {"DaemonSet", "ConfigMap", "ServiceAccount"}
    for obj in objs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_strict_schema_validation_catches_a_typo(render: RenderFn) -> None:
    # Proves the check above can fail: a misspelt field must be refused.
    ds = one(render(), "DaemonSet")
    ds["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSIONS[0], strict=True)


def test_names_and_namespace_match_the_providers_component(render: RenderFn) -> None:
    objs = render()
    for obj in objs:
        if obj["kind"] in ("DaemonSet", "ConfigMap", "ServiceAccount"):
            assert obj["metadata"]["namespace"] == "kube-system"
    ds = one(objs, "DaemonSet")
    assert ds["metadata"]["name"] == "ack-rdma-dp-ds"
    assert one(objs, "ServiceAccount")["automountServiceAccountToken"] is False
    spec = pod_spec(objs)
    assert spec["serviceAccountName"] == one(objs, "ServiceAccount")["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is False
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_pod_has_least_privilege(render: RenderFn) -> None:
    objs = render()
    spec = pod_spec(objs)
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "hostPID" not in spec and "hostIPC" not in spec
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(objs)["securityContext"]
    assert sc["privileged"] is False
    assert sc["runAsUser"] == 0
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_scheduling_defaults(render: RenderFn) -> None:
    spec = pod_spec(render())
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["terminationGracePeriodSeconds"] <= 30
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    # The terms are ORed: NFD's vendor-neutral or Mellanox label, or the hand-set one.
    assert [t["matchExpressions"] for t in terms] == [
        [{"key": "feature.node.kubernetes.io/rdma.available", "operator": "In",
          "values": ["true"]}],
        [{"key": "feature.node.kubernetes.io/rdma.capable", "operator": "In",
          "values": ["true"]}],
        [{"key": "rdma.hca/enabled", "operator": "In", "values": ["true"]}],
    ]
    assert "nodeSelector" not in spec


def test_update_strategy_and_resources(render: RenderFn) -> None:
    ds = one(render(), "DaemonSet")
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    resources = ds["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "10m", "memory": "48Mi"}
    assert resources["limits"] == {"memory": "200Mi"}


def test_mounts_and_their_access(render: RenderFn) -> None:
    objs = render()
    m, v = mounts(objs), volumes(objs)
    assert m["device-plugins"]["mountPath"] == "/var/lib/kubelet/device-plugins"
    assert m["device-plugins"].get("readOnly", False) is False
    assert v["device-plugins"]["hostPath"] == {
        "path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    assert (m["host-sys"]["mountPath"], m["host-sys"]["readOnly"]) == ("/host/sys", True)
    assert v["host-sys"]["hostPath"]["path"] == "/sys"
    assert (m["host-dev"]["mountPath"], m["host-dev"]["readOnly"]) == ("/host/dev", True)
    assert v["host-dev"]["hostPath"]["path"] == "/dev"
    assert (m["config"]["mountPath"], m["config"]["readOnly"]) == ("/etc/rdma-hca", True)
    assert v["config"]["configMap"]["name"] == "ack-rdma-dp-config"
    assert "cdi-specs" not in m
    # Every mount but the plugin socket dir and the in-memory scratch dir is read-only.
    writable = {name for name, mount in m.items() if not mount.get("readOnly", False)}
    assert writable == {"device-plugins", "tmp"}
    assert v["tmp"]["emptyDir"]["medium"] == "Memory"


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def test_args_and_env_follow_the_daemons_contract(render: RenderFn) -> None:
    c = container(render())
    assert "command" not in c  # the image's ENTRYPOINT is `rdma-hca`
    assert c["args"] == ["serve"]
    # Variables, not flags: `kubectl exec <pod> -- rdma-hca doctor --node` sees them too.
    assert env_of(c) == {
        "RDMA_HCA_CONFIG": "/etc/rdma-hca/config.yaml",
        "RDMA_HCA_SYSFS_ROOT": "/host/sys",
        "RDMA_HCA_DEV_ROOT": "/host/dev",
        "RDMA_HCA_KUBELET_DIR": "/var/lib/kubelet/device-plugins",
    }
    assert c["image"] == "ghcr.io/rdma-hca/rdma-hca:0.1.0"


@pytest.mark.parametrize("kubelet_dir", ["/var/lib/k0s/kubelet", "/var/lib/k0s/kubelet/"])
def test_custom_kubelet_dir_moves_mount_and_flag_together(
        render: RenderFn, kubelet_dir: str) -> None:
    objs = render({"kubeletDir": kubelet_dir})
    want = "/var/lib/k0s/kubelet/device-plugins"
    assert env_of(container(objs))["RDMA_HCA_KUBELET_DIR"] == want
    assert mounts(objs)["device-plugins"]["mountPath"] == want
    assert volumes(objs)["device-plugins"]["hostPath"]["path"] == want


def test_probes_use_the_metrics_port(render: RenderFn) -> None:
    c = container(render({"metrics.port": "9500"}))
    assert c["ports"] == [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_metrics_off_means_no_http_probes(render: RenderFn) -> None:
    objs = render({"metrics.enabled": "false"})
    c = container(objs)
    assert not {"ports", "livenessProbe", "readinessProbe"} & c.keys()
    assert config(objs)["metricsAddress"] == ""


def test_default_config_content(render: RenderFn) -> None:
    assert config(render()) == {
        "resourceName": "rdma/hca",
        "rdmaHcaMax": 1000,
        "mode": "shared",
        "unhealthyWhen": "any",
        "selectors": {},
        "nonHostNetwork": False,
        "flapHoldSeconds": 30,
        "ncclEnv": "auto",
        "metricsAddress": ":9478",
        "logFormat": "text",
        "logLevel": "info",
        "cdi": {"enabled": False, "specDir": "/var/run/cdi"},
    }


def test_custom_values_reach_the_config(render: RenderFn, tmp_path: Path) -> None:
    objs = render({
        "resourceName": "example.com/rdma", "rdmaHcaMax": "64", "mode": "exclusive",
        "unhealthyWhen": "all", "nonHostNetwork.enabled": "true", "ncclEnv": "true",
        "logFormat": "json", "logLevel": "debug", "metrics.port": "9100",
        "selectors.linkLayers[0]": "InfiniBand", "selectors.names[0]": "mlx5_1",
        "selectors.pciVendors[0]": "0x15b3", "flapHoldSeconds": "5",
    })
    cfg = config(objs)
    assert cfg["flapHoldSeconds"] == 5
    assert cfg["resourceName"] == "example.com/rdma"
    assert cfg["rdmaHcaMax"] == 64
    assert cfg["mode"] == "exclusive"
    assert cfg["unhealthyWhen"] == "all"
    assert cfg["nonHostNetwork"] is True
    assert cfg["ncclEnv"] is True
    # A string stays a string in the config file: YAML would read a bare off as false.
    assert config(render({"ncclEnv": "off"}))["ncclEnv"] == "off"
    assert (cfg["logFormat"], cfg["logLevel"]) == ("json", "debug")
    assert cfg["metricsAddress"] == ":9100"
    assert cfg["selectors"] == {
        "linkLayers": ["InfiniBand"], "names": ["mlx5_1"], "pciVendors": ["0x15b3"]}


def test_cdi_on_mounts_the_spec_dir_read_write(render: RenderFn) -> None:
    objs = render({"cdi.enabled": "true", "cdi.specDir": "/etc/cdi"})
    assert config(objs)["cdi"] == {"enabled": True, "specDir": "/etc/cdi"}
    mount = mounts(objs)["cdi-specs"]
    assert mount["mountPath"] == "/etc/cdi"
    assert mount.get("readOnly", False) is False
    assert volumes(objs)["cdi-specs"]["hostPath"]["path"] == "/etc/cdi"


def test_checksum_annotation_follows_the_config(render: RenderFn) -> None:
    def checksum(values: dict[str, str]) -> str:
        ds = one(render(values), "DaemonSet")
        value: str = ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    base = checksum({})
    assert len(base) == 64
    assert checksum({}) == base
    assert checksum({"rdmaHcaMax": "999"}) != base
    assert checksum({"mode": "exclusive"}) != base
    # Values that do not reach the config must not restart every pod.
    assert checksum({"image.tag": "0.2.0"}) == base


def policy_names(objs: list[dict[str, Any]], kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in objs if o["kind"] == kind}


def test_deny_policy_present_only_while_switch_is_off(render: RenderFn) -> None:
    deny = "ack-rdma-dp-require-hostnetwork"
    warn = "ack-rdma-dp-warn-ipc-lock"
    off = render()
    assert policy_names(off, "ValidatingAdmissionPolicy") == {deny, warn}
    assert policy_names(off, "ValidatingAdmissionPolicyBinding") == {deny, warn}
    bindings = {o["spec"]["policyName"]: o["spec"]["validationActions"]
                for o in off if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert bindings == {deny: ["Deny"], warn: ["Warn"]}
    on = render({"nonHostNetwork.enabled": "true"})
    # The IPC_LOCK warning is useful whatever the network mode.
    assert policy_names(on, "ValidatingAdmissionPolicy") == {warn}
    assert policy_names(on, "ValidatingAdmissionPolicyBinding") == {warn}


@pytest.mark.parametrize("name", ["rdma/hca", "example.com/rdma"])
def test_resource_name_is_in_the_cel(render: RenderFn, name: str) -> None:
    for policy in (o for o in render({"resourceName": name})
                   if o["kind"] == "ValidatingAdmissionPolicy"):
        variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
        assert variables["resourceNames"] == f"['{name}']"
        assert name in " ".join(v["message"] for v in policy["spec"]["validations"])


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"rdmaHcaMax": "0"}, "rdmaHcaMax"),
        ({"rdmaHcaMax": "100001"}, "rdmaHcaMax"),
        ({"mode": "private"}, "mode"),
        ({"unhealthyWhen": "some"}, "unhealthyWhen"),
        ({"resourceName": "hca"}, "resourceName"),
        ({"resourceName": "kubernetes.io/hca"}, "reserved for built-in resources"),
        ({"resourceName": "requests.example.com/hca"}, "reserved for quotas"),
        ({"resourceName": "Example.com/rdma"}, "resourceName"),
        ({"resourceName": "example.com/'x"}, "resourceName"),
        ({"kubeletDir": "var/lib/kubelet"}, "kubeletDir"),
        ({"selectors.linkLayers[0]": "ethernet"}, "linkLayers"),
        ({"selectors.pciVendor[0]": "0x15b3"}, "pciVendor"),
        ({"metrics.port": "70000"}, "port"),
        ({"logFormat": "xml"}, "logFormat"),
        ({"nonHostNetwork.enabled": "yes"}, "enabled"),
        ({"image.pullPolicy": "Sometimes"}, "pullPolicy"),
        ({"unknownKey": "1"}, "unknownKey"),
    ],
)
def test_schema_rejects_bad_values_naming_the_key(
        helm: Path, values: dict[str, str], complaint: str) -> None:
    result = run_helm(helm, "template", "x", str(CHART), *set_args(values))
    assert result.returncode != 0
    assert complaint in result.stderr, result.stderr


def test_pools_reach_the_daemon_as_its_pools(render: RenderFn, tmp_path: Path) -> None:
    from rdma_hca.settings.config import load_settings
    from rdma_hca.settings.model import Mode

    values = {"pools[0].resourceName": "rdma/hca", "pools[0].selectors.names": "{mlx5_0}",
              "pools[1].resourceName": "rdma/storage", "pools[1].mode": "exclusive",
              "pools[1].rdmaHcaMax": "7", "pools[1].selectors.names": "{mlx5_bond_0}"}
    (cm,) = [o for o in render(values) if o["kind"] == "ConfigMap"
             and "config.yaml" in o.get("data", {})]
    config = tmp_path / "config.yaml"
    config.write_text(cm["data"]["config.yaml"])
    settings = load_settings(str(config), {}, {})
    assert [(p.resource_name, p.mode, p.selectors.names) for p in settings.pools] == [
        ("rdma/hca", Mode.SHARED, ("mlx5_0",)), ("rdma/storage", Mode.EXCLUSIVE,
                                                  ("mlx5_bond_0",))]
    assert settings.pools[1].rdma_hca_max == 7
    # The top-level resourceName is not written beside pools (every pool names its own).
    assert settings.warnings == ()


@pytest.mark.parametrize(("values", "complaint"), [
    ({"pools[0].resourceName": "rdma/a", "pools[1].resourceName": "rdma/a"},
     'pools[1].resourceName "rdma/a": another pool has that name already'),
    ({"pools[0].resourceName": "rdma/a", "pools[1].resourceName": "example.kubernetes.io/b"},
     'pools[1].resourceName "example.kubernetes.io/b": the kubernetes.io domain is reserved'),
    ({"pools[0].rdmaHcaMax": "5"}, "resourceName"),
    ({"pools[0].resourceName": "rdma/a", "pools[0].colour": "red"}, "colour"),
    ({"pools[0].resourceName": "rdma/a", "pools[0].selectors.names": "{mlx5_0}",
      "pools[1].resourceName": "rdma/b", "dra.enabled": "true",
      "dra.selectors.names": "{mlx5_2}", "devicePlugin.enabled": "true"},
     "would both offer every HCA"),
    ({"pools[0].resourceName": "rdma/a", "pools[1].resourceName": "rdma/b",
      "pools[1].mode": "exclusive", "pools[1].selectors.names": "{mlx5_0}"},
     "pools[1]: the exclusive pool rdma/b and the pool rdma/a would both hold the HCA mlx5_0 "
     "(rdma/a takes every HCA"),
    ({"mode": "exclusive", "pools[0].resourceName": "rdma/a", "pools[0].mode": "shared",
      "pools[0].selectors.names": "{mlx5_1}", "pools[1].resourceName": "rdma/b"},
     "pools[1]: the exclusive pool rdma/b and the pool rdma/a would both hold the HCA mlx5_1 "
     "(rdma/b takes every HCA"),
])
def test_bad_pools_fail_the_install_naming_the_pool(helm: Path, values: dict[str, str],
                                                    complaint: str) -> None:
    result = run_helm(helm, "template", "ack-rdma-device-plugin", str(CHART), "-n",
                      "kube-system", *set_args(values))
    assert result.returncode != 0
    assert complaint in result.stderr, result.stderr


def test_exclusive_pools_with_their_own_hcas_install(render: RenderFn) -> None:
    objects = render({"pools[0].resourceName": "rdma/a", "pools[0].selectors.names": "{mlx5_1}",
                      "pools[1].resourceName": "rdma/b", "pools[1].mode": "exclusive",
                      "pools[1].selectors.names": "{mlx5_0}"})
    assert any(o["kind"] == "DaemonSet" for o in objects)
    assert any(o["kind"] == "DaemonSet" for o in render({"mode": "exclusive"}))
