"""Inputs refused with one line that names the value, where it came from and the fix."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.settings.checks import kubelet_root_problem
from rdma_hca.settings.config import load_settings
from rdma_hca.settings.decl import SETTINGS, Kind, Scope, Setting
from rdma_hca.settings.model import ConfigError, Settings

ENUMS = [s for s in SETTINGS if s.kind is Kind.ENUM]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def typed(settings: Settings, s: Setting) -> Any:
    if s.scope is Scope.POOL:
        return getattr(settings.pools[0], s.attr)
    obj: Any = settings
    for part in s.attr.split("."):
        obj = getattr(obj, part)
    return obj


def file_text(s: Setting, value: str) -> str:
    group, _, sub = s.key.rpartition(".")
    return f"{group}:\n  {sub}: {value}\n" if group else f"{s.key}: {value}\n"


def test_every_enum_setting_declares_its_type() -> None:
    assert {s.key for s in ENUMS} >= {"mode", "unhealthyWhen", "dra.mode", "logFormat",
                                      "logLevel"}
    for s in ENUMS:
        assert s.enum is not None and s.choices == tuple(e.value for e in s.enum)


@pytest.mark.parametrize("layer", ["file", "env", "flag"])
@pytest.mark.parametrize("s", ENUMS, ids=lambda s: s.key)
def test_every_enum_setting_is_its_enum_whichever_layer_gave_it(
        tmp_path: Path, s: Setting, layer: str) -> None:
    assert s.enum is not None
    for choice in s.choices:
        # dra.mode and the pools' mode only load with DRA beside disjoint pools or alone.
        base = {"dra.enabled": True, "devicePlugin.enabled": False} if s.key == "dra.mode" \
            else {}
        if layer == "file":
            got = load_settings(write(tmp_path, file_text(s, choice)), {}, base)
        elif layer == "env":
            got = load_settings(None, {s.env[0]: choice}, base)
        else:
            got = load_settings(None, {}, {**base, s.key: choice})
        value = typed(got, s)
        assert type(value) is s.enum and value is s.enum(choice), (s.key, layer, value)
    default = typed(load_settings(None, {}, {}), s)
    assert isinstance(default, StrEnum) and type(default) is s.enum


@pytest.mark.parametrize("layer", ["file", "env", "flag"])
def test_enum_values_exactly_as_documented(tmp_path: Path, layer: str) -> None:
    with pytest.raises(ConfigError) as err:
        if layer == "file":
            load_settings(write(tmp_path, "mode: Shared\n"), {}, {})
        elif layer == "env":
            load_settings(None, {"RDMA_HCA_MODE": "Shared"}, {})
        else:
            load_settings(None, {}, {"mode": "Shared"})
    assert str(err.value).startswith("mode: 'Shared' (from ")
    assert "shared or exclusive, written exactly so: did you mean shared?" in str(err.value)


@pytest.mark.parametrize("value", ['"yes"', "'true'", "1", "0", "on_", '""'])
def test_file_booleans_only_as_yaml_booleans(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match=r"^nonHostNetwork: .* \(from config file .*\) is not "
                                          "valid: true or false, a YAML boolean without quotes"):
        load_settings(write(tmp_path, f"nonHostNetwork: {value}\n"), {}, {})


def test_file_booleans_as_yaml_booleans_are_taken(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "nonHostNetwork: true\n"), {}, {}).non_host_network
    assert not load_settings(write(tmp_path, "nonHostNetwork: false\n"), {},
                             {}).non_host_network


def test_variable_booleans_are_the_words_true_and_false() -> None:
    assert load_settings(None, {"RDMA_HCA_NON_HOST_NETWORK": "true"}, {}).non_host_network
    assert not load_settings(None, {"RDMA_HCA_NON_HOST_NETWORK": "False"}, {}).non_host_network
    for word in ("yes", "1", "on", ""):
        with pytest.raises(ConfigError, match="from environment variable "
                                              "RDMA_HCA_NON_HOST_NETWORK"):
            load_settings(None, {"RDMA_HCA_NON_HOST_NETWORK": word}, {})


def test_selector_values_only_as_lists(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^selectors\.names: 'mlx5_0' .* a list of non-empty "
                                          r"strings: write \[mlx5_0\]$"):
        load_settings(write(tmp_path, "selectors: {names: mlx5_0}\n"), {}, {})
    with pytest.raises(ConfigError, match=r"^pools\[0\]\.selectors\.drivers: 'mlx5_core'"):
        load_settings(write(tmp_path, "pools:\n- resourceName: rdma/a\n"
                                      "  selectors: {drivers: mlx5_core}\n"), {}, {})


@pytest.mark.parametrize(("text", "key", "first", "second"), [
    ("mode: shared\nrdmaHcaMax: 10\nmode: exclusive\n", "mode", 1, 3),
    ("cdi:\n  enabled: true\n  specDir: /a\n  enabled: false\n", "enabled", 2, 4),
    ("pools:\n- resourceName: rdma/a\n  selectors:\n    names: [a]\n    names: [b]\n",
     "names", 4, 5),
    ("selectors: {names: [a], names: [b]}\n", "names", 1, 1),
])
def test_duplicate_keys_are_refused_with_their_lines(tmp_path: Path, text: str, key: str,
                                                     first: int, second: int) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, text), {}, {})
    assert f"the key {key!r} is given twice, at line {first} and at line {second}" \
        in str(err.value)


def test_same_key_in_different_mappings_is_fine(tmp_path: Path) -> None:
    text = ("pools:\n- resourceName: rdma/a\n  selectors: {names: [mlx5_0]}\n"
            "- resourceName: rdma/b\n  selectors: {names: [mlx5_1]}\n")
    s = load_settings(write(tmp_path, text), {}, {})
    assert [p.resource_name for p in s.pools] == ["rdma/a", "rdma/b"]


@pytest.mark.parametrize("key", [s.key for s in SETTINGS if s.scope is Scope.MACHINE])
def test_machine_settings_in_the_file_are_set_by_flag_or_variable(tmp_path: Path,
                                                                  key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, f"{key}: /x\n"), {}, {})
    text = str(err.value)
    assert "set by flag or variable only" in text and "unknown key" not in text
    flag = next(s.flag for s in SETTINGS if s.key == key)
    assert f"flag {flag}" in text


def test_machine_setting_in_a_pool_says_the_same(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^pools\[0\]\.sysfsRoot: .* set by flag or variable "
                                          r"only \(flag --sysfs-root or variable "
                                          "RDMA_HCA_SYSFS_ROOT\\)"):
        load_settings(write(tmp_path, "pools:\n- resourceName: rdma/a\n  sysfsRoot: /x\n"),
                      {}, {})


def test_config_file_errors_name_the_layer_that_gave_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, {"RDMA_HCA_CONFIG": str(tmp_path / "nope.yaml")}, {})
    assert str(err.value).startswith("RDMA_HCA_CONFIG: ")
    assert "no such file" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_settings(str(tmp_path / "nope.yaml"), {}, {})
    assert str(err.value).startswith("--config: ")
    (tmp_path / "dup.yaml").write_text("mode: shared\nmode: shared\n")
    with pytest.raises(ConfigError, match=r"^RDMA_HCA_CONFIG: .* given twice"):
        load_settings(None, {"RDMA_HCA_CONFIG": str(tmp_path / "dup.yaml")}, {})


@pytest.mark.parametrize(("text", "why"), [
    ("pools:\n- resourceName: rdma/a\n  mode: exclusive\n- resourceName: rdma/b\n",
     "the exclusive pool rdma/a and the pool rdma/b would both hold every HCA (the pool "
     "rdma/a takes every HCA)"),
    ("pools:\n- resourceName: rdma/a\n  selectors: {names: [mlx5_0, mlx5_1]}\n"
     "- resourceName: rdma/b\n  mode: exclusive\n  selectors: {names: ['mlx5_*']}\n",
     "the exclusive pool rdma/b and the pool rdma/a would both hold the HCAs mlx5_0, mlx5_1 "
     "(both select the same HCA names)"),
    ("mode: exclusive\npools:\n- resourceName: rdma/a\n  selectors: {names: [mlx5_0]}\n"
     "- resourceName: rdma/b\n  mode: shared\n  selectors: {names: [mlx5_0]}\n",
     "the exclusive pool rdma/a and the pool rdma/b would both hold the HCA mlx5_0 (both"),
    # A glob and the literal it matches: the literal is what both hold.
    ("pools:\n- resourceName: rdma/a\n  mode: exclusive\n  selectors: {names: ['mlx5_?', eth0]}\n"
     "- resourceName: rdma/b\n  selectors: {names: [mlx5_3, 'mlx5_?']}\n",
     "would both hold the HCAs mlx5_3, mlx5_? (both select"),
])
def test_an_exclusive_pool_and_another_holding_a_same_hca_are_refused(
        tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, text), {}, {})
    assert str(err.value).startswith("pools: ")
    assert why in str(err.value) and "\n" not in str(err.value)


def test_shared_pools_may_overlap_and_told_apart_ones_pass(tmp_path: Path) -> None:
    shared = ("pools:\n- resourceName: rdma/a\n- resourceName: rdma/b\n"
              "  selectors: {names: [mlx5_0]}\n")
    assert len(load_settings(write(tmp_path, shared), {}, {}).pools) == 2
    apart = ("pools:\n- resourceName: rdma/a\n  mode: exclusive\n  selectors: {names: [mlx5_0]}\n"
             "- resourceName: rdma/b\n  selectors: {names: [mlx5_1]}\n")
    assert len(load_settings(write(tmp_path, apart), {}, {}).pools) == 2


def test_kubelet_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert kubelet_root_problem(str(tmp_path / "file")) == (
        f"{tmp_path / 'file'} is not a directory: give the kubelet's root directory, e.g. "
        "/var/lib/kubelet")
    assert kubelet_root_problem(str(tmp_path)) is None
    assert kubelet_root_problem(str(tmp_path / "not-yet")) is None
