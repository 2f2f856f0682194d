"""The plugin pod with `dra.enabled`: a token, the daemon told to run DRA, the kubelet's
plugin directories and the CDI spec directory mounted; nothing of it while DRA is off."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_support import CHART, RenderFn, run_helm, set_args
from test_deploy_chart import config, container, mounts, one, pod_spec, volumes
from test_deploy_guard import rendered_notes
from vap_emulator import admit, device_selected

from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import Mode

# DRA alone, with a kubelet root that is not the default (and a trailing slash).
ALONE = {"dra.enabled": "true", "devicePlugin.enabled": "false",
         "kubeletDir": "/var/lib/k0s/kubelet/", "dra.driverName": "hca.example.com"}
# Beside the device plugin: the two take different HCAs.
BESIDE = {"dra.enabled": "true", "selectors.names[0]": "mlx5_0", "selectors.names[1]": "mlx5_1",
          "dra.selectors.names[0]": "mlx5_2", "dra.selectors.linkLayers[0]": "InfiniBand"}
# DRA needs resource.k8s.io/v1 (1.34); the newest the validator knows.
DRA_K8S_VERSIONS = ("1.34.0", kubernetes_validate.latest_version())
POD_KINDS = {"DaemonSet", "ConfigMap", "ServiceAccount"}


def env_of(objs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(objs)["env"] if "value" in e}


def test_dra_alone_pod_has_token_env_and_mounts(render: RenderFn) -> None:
    objs = render(ALONE)
    assert pod_spec(objs)["automountServiceAccountToken"] is True
    # The pod asks for the token; the account keeps it off for any other pod using it.
    assert one(objs, "ServiceAccount")["automountServiceAccountToken"] is False
    env = env_of(objs)
    # No device-plugins directory: the node may not have one without the device plugin.
    assert {k: v for k, v in env.items() if k not in {
        "RDMA_HCA_CONFIG", "RDMA_HCA_SYSFS_ROOT", "RDMA_HCA_DEV_ROOT"}} == {
        "RDMA_HCA_KUBELET_ROOT": "/var/lib/k0s/kubelet",
        "RDMA_HCA_DRA_ENABLED": "true",
        "RDMA_HCA_DRA_DRIVER_NAME": "hca.example.com",
        "RDMA_HCA_DEVICE_PLUGIN_ENABLED": "false",
    }
    (node,) = [e for e in container(objs)["env"] if e["name"] == "NODE_NAME"]
    assert node["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    (uid,) = [e for e in container(objs)["env"] if e["name"] == "POD_UID"]
    assert uid["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    # The new pod serves beside the old one before the old one goes.
    assert one(objs, "DaemonSet")["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # The fallback for kubelets before 1.33: the strategy as given.
    older = render({**ALONE, "updateStrategy.rollingUpdate.maxSurge": "0"})
    assert one(older, "DaemonSet")["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    m, v = mounts(objs), volumes(objs)
    # Each at the same path on the host and in the pod: the kubelet dials the sockets at
    # the paths the driver reports.
    want = {
        "plugins-registry": ("/var/lib/k0s/kubelet/plugins_registry", "Directory"),
        "plugins": ("/var/lib/k0s/kubelet/plugins", "Directory"),
        "cdi-specs": ("/var/run/cdi", "DirectoryOrCreate"),
    }
    for name, (path, kind) in want.items():
        assert m[name]["mountPath"] == path
        assert v[name]["hostPath"] == {"path": path, "type": kind}
    assert "device-plugins" not in m and "device-plugins" not in v
    writable = {name for name, mount in m.items() if not mount.get("readOnly", False)}
    assert writable == {"tmp", "cdi-specs", "plugins-registry", "plugins"}


def test_dra_beside_the_device_plugin(render: RenderFn) -> None:
    objs = render(BESIDE)
    env = env_of(objs)
    assert env["RDMA_HCA_DEVICE_PLUGIN_ENABLED"] == "true"
    assert env["RDMA_HCA_KUBELET_ROOT"] == "/var/lib/kubelet"
    assert env["RDMA_HCA_DRA_DRIVER_NAME"] == "rdma-hca.io"
    assert "device-plugins" in mounts(objs)
    # Two device plugins on one node would take each other's sockets: no surge here.
    assert one(objs, "DaemonSet")["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    cfg = config(objs)
    assert cfg["selectors"] == {"names": ["mlx5_0", "mlx5_1"]}
    assert cfg["dra"]["selectors"] == {"names": ["mlx5_2"], "linkLayers": ["InfiniBand"]}
    # The driver's own settings come from the chart's dra values, defaults included.
    assert {k: cfg["dra"][k] for k in ("mode", "deviceMetadata", "apiQps", "apiBurst",
                                       "claimApiQps", "claimApiBurst",
                                       "resyncSeconds", "startJitterSeconds")} == {
        "mode": "shared", "deviceMetadata": "off", "apiQps": 5, "apiBurst": 10,
        "claimApiQps": 50, "claimApiBurst": 100, "resyncSeconds": 60, "startJitterSeconds": 5}


def test_the_status_retry_after_cap_reaches_the_daemon(render: RenderFn, helm: Path,
                                                     tmp_path: Path) -> None:
    from rdma_hca.settings.config import load_settings

    assert config(render(ALONE))["dra"]["statusRetryAfterMaxSeconds"] == 60
    written = config(render({**ALONE, "dra.statusRetryAfterMaxSeconds": "120"}))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(written))
    assert load_settings(str(path), {}, {}).dra.status_retry_after_max_seconds == 120.0
    # Values reused from a chart without the key keep the daemon's default.
    chart = tmp_path / CHART.name
    shutil.copytree(CHART, chart)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    del values["dra"]["statusRetryAfterMaxSeconds"]
    (chart / "values.yaml").write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", "x", str(chart), *set_args(ALONE))
    assert result.returncode == 0, result.stderr
    assert config([d for d in yaml.safe_load_all(result.stdout) if d])["dra"][
        "statusRetryAfterMaxSeconds"] == 60
    # The daemon's bounds, refused at install.
    for bad in ("0", "3601"):
        result = run_helm(helm, "template", "x", str(CHART), *set_args(ALONE),
                          "--set", f"dra.statusRetryAfterMaxSeconds={bad}")
        assert result.returncode != 0 and "statusRetryAfterMaxSeconds" in result.stderr


def test_cdi_spec_dir_is_mounted_once_with_or_without_cdi(render: RenderFn) -> None:
    for extra in ({}, {"cdi.enabled": "true"}):
        objs = render({**ALONE, **extra, "cdi.specDir": "/etc/cdi"})
        assert [m["mountPath"] for m in container(objs)["volumeMounts"]
                if m["name"] == "cdi-specs"] == ["/etc/cdi"]
        assert [x["hostPath"]["path"] for x in pod_spec(objs)["volumes"]
                if x["name"] == "cdi-specs"] == ["/etc/cdi"]
        assert config(objs)["cdi"] == {"enabled": bool(extra), "specDir": "/etc/cdi"}


def test_dra_values_change_nothing_while_dra_is_off(render: RenderFn) -> None:
    dra_values = {"dra.driverName": "hca.example.com", "dra.extendedResourceName": "",
                  "dra.selectors.names[0]": "mlx5_2", "devicePlugin.enabled": "true"}
    for base in ({}, {"cdi.enabled": "true"}, {"kubeletDir": "/var/lib/k0s/kubelet"}):
        assert render({**base, **dra_values}) == render(base)
    objs = render()
    assert pod_spec(objs)["automountServiceAccountToken"] is False
    assert not any(k.startswith("RDMA_HCA_DRA") for k in env_of(objs))
    assert "dra" not in config(objs)
    assert not {"plugins", "plugins-registry"} & mounts(objs).keys()


@pytest.mark.parametrize("values", [ALONE, BESIDE, {**ALONE, "cdi.enabled": "true"}],
                         ids=["alone", "beside", "alone-cdi"])
def test_dra_pods_are_valid_kubernetes(render: RenderFn, values: dict[str, str]) -> None:
    objs = render(values)
    assert {o["kind"] for o in objs} >= POD_KINDS | {"DeviceClass", "ClusterRoleBinding"}
    for obj in objs:
        for version in DRA_K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_lint_strict_passes_with_dra(helm: Path) -> None:
    for values in (ALONE, BESIDE):
        result = run_helm(helm, "lint", "--strict", str(CHART), *set_args(values))
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"dra.enabled": "true"}, "would both offer every HCA"),
        ({"dra.enabled": "true", "selectors.names[0]": "mlx5_0"}, "would both offer every HCA"),
        ({"dra.enabled": "true", "dra.selectors.names[0]": "mlx5_0"},
         "set devicePlugin.enabled=false to run DRA alone"),
        ({"devicePlugin.enabled": "false"}, "nothing would be offered"),
        ({"devicePlugin.enabled": "yes"}, "enabled"),
        ({"devicePlugin.pools": "1"}, "pools"),
        ({"dra.selectors.linkLayers[0]": "ethernet"}, "linkLayers"),
        ({"dra.selectors.pciVendors[0]": "15b3"}, "pciVendors"),
        ({"dra.selectors.names[0]": ""}, "names"),
        ({"dra.selectors.name[0]": "mlx5_0"}, "name"),
        ({"dra.selectors": "all"}, "selectors"),
    ],
)
def test_bad_dra_values_fail_the_install_naming_the_fix(
        helm: Path, values: dict[str, str], complaint: str) -> None:
    result = run_helm(helm, "template", "x", str(CHART), *set_args(values))
    assert result.returncode != 0
    assert complaint in result.stderr, result.stderr


def test_the_schema_takes_every_selector_key_for_dra(render: RenderFn) -> None:
    values = {**ALONE, "dra.selectors.names[0]": "mlx5_*", "dra.selectors.drivers[0]": "mlx5_core",
              "dra.selectors.linkLayers[0]": "Ethernet", "dra.selectors.netdevs[0]": "eth*",
              "dra.selectors.pciVendors[0]": "0x15b3", "dra.selectors.pciDevices[0]": "0x101d"}
    assert config(render(values))["dra"]["selectors"] == {
        "names": ["mlx5_*"], "drivers": ["mlx5_core"], "linkLayers": ["Ethernet"],
        "netdevs": ["eth*"], "pciVendors": ["0x15b3"], "pciDevices": ["0x101d"]}


def test_with_dra_alone_the_policies_still_guard_the_extended_resource(
        render: RenderFn) -> None:
    # rdma/hca in limits is then served by DRA's extended DeviceClass; the pod needs the host
    # network and IPC_LOCK all the same.
    objs = render(ALONE)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "i",
                                    "resources": {"limits": {"rdma/hca": 1}}}]}}
    outcome = admit(objs, pod)
    assert outcome.denied and "hostNetwork" in outcome.denied[0]
    assert any("IPC_LOCK" in w for w in outcome.warnings)
    pod["spec"]["hostNetwork"] = True
    assert admit(objs, pod).admitted


def test_notes_speak_of_dra(helm: Path, tmp_path: Path) -> None:
    sub = "ack-rdma-device-plugin."
    text = rendered_notes(helm, tmp_path, *set_args({sub + k: v for k, v in ALONE.items()}))
    assert "kubectl get resourceslices --field-selector spec.driver=hca.example.com" in text
    assert "The device plugin is off" in text
    assert "Drain a node" in text
    off = rendered_notes(helm, tmp_path / "off")
    assert "resourceslices" not in off and "Check that a node offers the resource" in off


def test_values_reused_from_a_chart_without_device_plugin_key(helm: Path, tmp_path: Path,
                                                               render: RenderFn) -> None:
    """`helm upgrade --reuse-values` renders the new templates over the old chart's values,
    which have no devicePlugin key: that means the device plugin, as before."""
    chart = tmp_path / CHART.name
    shutil.copytree(CHART, chart)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    del values["devicePlugin"], values["dra"]["selectors"]
    (chart / "values.yaml").write_text(yaml.safe_dump(values))

    def template(*args: str) -> Any:
        return run_helm(helm, "template", "ack-rdma-device-plugin", str(chart), "--namespace",
                        "kube-system", "--api-versions",
                        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy", *args)

    old = template()
    assert old.returncode == 0, old.stderr
    assert [d for d in yaml.safe_load_all(old.stdout) if d] == render()
    refused = template("--set", "dra.enabled=true")
    assert refused.returncode != 0
    assert "devicePlugin.enabled is not set" in refused.stderr
    assert "--reuse-values" in refused.stderr
    alone = template(*set_args({"dra.enabled": "true", "devicePlugin.enabled": "false"}))
    assert alone.returncode == 0, alone.stderr


# --- the docs' commands render ------------------------------------------------------------


def _documented_sets(doc: str, heading: str) -> list[list[str]]:
    """The --set arguments of every `helm` command in the shell blocks of one section."""
    text = (CHART.parents[2] / "docs" / doc).read_text()
    section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in section.split("```sh\n")[1:]:
        command = block.split("```", 1)[0].replace("\\\n", " ")
        for line in command.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["helm"]:
                commands.append([w for i, w in enumerate(words[1:], 1)
                                 if words[i - 1] == "--set" or w == "--set"])
    return commands


@pytest.mark.parametrize(("doc", "heading"), [
    ("install.md", "## Dynamic Resource Allocation"), ("dra.md", "## Installing")])
def test_the_documented_dra_commands_render(helm: Path, doc: str, heading: str) -> None:
    commands = _documented_sets(doc, heading)
    assert commands and all("dra.enabled=true" in c for c in commands)
    for sets in commands:
        result = run_helm(helm, "template", "x", str(CHART), *sets)
        assert result.returncode == 0, f"{doc}: {sets}: {result.stderr}"


def test_install_doc_has_the_dra_section() -> None:
    text = (CHART.parents[2] / "docs" / "install.md").read_text()
    section = text.split("## Dynamic Resource Allocation\n", 1)[1].split("\n## ", 1)[0]
    for needle in ("devicePlugin.enabled", "dra.selectors", "Drain a node", "(dra.md)",
                   "kubectl drain <node>"):
        assert needle in section, needle


def _published(tmp_path: Path, mode: Mode) -> list[dict[str, Any]]:
    """The devices the driver publishes for a 13-HCA GPU node, as its slice holds them."""
    node = gpu_node(tmp_path / mode.value, hcas=12, gid_table_size=8)
    inventory = discover_node(node.sysfs_root, node.dev_root)
    return list(DeviceOffer.build(inventory.hcas, "rdma-hca.io", mode, True,
                                  inventory.rdma_cm).devices)


def _selected(objs: list[dict[str, Any]], name: str,
              devices: list[tuple[str, dict[str, Any]]]) -> set[str]:
    (cls,) = [o for o in objs if o["kind"] == "DeviceClass" and o["metadata"]["name"] == name]
    return {d["name"] for driver, d in devices
            if all(device_selected(s["cel"]["expression"], driver, d)
                   for s in cls["spec"]["selectors"])}


# A device of an older driver (no kind attribute) and another driver's GPU: the selectors
# must neither fail on them (a CEL error aborts the allocation) nor take the GPU.
_OLD = ("rdma-hca.io", {"name": "old-hca", "attributes": {
    "rdma-hca.io/hcaName": {"string": "mlx5_9"}}})
_GPU = ("gpu.nvidia.com", {"name": "gpu-0", "attributes": {
    "resource.kubernetes.io/pcieRoot": {"string": "pci0000:37"}}})


def test_shared_the_extended_class_selects_only_the_node_wide_device(
        render: RenderFn, tmp_path: Path) -> None:
    objs = render(ALONE | {"dra.driverName": "rdma-hca.io"})
    published = _published(tmp_path, Mode.SHARED)
    devices = [("rdma-hca.io", d) for d in published] + [_OLD, _GPU]
    hcas = {d["name"] for d in published} - {"all-hcas"}
    assert len(hcas) == 13
    # rdma/hca: 1 is one device of this class: the one that gives every HCA.
    assert _selected(objs, "rdma-hca.io-extended", devices) == {"all-hcas"}
    # A claim asking for "an HCA" gets one HCA, never the whole node.
    assert _selected(objs, "rdma-hca.io", devices) == hcas | {"old-hca"}


def test_exclusive_both_classes_select_one_hca_per_unit(
        render: RenderFn, tmp_path: Path) -> None:
    objs = render(ALONE | {"dra.driverName": "rdma-hca.io", "dra.mode": "exclusive"})
    published = _published(tmp_path, Mode.EXCLUSIVE)
    assert "all-hcas" not in {d["name"] for d in published}
    devices = [("rdma-hca.io", d) for d in published] + [_OLD, _GPU]
    hcas = {d["name"] for d in published} | {"old-hca"}
    assert _selected(objs, "rdma-hca.io-extended", devices) == hcas
    assert _selected(objs, "rdma-hca.io", devices) == hcas
