"""``rdma-hca config from-msdp``: the Mellanox shared plugin's config as rdma-hca's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rdma_hca import cli
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.settings.checks import selected_hcas
from rdma_hca.settings.config import load_settings
from rdma_hca.settings.model import ConfigError, Mode
from rdma_hca.tools import msdp

# The example of the plugin's README (its prefix example_prefix is no DNS name, which the
# kubelet refuses: a real one here): a prefix, devices on one resource, selectors on the other.
README_EXAMPLE: dict[str, Any] = {
    "periodicUpdateInterval": 300,
    "configList": [
        {"resourceName": "hca_shared_devices_a", "resourcePrefix": "example.com",
         "rdmaHcaMax": 1000, "devices": ["ib0", "ib1"]},
        {"resourceName": "hca_shared_devices_b", "rdmaHcaMax": 500,
         "selectors": {"vendors": ["15b3"], "deviceIDs": ["1017"], "ifNames": ["ib3", "ib4"]}},
    ],
}


def write(tmp_path: Path, doc: object, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return str(path)


def from_msdp(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["config", "from-msdp", *argv], env={})
    out, err = capsys.readouterr()
    return code, out, err


def test_the_readme_example_loads_with_our_loader(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    code, out, err = from_msdp(capsys, write(tmp_path, README_EXAMPLE))
    assert (code, err) == (0, "")
    converted = tmp_path / "rdma-hca.yaml"
    converted.write_text(out)
    settings = load_settings(str(converted), {}, {})
    a, b = settings.pools
    assert (a.resource_name, a.rdma_hca_max, a.mode) == (
        "example.com/hca_shared_devices_a", 1000, Mode.SHARED)
    assert a.selectors.netdevs == ("ib0", "ib1")
    assert (b.resource_name, b.rdma_hca_max) == ("rdma/hca_shared_devices_b", 500)
    assert (b.selectors.pci_vendors, b.selectors.pci_devices, b.selectors.netdevs) == (
        ("0x15b3",), ("0x1017",), ("ib3", "ib4"))
    assert settings.non_host_network is True
    assert "# periodicUpdateInterval (300 s) has no equivalent" in out
    assert settings.warnings == ()


def test_the_resource_name_is_the_one_the_plugin_advertises(tmp_path: Path) -> None:
    doc = {"configList": [{"resourceName": "hca", "rdmaHcaMax": 63, "selectors":
                           {"drivers": ["mlx5_core"]}}]}
    out = msdp.config_yaml(msdp.convert(doc, "f"), "f")
    (tmp_path / "c.yaml").write_text(out)
    settings = load_settings(str(tmp_path / "c.yaml"), {}, {})
    assert [p.resource_name for p in settings.pools] == ["rdma/hca"]
    assert yaml.safe_load(out)["resourceName"] == "rdma/hca"  # one resource: top level


def test_the_selectors_pick_the_hcas_the_plugin_would(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "node")
    from rdma_hca.node.inventory import discover_node

    hcas = discover_node(node.sysfs_root, node.dev_root).hcas
    target = next(h for h in hcas if h.netdevs)
    doc = {"configList": [{"resourceName": "a", "rdmaHcaMax": 10, "selectors": {
        "ifNames": [target.netdevs[0]], "linkTypes": ["ether"],
        "vendors": [target.pci_vendor.removeprefix("0x")]}}]}
    (tmp_path / "c.yaml").write_text(msdp.config_yaml(msdp.convert(doc, "f"), "f"))
    settings = load_settings(str(tmp_path / "c.yaml"), {}, {})
    assert [h.name for h in selected_hcas(settings, hcas)] == [target.name]


def test_a_configmap_manifest_is_read_too(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    manifest = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "rdma-devices", "namespace": "kube-system"},
                "data": {"config.json": json.dumps(README_EXAMPLE)}}
    code, out, _ = from_msdp(capsys, write(tmp_path, yaml.safe_dump(manifest), "cm.yaml"))
    assert code == 0
    assert [p["resourceName"] for p in yaml.safe_load(out)["pools"]] == [
        "example.com/hca_shared_devices_a", "rdma/hca_shared_devices_b"]


def test_a_nic_cluster_policy_is_read_too(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    policy = {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
              "metadata": {"name": "nic-cluster-policy"},
              "spec": {"rdmaSharedDevicePlugin": {
                  "image": "k8s-rdma-shared-dev-plugin", "version": "v1.5.3",
                  "config": json.dumps({"configList": [
                      {"resourceName": "rdma_shared_device_a", "rdmaHcaMax": 63,
                       "selectors": {"vendors": ["15b3"], "ifNames": ["ens1f0"]}}]})}}}
    code, out, _ = from_msdp(capsys, write(tmp_path, yaml.safe_dump(policy), "ncp.yaml"))
    assert code == 0
    assert yaml.safe_load(out)["resourceName"] == "rdma/rdma_shared_device_a"
    del policy["spec"]["rdmaSharedDevicePlugin"]["config"]
    code, out, err = from_msdp(capsys, write(tmp_path, yaml.safe_dump(policy), "ncp.yaml"))
    assert (code, out) == (2, "")
    assert err.startswith("rdma-hca config: spec.rdmaSharedDevicePlugin.config: None")


def test_values_for_one_resource(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = {"configList": [{"resourceName": "hca_a", "rdmaHcaMax": 100,
                           "selectors": {"linkTypes": ["infiniband", "ether"]}}]}
    code, out, _ = from_msdp(capsys, write(tmp_path, doc), "--values")
    assert code == 0
    assert yaml.safe_load(out) == {
        "nonHostNetwork": {"enabled": True}, "resourceName": "rdma/hca_a", "rdmaHcaMax": 100,
        "mode": "shared", "selectors": {"linkLayers": ["InfiniBand", "Ethernet"]}}


def test_values_for_several_resources_are_the_charts_pools(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = from_msdp(capsys, write(tmp_path, README_EXAMPLE), "--values")
    assert (code, err) == (0, "")
    values = yaml.safe_load(out)
    assert "resourceName" not in values
    assert values["pools"] == [
        {"resourceName": "example.com/hca_shared_devices_a", "rdmaHcaMax": 1000,
         "mode": "shared", "selectors": {"netdevs": ["ib0", "ib1"]}},
        {"resourceName": "rdma/hca_shared_devices_b", "rdmaHcaMax": 500, "mode": "shared",
         "selectors": {"pciVendors": ["0x15b3"], "pciDevices": ["0x1017"],
                       "netdevs": ["ib3", "ib4"]}}]


@pytest.mark.parametrize(("doc", "field", "why"), [
    ({**README_EXAMPLE, "logLevel": "debug"}, "logLevel", "unknown or unsupported key"),
    ({"configList": [{"resourceName": "a", "rdmaHcaMax": 1, "devices": ["ib0"],
                      "isRdma": True}]}, "configList[0].isRdma", "unknown or unsupported key"),
    ({"configList": [{"resourceName": "a", "rdmaHcaMax": 1,
                      "selectors": {"pciAddresses": ["0000:3b:00.0"]}}]},
     "configList[0].selectors.pciAddresses", "unknown or unsupported key"),
    ({"configList": [{"resourceName": "a", "rdmaHcaMax": 1,
                      "selectors": {"linkTypes": ["loopback"]}}]},
     "configList[0].selectors.linkTypes", "ether or infiniband"),
    ({"configList": [{"resourceName": "a", "rdmaHcaMax": 1, "devices": ["ib0"],
                      "selectors": {"vendors": ["15b3"]}}]},
     "configList[0].devices", "either devices or selectors, not both"),
    ({"configList": [{"resourceName": "a", "rdmaHcaMax": 1}]},
     "configList[0].selectors", "selectors or devices must name the HCAs"),
    ({"configList": [{"resourceName": "a", "rdmaHcaMax": 0, "devices": ["ib0"]}]},
     "configList[0].rdmaHcaMax", "an integer from 1 to 100000"),
    ({"configList": [{"resourceName": "a", "devices": ["ib0"]}]},
     "configList[0].rdmaHcaMax", "an integer from 1 to 100000"),
    ({"configList": [{"resourceName": "a-b", "rdmaHcaMax": 1, "devices": ["ib0"]}]},
     "configList[0].resourceName", "letters, digits and '_'"),
    ({"configList": [{"resourceName": "a", "resourcePrefix": "Bad_Prefix", "rdmaHcaMax": 1,
                      "devices": ["ib0"]}]},
     "configList[0].resourcePrefix", "Bad_Prefix/a is not an extended resource name"),
    ({"configList": [{"resourceName": "a", "rdmaHcaMax": 1, "devices": ["ib0"]},
                     {"resourceName": "a", "rdmaHcaMax": 2, "devices": ["ib1"]}]},
     "configList[1].resourceName", "each resource needs a different name"),
    ({"configList": [{"resourceName": "a", "rdmaHcaMax": 1, "devices": "ib0"}]},
     "configList[0].devices", "a list of non-empty strings"),
    ({"configList": [{"resourceName": "a", "rdmaHcaMax": 1,
                      "selectors": {"vendors": ["0x15b3"]}}]},
     "configList[0].selectors.vendors", "4 lower-case hex digits"),
    ({"configList": [{"resourceName": "a", "rdmaHcaMax": 1, "devices": ["ib*"]}]},
     "configList[0].devices", "the plugin compares names exactly"),
    ({"periodicUpdateInterval": -1, "configList": []}, "periodicUpdateInterval",
     "0 or more"),
    ({"configList": []}, "configList", "a non-empty list of resources"),
])
def test_what_cannot_be_carried_over_is_refused_by_name(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, doc: dict[str, Any], field: str,
        why: str) -> None:
    with pytest.raises(ConfigError) as err:
        msdp.convert(doc, "config.json")
    assert err.value.field_name == field and why in str(err.value)
    code, out, text = from_msdp(capsys, write(tmp_path, doc))
    assert (code, out) == (2, "")
    assert text.startswith(f"rdma-hca config: {field}: ") and text.count("\n") == 1


def test_a_duplicated_key_in_the_json_is_refused_with_its_lines(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = ('{"configList": [{"resourceName": "a", "rdmaHcaMax": 1,\n'
            '  "rdmaHcaMax": 2, "devices": ["ib0"]}]}\n')
    code, _, err = from_msdp(capsys, write(tmp_path, text))
    assert code == 2
    assert "FILE: " in err and "the key 'rdmaHcaMax' is given twice, at line 1 and at line 2" \
        in err


def test_a_missing_file_names_the_argument(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    code, _, err = from_msdp(capsys, str(tmp_path / "nope.json"))
    assert code == 2
    assert err.startswith(f"rdma-hca config: FILE: '{tmp_path / 'nope.json'}' is not valid: "
                          "the file cannot be read")
