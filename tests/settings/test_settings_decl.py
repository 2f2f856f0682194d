"""The settings declaration is the one source: flags, variables, defaults and docs follow it."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from rdma_hca.settings import decl as settings_decl
from rdma_hca.settings.config import load_settings
from rdma_hca.settings.decl import SETTINGS, Kind, Scope, add_flags, flag_values, with_docs_table
from rdma_hca.settings.model import ConfigError, Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "configuration.md"


def _attr(settings: Settings, attr: str) -> object:
    obj: object = settings
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def test_names_are_unique_and_follow_the_rule() -> None:
    keys = [s.key for s in SETTINGS]
    flags = [s.flag for s in SETTINGS if s.flag]
    envs = [e for s in SETTINGS for e in s.env]
    assert len(set(keys)) == len(keys)
    assert len(set(flags)) == len(flags)
    assert len(set(envs)) == len(envs)
    for s in SETTINGS:
        if s.env:
            assert s.env[0] == settings_decl.env_name(s.key)
        if s.flag:
            assert s.flag == settings_decl.flag_name(s.key)
    # The names other code and the chart rely on.
    assert settings_decl.BY_KEY["cdi.enabled"].flag == "--cdi"
    assert settings_decl.BY_KEY["dra.enabled"].flag == "--dra"
    assert settings_decl.BY_KEY["dra.enabled"].env == ("RDMA_HCA_DRA_ENABLED",)
    assert settings_decl.BY_KEY["rdmaHcaMax"].env == ("RDMA_HCA_RDMA_HCA_MAX",)
    assert settings_decl.BY_KEY["nodeName"].env == ("RDMA_HCA_NODE_NAME", "NODE_NAME")
    assert settings_decl.BY_KEY["kubeletRoot"].flag == "--kubelet-root"


def test_declared_defaults_are_the_settings_defaults() -> None:
    plain = Settings()
    pool = plain.pools[0]
    for s in SETTINGS:
        if s.default is None or s.kind in (Kind.SELECTORS, Kind.POOLS):
            continue
        value = _attr(pool if s.scope is Scope.POOL else plain, s.attr)
        assert value == s.default, s.key


def test_every_settings_field_is_declared() -> None:
    declared = {s.attr.split(".")[0] for s in SETTINGS if s.scope is not Scope.POOL}
    # Derived from kubeletRoot, or bookkeeping of the loader itself.
    derived = {"pools", "plugins_registry_dir", "plugins_dir", "config_file", "warnings",
               "sources"}
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert fields - derived == declared - {"pools"}


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.env], ids=lambda s: s.key)
def test_every_variable_reaches_its_setting(setting: settings_decl.Setting) -> None:
    """Each variable sets its attribute: an invalid value is refused naming it."""
    with pytest.raises(ConfigError) as err:
        load_settings(None, {setting.env[0]: "\0not valid\0"}, {})
    assert setting.env[0] in str(err.value)
    assert str(err.value).startswith(setting.key + ":")


def test_flags_come_from_the_declaration() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    options = {o for a in parser._actions for o in a.option_strings}
    for s in SETTINGS:
        if s.flag:
            assert s.flag in options
            if s.kind is Kind.BOOL:
                assert "--no-" + s.flag[2:] in options
    args = parser.parse_args(["--kubelet-root", "/k", "--no-device-plugin", "--dra",
                              "--http-max-connections", "5", "--read-deadline-seconds", "2"])
    values = {k: v for k, v in flag_values(args).items() if v is not None}
    assert values == {"kubeletRoot": "/k", "devicePlugin.enabled": False, "dra.enabled": True,
                      "http.maxConnections": "5", "readDeadlineSeconds": "2"}
    s = load_settings(None, {}, values)
    assert (s.kubelet_root, s.pools, s.dra.enabled) == ("/k", (), True)
    assert (s.http.max_connections, s.read_deadline_seconds) == (5, 2.0)


def test_docs_table_matches_the_declaration() -> None:
    page = DOCS.read_text(encoding="utf-8")
    assert page == with_docs_table(page), (
        "docs/configuration.md is out of date: run .venv/bin/python scripts/gen-config-docs.py")
    for s in SETTINGS:
        assert f"`{s.key}`" in page
        for e in s.env:
            assert f"`{e}`" in page


def test_docs_table_changes_with_the_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    page = DOCS.read_text(encoding="utf-8")
    extra = settings_decl._s("brandNew", Kind.INT, 3, "a new knob", minimum=1, maximum=9)
    monkeypatch.setattr(settings_decl, "SETTINGS", (*SETTINGS, extra))
    regenerated = with_docs_table(page)
    assert regenerated != page
    assert "`RDMA_HCA_BRAND_NEW`" in regenerated and "`--brand-new`" in regenerated


def test_the_generator_script_checks_and_rewrites(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "gen-config-docs.py"
    result = subprocess.run([sys.executable, str(script), "--check"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    spec = importlib.util.spec_from_file_location("gen_config_docs", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stale = tmp_path / "configuration.md"
    stale.write_text(DOCS.read_text().replace("`RDMA_HCA_MODE`", "`RDMA_HCA_MOOD`"))
    module.PAGE = stale
    assert module.main(["--check"]) == 1
    assert module.main([]) == 0
    assert stale.read_text() == DOCS.read_text()
