"""load_settings records the layer that gave each value; errors after loading name it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdma_hca.settings.checks import check_roots, setting_source
from rdma_hca.settings.config import load_settings
from rdma_hca.settings.model import ConfigError


def test_each_value_knows_its_layer(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("mode: exclusive\n")
    s = load_settings(str(config), {"RDMA_HCA_DEV_ROOT": "/d", "RDMA_HCA_SYSFS_ROOT": "/s"},
                      {"sysfsRoot": "/f"})
    assert setting_source(s, "mode") == f"config file {config}"
    assert setting_source(s, "devRoot") == "environment variable RDMA_HCA_DEV_ROOT"
    assert setting_source(s, "sysfsRoot") == "flag --sysfs-root"  # the flag beat the variable
    assert setting_source(s, "kubeletRoot") == "the default"
    assert setting_source(s, "kubeletDir") == ("<kubeletRoot>/device-plugins, kubeletRoot from "
                                               "the default")


def test_check_roots_checks_only_the_keys_asked_for(tmp_path: Path) -> None:
    s = load_settings(None, {}, {"sysfsRoot": str(tmp_path / "gone"), "devRoot": str(tmp_path)})
    check_roots(s, ["devRoot"])
    with pytest.raises(ConfigError) as err:
        check_roots(s)
    assert (err.value.field_name, err.value.source) == ("sysfsRoot", "flag --sysfs-root")
