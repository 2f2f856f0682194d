"""The chart and the daemon agree: the rendered args and ConfigMap load into the daemon's
settings exactly as the values say, through the daemon's own parser and config loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deploy_support import RenderFn

from rdma_hca.daemon.config import Settings
from rdma_hca.tools.cli import build_parser, settings_from_args

CONFIG_PATH = "/etc/rdma-hca/config.yaml"


def daemon_settings(render: RenderFn, values: dict[str, str], tmp_path: Path) -> Settings:
    objs = render(values)
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    ds = next(o for o in objs if o["kind"] == "DaemonSet")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(cm["data"]["config.yaml"])
    c = ds["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    # The file is where the ConfigMap volume puts it in the pod; here it is a temp file.
    assert env["RDMA_HCA_CONFIG"] == CONFIG_PATH
    env["RDMA_HCA_CONFIG"] = str(config_file)
    return settings_from_args(build_parser().parse_args(c["args"]), env=env)


def pool(settings: Settings) -> Any:
    (only,) = settings.pools
    return only


def test_defaults_load_into_the_daemon(render: RenderFn, tmp_path: Path) -> None:
    s = daemon_settings(render, {}, tmp_path)
    p = pool(s)
    assert (p.resource_name, p.rdma_hca_max, str(p.mode), str(p.unhealthy_when)) == (
        "rdma/hca", 1000, "shared", "any")
    assert s.non_host_network is False
    assert s.metrics_address == ":9478"
    assert (s.sysfs_root, s.dev_root) == ("/host/sys", "/host/dev")
    assert s.kubelet_dir == "/var/lib/kubelet/device-plugins"
    assert s.cdi.enabled is False


@pytest.mark.parametrize(
    "values",
    [
        {"resourceName": "example.com/rdma", "mode": "exclusive", "unhealthyWhen": "all",
         "rdmaHcaMax": "7"},
        {"nonHostNetwork.enabled": "true", "ncclEnv": "true", "logFormat": "json",
         "logLevel": "debug"},
        {"cdi.enabled": "true", "cdi.specDir": "/etc/cdi", "metrics.enabled": "false",
         "kubeletDir": "/var/lib/k0s/kubelet"},
        {"selectors.names[0]": "mlx5_*", "selectors.linkLayers[0]": "Ethernet",
         "selectors.pciVendors[0]": "0x15b3"},
    ],
    ids=["pool", "switches", "cdi-metrics-k0s", "selectors"],
)
def test_custom_values_load_into_the_daemon(render: RenderFn, tmp_path: Path,
                                            values: dict[str, str]) -> None:
    s = daemon_settings(render, values, tmp_path)
    p = pool(s)
    assert p.resource_name == values.get("resourceName", "rdma/hca")
    assert p.rdma_hca_max == int(values.get("rdmaHcaMax", "1000"))
    assert str(p.mode) == values.get("mode", "shared")
    assert str(p.unhealthy_when) == values.get("unhealthyWhen", "any")
    assert s.non_host_network is (values.get("nonHostNetwork.enabled") == "true")
    assert s.nccl_env is (values.get("ncclEnv") == "true")
    assert str(s.log_format) == values.get("logFormat", "text")
    assert s.log_level == values.get("logLevel", "info")
    assert s.cdi.enabled is (values.get("cdi.enabled") == "true")
    assert s.cdi.spec_dir == values.get("cdi.specDir", "/var/run/cdi")
    assert s.metrics_address == ("" if values.get("metrics.enabled") == "false" else ":9478")
    kubelet_dir = values.get("kubeletDir", "/var/lib/kubelet")
    assert s.kubelet_dir == f"{kubelet_dir}/device-plugins"
    if "selectors.names[0]" in values:
        assert list(p.selectors.names) == ["mlx5_*"]
        assert list(p.selectors.link_layers) == ["Ethernet"]
        assert list(p.selectors.pci_vendors) == ["0x15b3"]


@pytest.mark.parametrize(("bind", "address"),
                         [("10.0.0.5", "10.0.0.5:9478"), ("::", "[::]:9478"), ("", ":9478")])
def test_bind_address_reaches_the_daemon(render: RenderFn, tmp_path: Path, bind: str,
                                         address: str) -> None:
    values = {"metrics.bindAddress": bind} if bind else {}
    assert daemon_settings(render, values, tmp_path).metrics_address == address
