"""dra.nodeDevice and dra.defaultBandwidth from every layer, and the values serve refuses
with one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdma_hca import cli
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.settings.config import ConfigError, load_settings

G = 10**9


def test_the_defaults_keep_the_node_device_and_hold_no_bandwidth() -> None:
    s = load_settings(None, {}, {})
    assert (s.dra.node_device, s.dra.default_bandwidth) == (True, 0)
    config = DriverConfig.from_settings(s)
    assert (config.node_device, config.default_bandwidth) == (True, 0)


@pytest.mark.parametrize(("text", "bits"), [
    ("0", 0), ("100G", 100 * G), ("1.6T", 1600 * G), ("400000000000", 400 * G),
    (" 25G ", 25 * G), ("1e9", G),
])
def test_a_bandwidth_is_a_quantity_in_whole_g(text: str, bits: int) -> None:
    s = load_settings(None, {"RDMA_HCA_DRA_DEFAULT_BANDWIDTH": text}, {})
    assert s.dra.default_bandwidth == bits
    assert DriverConfig.from_settings(s).default_bandwidth == bits


def test_the_file_and_the_flags_set_them(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("dra:\n  nodeDevice: false\n  defaultBandwidth: 50G\n")
    s = load_settings(str(path), {}, {})
    assert (s.dra.node_device, s.dra.default_bandwidth) == (False, 50 * G)
    path.write_text("dra:\n  defaultBandwidth: 0\n")  # a YAML integer
    assert load_settings(str(path), {}, {}).dra.default_bandwidth == 0
    flags = {"dra.nodeDevice": True, "dra.defaultBandwidth": "200G"}
    s = load_settings(str(path), {"RDMA_HCA_DRA_NODE_DEVICE": "false"}, flags)
    assert (s.dra.node_device, s.dra.default_bandwidth) == (True, 200 * G)


@pytest.mark.parametrize(("text", "why"), [
    ("-1G", "in whole G"), ("1.5G", "not a whole number of G"),
    ("100Gi", "Gi and Ti are binary"), ("fast", "in whole G"), ("5", "not a whole number"),
])
def test_a_bad_bandwidth_is_refused_naming_the_setting(text: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, {"RDMA_HCA_DRA_DEFAULT_BANDWIDTH": text}, {})
    message = str(err.value)
    assert message.startswith("dra.defaultBandwidth: ")
    assert "RDMA_HCA_DRA_DEFAULT_BANDWIDTH" in message and why in message


def test_a_yaml_boolean_is_not_a_bandwidth(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("dra:\n  defaultBandwidth: true\n")
    with pytest.raises(ConfigError, match=r"^dra\.defaultBandwidth: True"):
        load_settings(str(path), {}, {})


@pytest.mark.parametrize("argv", [
    ["--dra-default-bandwidth", "1.5G"],
    ["--dra-default-bandwidth=-100G"],
    ["--dra-default-bandwidth", "100Gi"],
])
def test_serve_exits_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                     argv: list[str]) -> None:
    code = cli.main(["serve", "--dra", "--no-device-plugin", *argv], env={})
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("rdma-hca serve: config error: dra.defaultBandwidth: ")
    assert "(from flag --dra-default-bandwidth)" in err


def test_serve_refuses_a_node_device_that_is_not_a_boolean(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["serve", "--dra", "--no-device-plugin"],
                    env={"RDMA_HCA_DRA_NODE_DEVICE": "maybe"})
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("rdma-hca serve: config error: dra.nodeDevice: 'maybe'")
