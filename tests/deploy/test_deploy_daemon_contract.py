"""The chart and the daemon agree: the rendered args and ConfigMap load into the daemon's
settings exactly as the values say, through the daemon's own parser and config loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deploy_support import RenderFn

from rdma_hca.cli import build_parser, settings_from_args
from rdma_hca.settings.model import NcclEnv, Settings

CONFIG_PATH = "/etc/rdma-hca/config.yaml"


def daemon_settings(render: RenderFn, values: dict[str, str], tmp_path: Path,
                    extra_env: dict[str, str] | None = None) -> Settings:
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
    env.update(extra_env or {})
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
    # true, the value earlier charts took, still means what it meant: NCCL_IB_HCA only.
    assert s.nccl_env is (NcclEnv.HCA if values.get("ncclEnv") == "true" else NcclEnv.AUTO)
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


# --- DRA: the pod's env and mounts are what the driver uses --------------------------------


def _host_mounts(render: RenderFn, values: dict[str, str]) -> dict[str, str]:
    """Volume name -> its path in the pod, for hostPath volumes mounted at the host's path."""
    spec = next(o for o in render(values) if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    hosts = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    paths = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    return {name: path for name, path in paths.items() if hosts.get(name) == path}


def _under(path: str, directory: str) -> bool:
    return Path(path).is_relative_to(directory)


@pytest.mark.parametrize("kubelet_dir", ["/var/lib/kubelet", "/var/lib/k0s/kubelet/",
                                         "/var/snap/microk8s/common/var/lib/kubelet"])
def test_dra_alone_loads_into_the_daemon_and_the_driver(
        render: RenderFn, tmp_path: Path, kubelet_dir: str) -> None:
    from rdma_hca.daemon.dra.config import DriverConfig
    from rdma_hca.daemon.dra.kubeletplugin.options import HelperOptions

    values = {"dra.enabled": "true", "devicePlugin.enabled": "false", "kubeletDir": kubelet_dir,
              "dra.driverName": "hca.example.com", "dra.selectors.names[0]": "mlx5_*",
              "cdi.specDir": "/etc/cdi"}
    # The kubelet fills NODE_NAME from spec.nodeName (a fieldRef, so not in the values read).
    settings = daemon_settings(render, values, tmp_path, extra_env={"NODE_NAME": "node-a"})
    assert settings.dra.enabled is True
    assert settings.device_plugin_enabled is False and settings.pools == ()
    assert settings.dra.driver_name == "hca.example.com"
    assert list(settings.dra.selectors.names) == ["mlx5_*"]
    assert settings.node_name == "node-a"
    assert settings.warnings == ()
    root = kubelet_dir.rstrip("/")
    assert settings.kubelet_root == root
    assert settings.kubelet_dir == f"{root}/device-plugins"

    driver = DriverConfig.from_settings(settings)
    mounted = _host_mounts(render, values)
    assert driver.plugins_registry_dir == mounted["plugins-registry"]
    assert driver.plugins_dir == mounted["plugins"]
    assert driver.cdi_spec_dir == mounted["cdi-specs"] == "/etc/cdi"
    # Everything the driver creates on the node is inside a mount (the root is read-only).
    assert _under(driver.registration_socket, mounted["plugins-registry"])
    assert _under(driver.endpoint, mounted["plugins"])
    assert _under(driver.checkpoint, mounted["plugins"])
    assert driver.endpoint == f"{root}/plugins/hca.example.com/dra.sock"
    assert (driver.node_name, driver.driver_name) == ("node-a", "hca.example.com")
    # What the driver refuses at start: no node, socket paths too long.
    HelperOptions.from_config(driver).check()


def test_dra_beside_the_device_plugin_loads_into_the_daemon(
        render: RenderFn, tmp_path: Path) -> None:
    values = {"dra.enabled": "true", "selectors.names[0]": "mlx5_0",
              "dra.selectors.names[0]": "mlx5_1"}
    s = daemon_settings(render, values, tmp_path)
    assert (s.dra.enabled, s.device_plugin_enabled) == (True, True)
    assert list(pool(s).selectors.names) == ["mlx5_0"]
    assert list(s.dra.selectors.names) == ["mlx5_1"]


def test_overlapping_names_are_left_to_the_daemon_which_refuses_them(
        render: RenderFn, tmp_path: Path) -> None:
    from rdma_hca.settings.model import ConfigError

    values = {"dra.enabled": "true", "selectors.names[0]": "mlx5_*",
              "dra.selectors.names[0]": "mlx5_1"}
    with pytest.raises(ConfigError, match="offered twice"):
        daemon_settings(render, values, tmp_path)
