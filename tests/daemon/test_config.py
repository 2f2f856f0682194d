"""Settings: layering of file, environment and flags, and an exact error for every bad value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rdma_hca.daemon.config import (
    ConfigError,
    Mode,
    UnhealthyWhen,
    load_settings,
    validate_resource_name,
)


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
                          "  drivers: mlx5_core\n")
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
    assert validate_resource_name(name) is None


@settings(max_examples=200, deadline=None)
@given(
    key=st.sampled_from(["resourceName", "rdmaHcaMax", "mode", "unhealthyWhen", "selectors",
                         "nonHostNetwork", "healthPollSeconds", "resendSeconds",
                         "metricsAddress", "logFormat", "cdi", "pools", "ncclEnv"]),
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
