"""The Helm values `rdma-hca config from-msdp --values` prints install the chart, and the
config the chart renders from them offers what the Mellanox plugin's config offered."""

from __future__ import annotations

from pathlib import Path

import yaml
from deploy_support import CHART, run_helm

from rdma_hca.settings.config import load_settings
from rdma_hca.settings.model import Mode
from rdma_hca.tools import msdp


def test_converted_values_render_a_config_our_loader_takes(helm: Path, tmp_path: Path) -> None:
    doc = {"periodicUpdateInterval": 60, "configList": [
        {"resourceName": "hca_shared_devices_a", "resourcePrefix": "example.com",
         "rdmaHcaMax": 500, "selectors": {"vendors": ["15b3"], "linkTypes": ["infiniband"],
                                          "ifNames": ["ib0", "ib1"]}}]}
    values = tmp_path / "values.yaml"
    values.write_text(msdp.values_yaml(msdp.convert(doc, "config.json"), "config.json"))
    result = run_helm(helm, "template", "ack-rdma-device-plugin", str(CHART), "--namespace",
                      "kube-system", "-f", str(values),
                      "--set", "image.repository=registry.example.com/rdma-hca")
    assert result.returncode == 0, result.stderr
    (cm,) = [d for d in yaml.safe_load_all(result.stdout)
             if d and d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})]
    config = tmp_path / "config.yaml"
    config.write_text(cm["data"]["config.yaml"])
    settings = load_settings(str(config), {}, {})
    (pool,) = settings.pools
    assert (pool.resource_name, pool.rdma_hca_max, pool.mode) == (
        "example.com/hca_shared_devices_a", 500, Mode.SHARED)
    assert (pool.selectors.pci_vendors, pool.selectors.link_layers, pool.selectors.netdevs) == (
        ("0x15b3",), ("InfiniBand",), ("ib0", "ib1"))
    assert settings.non_host_network is True


def test_several_resources_install_as_the_charts_pools(helm: Path, tmp_path: Path) -> None:
    doc = {"configList": [
        {"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 1000, "devices": ["ib0", "ib1"]},
        {"resourceName": "hca_shared_devices_b", "rdmaHcaMax": 500,
         "selectors": {"vendors": ["15b3"], "deviceIDs": ["1017"], "ifNames": ["ib3"]}}]}
    values = tmp_path / "values.yaml"
    values.write_text(msdp.values_yaml(msdp.convert(doc, "config.json"), "config.json"))
    result = run_helm(helm, "template", "ack-rdma-device-plugin", str(CHART), "--namespace",
                      "kube-system", "-f", str(values), "--api-versions",
                      "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})]
    config = tmp_path / "config.yaml"
    config.write_text(cm["data"]["config.yaml"])
    settings = load_settings(str(config), {}, {})
    assert [(p.resource_name, p.rdma_hca_max, p.selectors.netdevs) for p in settings.pools] == [
        ("rdma/hca_shared_devices_a", 1000, ("ib0", "ib1")),
        ("rdma/hca_shared_devices_b", 500, ("ib3",))]
    assert settings.warnings == ()
    # The admission policies look for both names.
    for policy in (d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"):
        names = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
        assert names["resourceNames"] == ("['rdma/hca_shared_devices_a', "
                                          "'rdma/hca_shared_devices_b']")
