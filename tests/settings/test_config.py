"""Settings: layering of file, environment and flags, and an exact error for every bad value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rdma_hca.kit.names import resource_name_problem
from rdma_hca.node.model import Hca
from rdma_hca.settings.checks import overlapping_hcas, selected_hcas
from rdma_hca.settings.config import env_warnings, load_settings
from rdma_hca.settings.model import ConfigError, Mode, Selectors, Settings, UnhealthyWhen


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_are_the_seed_component() -> None:
    s = load_settings(None, {}, {})
    (pool,) = s.pools
    assert pool.resource_name == "rdma/hca"
    assert pool.rdma_hca_max == 1000
    assert pool.mode is Mode.SHARED
    assert pool.unhealthy_when is UnhealthyWhen.ANY
    assert s.non_host_network is False
    assert s.sysfs_root == "/sys"
    assert s.dev_root == "/dev"
    assert s.kubelet_dir == "/var/lib/kubelet/device-plugins"
    assert s.metrics_address == ":9478"


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    cfg = write(tmp_path, "resourceName: example.com/rdma\nrdmaHcaMax: 10\nmode: exclusive\n"
                          "nonHostNetwork: true\n")
    s = load_settings(cfg, {"RDMA_HCA_RDMA_HCA_MAX": "20"}, {})
    assert s.pools[0].resource_name == "example.com/rdma"
    assert s.pools[0].rdma_hca_max == 20
    assert s.pools[0].mode is Mode.EXCLUSIVE
    assert s.non_host_network is True
    s = load_settings(cfg, {"RDMA_HCA_RDMA_HCA_MAX": "20"}, {"rdmaHcaMax": "30",
                                                              "nonHostNetwork": False})
    assert s.pools[0].rdma_hca_max == 30
    assert s.non_host_network is False


def test_config_file_from_environment(tmp_path: Path) -> None:
    cfg = write(tmp_path, "unhealthyWhen: all\n")
    s = load_settings(None, {"RDMA_HCA_CONFIG": cfg}, {})
    assert s.pools[0].unhealthy_when is UnhealthyWhen.ALL


def test_selectors_parsed(tmp_path: Path) -> None:
    cfg = write(tmp_path, "selectors:\n  names: ['mlx5_[0-7]']\n  linkLayers: [Ethernet]\n"
                          "  drivers: [mlx5_core]\n")
    sel = load_settings(cfg, {}, {}).pools[0].selectors
    assert sel.names == ("mlx5_[0-7]",)
    assert sel.link_layers == ("Ethernet",)
    assert sel.drivers == ("mlx5_core",)


def test_pools_inherit_top_level_defaults(tmp_path: Path) -> None:
    cfg = write(tmp_path, """
unhealthyWhen: all
pools:
  - resourceName: rdma/hca
    selectors: {names: ['mlx5_[0-7]']}
  - resourceName: rdma/storage
    mode: exclusive
    selectors: {names: [mlx5_bond_0]}
""")
    s = load_settings(cfg, {}, {})
    assert [p.resource_name for p in s.pools] == ["rdma/hca", "rdma/storage"]
    assert [p.mode for p in s.pools] == [Mode.SHARED, Mode.EXCLUSIVE]
    assert all(p.unhealthy_when is UnhealthyWhen.ALL for p in s.pools)


@pytest.mark.parametrize(
    ("text", "env", "flags", "field", "fragment"),
    [
        ("rdmaHcaMax: 0\n", {}, {}, "rdmaHcaMax", "an integer from 1 to 100000"),
        ("rdmaHcaMax: 100001\n", {}, {}, "rdmaHcaMax", "an integer from 1 to 100000"),
        ("rdmaHcaMax: lots\n", {}, {}, "rdmaHcaMax", "an integer"),
        ("rdmaHcaMax: true\n", {}, {}, "rdmaHcaMax", "an integer"),
        ("", {"RDMA_HCA_RDMA_HCA_MAX": "-5"}, {}, "rdmaHcaMax", "environment variable"),
        ("", {}, {"rdmaHcaMax": "1.5"}, "rdmaHcaMax", "flag --rdma-hca-max"),
        ("resourceName: hca\n", {}, {}, "resourceName", "<domain>/<name>"),
        ("resourceName: kubernetes.io/hca\n", {}, {}, "resourceName", "reserved"),
        ("resourceName: Rdma/hca\n", {}, {}, "resourceName", "DNS subdomain"),
        ("resourceName: rdma/-hca\n", {}, {}, "resourceName", "after '/'"),
        ("mode: sharedish\n", {}, {}, "mode", "shared or exclusive"),
        ("unhealthyWhen: most\n", {}, {}, "unhealthyWhen", "any or all"),
        ("nonHostNetwork: maybe\n", {}, {}, "nonHostNetwork", "true or false"),
        ("healthPollSeconds: 0\n", {}, {}, "healthPollSeconds", "0.05 to 60"),
        ("resendSeconds: -1\n", {}, {}, "resendSeconds", "or 0 to turn it off"),
        ("metricsAddress: localhost\n", {}, {}, "metricsAddress", "HOST:PORT"),
        ("metricsAddress: ':99999'\n", {}, {}, "metricsAddress", "1 to 65535"),
        ("logFormat: xml\n", {}, {}, "logFormat", "text or json"),
        ("logLevel: loud\n", {}, {}, "logLevel", "debug, info"),
        ("selectors: [a]\n", {}, {}, "selectors", "a mapping"),
        ("selectors: {colour: [red]}\n", {}, {}, "selectors.colour", "unknown selector"),
        ("selectors: {names: [1]}\n", {}, {}, "selectors.names", "non-empty strings"),
        ("selectors: {linkLayers: [Ether]}\n", {}, {}, "selectors.linkLayers", "InfiniBand"),
        ("cdi: {specDir: relative}\n", {}, {}, "cdi.specDir", "absolute"),
        ("cdi: {enabled: yes-please}\n", {}, {}, "cdi.enabled", "true or false"),
        ("colour: red\n", {}, {}, "colour", "unknown key"),
        ("pools: []\n", {}, {}, "pools", "non-empty list"),
        ("pools: [{mode: shared}]\n", {}, {}, "pools[0].resourceName", "its own resourceName"),
        ("pools: [{resourceName: a.io/x}, {resourceName: a.io/x}]\n", {}, {}, "pools",
         "different resourceName"),
        ("pools: [{resourceName: a.io/x, rdmaHcaMax: 0}]\n", {}, {}, "pools[0].rdmaHcaMax",
         "1 to 100000"),
    ],
)
def test_bad_values_name_field_value_and_allowed(
    tmp_path: Path, text: str, env: dict[str, str], flags: dict[str, object], field: str,
    fragment: str,
) -> None:
    cfg = write(tmp_path, text) if text else None
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, env, flags)
    assert err.value.field_name == field
    assert fragment in str(err.value)
    assert str(err.value).startswith(field + ":")


def test_malformed_yaml_says_where(tmp_path: Path) -> None:
    cfg = write(tmp_path, "resourceName: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_settings(cfg, {}, {})


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load_settings(str(tmp_path / "nope.yaml"), {}, {})


def test_file_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="YAML mapping"):
        load_settings(write(tmp_path, "- a\n- b\n"), {}, {})


@pytest.mark.parametrize("name", ["rdma/hca", "example.com/rdma", "a.b-c.io/x_y.z"])
def test_valid_resource_names(name: str) -> None:
    assert resource_name_problem(name) is None


@settings(max_examples=200, deadline=None)
@given(
    key=st.sampled_from(["resourceName", "rdmaHcaMax", "mode", "unhealthyWhen", "selectors",
                         "nonHostNetwork", "healthPollSeconds", "resendSeconds",
                         "metricsAddress", "logFormat", "cdi", "pools", "ncclEnv", "dra",
                         "http", "devicePlugin", "readDeadlineSeconds", "logLevel"]),
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=6,
    ),
)
def test_garbage_values_never_crash(tmp_path_factory: pytest.TempPathFactory, key: str,
                                    value: object) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(yaml.safe_dump({key: value}))
    try:
        load_settings(str(path), {}, {})
    except ConfigError as exc:
        # The error names the key that was wrong (or a key inside it).
        assert exc.field_name.startswith(key)


# --- settings added for the read deadline, the kubelet root, the node name, DRA, HTTP ----


def test_new_settings_defaults() -> None:
    s = load_settings(None, {}, {})
    assert s.read_deadline_seconds == 5.0
    assert s.kubelet_root == "/var/lib/kubelet"
    assert s.plugins_registry_dir == "/var/lib/kubelet/plugins_registry"
    assert s.plugins_dir == "/var/lib/kubelet/plugins"
    assert s.node_name == ""
    assert (s.dra.enabled, s.dra.driver_name, s.dra.selectors) == (False, "rdma-hca.io",
                                                                   Selectors())
    assert s.http.max_connections == 64
    assert s.device_plugin_enabled is True and len(s.pools) == 1


def test_kubelet_dirs_derive_from_the_root_and_kubelet_dir_still_wins() -> None:
    s = load_settings(None, {"RDMA_HCA_KUBELET_ROOT": "/var/lib/k0s/kubelet"}, {})
    assert s.kubelet_dir == "/var/lib/k0s/kubelet/device-plugins"
    assert s.plugins_registry_dir == "/var/lib/k0s/kubelet/plugins_registry"
    assert s.plugins_dir == "/var/lib/k0s/kubelet/plugins"
    s = load_settings(None, {}, {"kubeletRoot": "/k", "kubeletDir": "/elsewhere/dp"})
    assert (s.kubelet_dir, s.plugins_registry_dir) == ("/elsewhere/dp", "/k/plugins_registry")
    # Made directly (tests, demo), the same derivation applies.
    assert Settings(kubelet_root="/r").kubelet_dir == "/r/device-plugins"
    assert Settings(kubelet_dir="/x").kubelet_dir == "/x"


def test_node_name_from_its_variable_then_node_name_then_flag() -> None:
    assert load_settings(None, {"NODE_NAME": "gpu-1"}, {}).node_name == "gpu-1"
    env = {"NODE_NAME": "gpu-1", "RDMA_HCA_NODE_NAME": "gpu-2"}
    assert load_settings(None, env, {}).node_name == "gpu-2"
    assert load_settings(None, env, {"nodeName": "gpu-3"}).node_name == "gpu-3"
    with pytest.raises(ConfigError, match="DNS subdomain"):
        load_settings(None, {"NODE_NAME": "GPU_1"}, {})


def test_node_name_is_not_a_file_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set by flag or variable only"):
        load_settings(write(tmp_path, "nodeName: gpu-1\n"), {}, {})


@pytest.mark.parametrize(("text", "env", "flags", "field", "fragment"), [
    ("readDeadlineSeconds: 0.01\n", {}, {}, "readDeadlineSeconds", "0.1 to 60"),
    ("", {"RDMA_HCA_READ_DEADLINE_SECONDS": "61"}, {}, "readDeadlineSeconds", "0.1 to 60"),
    ("http: {maxConnections: 0}\n", {}, {}, "http.maxConnections", "1 to 4096"),
    ("", {}, {"http.maxConnections": "5000"}, "http.maxConnections", "1 to 4096"),
    ("dra: {driverName: Not_A_Name}\n", {}, {}, "dra.driverName", "DNS subdomain"),
    ("dra: {driverName: " + "a" * 64 + "}\n", {}, {}, "dra.driverName", "63"),
    ("dra: {colour: red}\n", {}, {}, "dra.colour", "unknown key"),
    ("dra: {selectors: {names: [1]}}\n", {}, {}, "dra.selectors.names", "non-empty strings"),
    ("", {"RDMA_HCA_DRA_ENABLED": "maybe"}, {}, "dra.enabled", "true or false"),
    ("devicePlugin: {enabled: false}\n", {}, {}, "devicePlugin.enabled", "dra.enabled"),
])
def test_new_settings_bad_values(tmp_path: Path, text: str, env: dict[str, str],
                                 flags: dict[str, object], field: str, fragment: str) -> None:
    cfg = write(tmp_path, text) if text else None
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, env, flags)
    assert err.value.field_name == field
    assert fragment in str(err.value)


def test_new_settings_from_every_layer(tmp_path: Path) -> None:
    cfg = write(tmp_path, "readDeadlineSeconds: 2\nhttp: {maxConnections: 10}\n"
                          "dra: {driverName: hca.example.com}\n")
    s = load_settings(cfg, {"RDMA_HCA_HTTP_MAX_CONNECTIONS": "20"}, {"readDeadlineSeconds": "3"})
    assert (s.read_deadline_seconds, s.http.max_connections) == (3.0, 20)
    assert s.dra.driver_name == "hca.example.com"


# --- DRA beside the device plugin: never the same HCA twice --------------------------------


def test_dra_alone(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, "devicePlugin: {enabled: false}\ndra: {enabled: true}\n"),
                      {}, {})
    assert s.pools == () and s.dra.enabled
    s = load_settings(None, {"RDMA_HCA_DEVICE_PLUGIN_ENABLED": "false"}, {"dra.enabled": True})
    assert s.pools == () and s.dra.enabled


def test_dra_beside_disjoint_pools(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, """
dra: {enabled: true, selectors: {names: ["mlx5_[4-7]"]}}
pools:
  - resourceName: rdma/hca
    selectors: {names: ["mlx5_[0-3]"]}
"""), {}, {})
    assert s.dra.selectors.names == ("mlx5_[4-7]",)
    # Names on one side, a driver on the other: only the node can tell; allowed here.
    s = load_settings(write(tmp_path, """
dra: {enabled: true, selectors: {drivers: [erdma]}}
selectors: {names: [mlx5_0]}
"""), {}, {})
    assert s.pools[0].selectors.names == ("mlx5_0",)


@pytest.mark.parametrize(("text", "env", "flags", "fragment"), [
    ("", {}, {"dra.enabled": True}, "the pool rdma/hca takes every HCA"),
    ("", {"RDMA_HCA_DRA_ENABLED": "true"}, {}, "environment variable RDMA_HCA_DRA_ENABLED"),
    ("selectors: {names: [mlx5_0]}\ndra: {enabled: true}\n", {}, {},
     "dra.selectors is empty"),
    ("selectors: {names: ['mlx5_*']}\ndra: {enabled: true, selectors: {names: [mlx5_3]}}\n",
     {}, {}, "select the same HCA names"),
    ("pools:\n  - {resourceName: a.io/x, selectors: {names: [mlx5_0]}}\n"
     "  - {resourceName: a.io/y, selectors: {names: [mlx5_1]}}\n"
     "dra: {enabled: true, selectors: {names: [mlx5_1]}}\n", {}, {}, "a.io/y"),
])
def test_dra_overlapping_a_pool_is_refused(tmp_path: Path, text: str, env: dict[str, str],
                                           flags: dict[str, object], fragment: str) -> None:
    cfg = write(tmp_path, text) if text else None
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, env, flags)
    assert err.value.field_name == "dra.enabled"
    assert fragment in str(err.value)
    assert "devicePlugin.enabled: false" in str(err.value)  # the fix is named


def test_same_names_told_apart_by_driver_are_allowed(tmp_path: Path) -> None:
    cfg = write(tmp_path, "selectors: {names: ['mlx5_*'], drivers: [mlx5_core]}\n"
                          "dra: {enabled: true, selectors: {names: [mlx5_3], drivers: [x]}}\n")
    assert load_settings(cfg, {}, {}).dra.enabled


def _hca(name: str, driver: str = "mlx5_core") -> Hca:
    return Hca(name=name, driver=driver, node_guid=None, fw_ver=None, board_id=None,
               hca_type=None, pci_address=None, pci_vendor="0x15b3", pci_device="0x101d",
               numa_node=None, ports=(), uverbs=None)


def test_overlapping_hcas_after_discovery(tmp_path: Path) -> None:
    cfg = write(tmp_path, "selectors: {drivers: [mlx5_core]}\n"
                          "dra: {enabled: true, selectors: {names: ['mlx5_1*']}}\n")
    s = load_settings(cfg, {}, {})
    hcas = [_hca("mlx5_0"), _hca("mlx5_1"), _hca("mlx5_10"), _hca("mlx5_11", "other")]
    assert overlapping_hcas(s, hcas) == {"mlx5_1": ["pool rdma/hca", "dra"],
                                         "mlx5_10": ["pool rdma/hca", "dra"]}
    assert [h.name for h in selected_hcas(s, hcas)] == ["mlx5_0", "mlx5_1", "mlx5_10",
                                                        "mlx5_11"]
    plain = load_settings(None, {}, {})
    assert overlapping_hcas(plain, hcas) == {}
    assert [h.name for h in selected_hcas(plain, hcas)] == [h.name for h in hcas]


# --- warnings: looks like it applies and does not -------------------------------------------


def test_unknown_variables_are_warned_about_with_the_likely_name() -> None:
    s = load_settings(None, {"RDMA_HCA_SYSFS_ROT": "/x", "RDMA_HCA_ZZZ": "1",
                             "RDMA_HCA_DEVICES": "mlx5_0", "RDMA_HCA_CONFIG": "",
                             "OTHER": "1"}, {})
    assert list(s.warnings) == [
        "unknown environment variable RDMA_HCA_SYSFS_ROT is ignored; "
        "did you mean RDMA_HCA_SYSFS_ROOT?",
        "unknown environment variable RDMA_HCA_ZZZ is ignored; "
        "docs/configuration.md lists the variables",
    ]
    assert env_warnings({"RDMA_HCA_MODE": "shared", "NODE_NAME": "n"}) == []


def test_top_level_values_pools_override_are_warned_about(tmp_path: Path) -> None:
    cfg = write(tmp_path, """
mode: exclusive
unhealthyWhen: all
pools:
  - {resourceName: a.io/x, mode: shared}
  - {resourceName: a.io/y, mode: shared, unhealthyWhen: any}
""")
    s = load_settings(cfg, {"RDMA_HCA_UNHEALTHY_WHEN": "all"}, {"rdmaHcaMax": "7"})
    assert [str(p.mode) for p in s.pools] == ["shared", "shared"]
    warned = "\n".join(s.warnings)
    assert "mode=exclusive (from config file" in warned and "every pool sets its own mode" \
        in warned
    assert ("unhealthyWhen=all (from environment variable RDMA_HCA_UNHEALTHY_WHEN) does not "
            "apply to pools[1].unhealthyWhen") in warned
    assert "rdmaHcaMax" not in warned  # no pool overrides it: it applies to both
    assert [p.rdma_hca_max for p in s.pools] == [7, 7]
    assert len(s.warnings) == 2


def test_file_defaults_that_some_pools_override_are_not_warned_about(tmp_path: Path) -> None:
    cfg = write(tmp_path, """
unhealthyWhen: all
pools:
  - {resourceName: a.io/x}
  - {resourceName: a.io/y, unhealthyWhen: any}
""")
    assert load_settings(cfg, {}, {}).warnings == ()


def test_non_string_keys_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key"):
        load_settings(write(tmp_path, "1: a\nmode: shared\n"), {}, {})


def test_huge_values_make_short_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, "mode: " + "x" * 100_000 + "\n"), {}, {})
    assert len(str(err.value)) < 300
