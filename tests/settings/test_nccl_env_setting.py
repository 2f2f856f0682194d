"""ncclEnv: an enum whichever layer gives it, and the boolean spellings of earlier releases."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdma_hca.cli import build_parser, settings_from_args
from rdma_hca.settings.config import load_settings
from rdma_hca.settings.model import ConfigError, NcclEnv


def test_the_default_is_auto() -> None:
    assert load_settings(None, {}, {}).nccl_env is NcclEnv.AUTO


@pytest.mark.parametrize(("text", "want"), [
    ("auto", NcclEnv.AUTO), ("hca", NcclEnv.HCA), ("off", NcclEnv.OFF),
    ("true", NcclEnv.HCA), ("false", NcclEnv.OFF),
])
def test_file_variable_and_flag_give_the_same_enum(tmp_path: Path, text: str,
                                                   want: NcclEnv) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(f"ncclEnv: {text}\n")
    assert load_settings(str(file), {}, {}).nccl_env is want
    assert load_settings(None, {"RDMA_HCA_NCCL_ENV": text}, {}).nccl_env is want
    args = build_parser().parse_args(["serve", "--nccl-env", text])
    assert settings_from_args(args, {}).nccl_env is want


def test_a_yaml_boolean_keeps_its_old_meaning(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    for raw, want in (("yes", NcclEnv.HCA), ("no", NcclEnv.OFF)):
        file.write_text(f"ncclEnv: {raw}\n")  # YAML 1.1 booleans, as true/false
        assert load_settings(str(file), {}, {}).nccl_env is want


def test_a_choice_is_written_exactly_as_documented() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, {"RDMA_HCA_NCCL_ENV": "Off"}, {})
    assert "did you mean off?" in str(err.value)


def test_a_bad_value_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, {"RDMA_HCA_NCCL_ENV": "always"}, {})
    assert "ncclEnv" in str(err.value) and "auto, hca or off" in str(err.value)
