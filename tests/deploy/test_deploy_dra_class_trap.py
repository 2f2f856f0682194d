"""The DeviceClass trap: with the node-wide device on, the NOTES warn that a DeviceClass
written as DRA guides show it (`device.driver == ...` alone) also matches `all-hcas`, and the
fix they give selects HCAs only; values reused from a chart without `dra.nodeDevice` keep the
node-wide device."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import CHART, RenderFn, run_helm, set_args
from test_deploy_chart import config
from test_deploy_dra import _GPU, _OLD, _published
from test_deploy_guard import rendered_notes
from vap_emulator import device_selected

from rdma_hca.settings.model import Mode

ALONE = {"dra.enabled": "true", "devicePlugin.enabled": "false"}
OFF = {**ALONE, "dra.nodeDevice": "false"}
SUB = "ack-rdma-device-plugin."


def _classes(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "DeviceClass"}


def _notes(helm: Path, tmp_path: Path, values: dict[str, str]) -> str:
    return rendered_notes(helm, tmp_path, *set_args({SUB + k: v for k, v in values.items()}))




def test_exclusive_keeps_its_extended_class_whatever_node_device_says(
        render: RenderFn) -> None:
    """Exclusive mode has no node-wide device anyway: rdma/hca is one HCA per unit there,
    as the device plugin's exclusive mode gives."""
    objs = render({**OFF, "dra.mode": "exclusive"})
    assert set(_classes(objs)) == {"rdma-hca.io", "rdma-hca.io-extended"}


def test_values_reused_from_a_chart_without_the_key_mean_the_node_device(
        helm: Path, tmp_path: Path) -> None:
    chart = tmp_path / CHART.name
    shutil.copytree(CHART, chart)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    del values["dra"]["nodeDevice"]
    del values["dra"]["defaultBandwidth"]
    (chart / "values.yaml").write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", "x", str(chart), "--namespace", "kube-system",
                      *set_args(ALONE))
    assert result.returncode == 0, result.stderr
    objs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert set(_classes(objs)) == {"rdma-hca.io", "rdma-hca.io-extended"}
    assert config(objs)["dra"]["nodeDevice"] is True
    assert config(objs)["dra"]["defaultBandwidth"] == "0"


@pytest.mark.parametrize("value", ["yes", "1"])
def test_the_schema_takes_only_a_bool(helm: Path, value: str) -> None:
    result = run_helm(helm, "template", "x", str(CHART), *set_args(ALONE),
                      "--set-string", f"dra.nodeDevice={value}")
    assert result.returncode != 0
    assert "nodeDevice" in result.stderr



def _advised(notes: str, driver: str) -> str:
    """The selector the NOTES advise: the guides' expression and the line they add."""
    (added,) = re.findall(r"Add (&& device\.attributes\[\"[^\"]+\"\]\.kind == \"hca\")", notes)
    assert f'device.driver == "{driver}"' in notes
    return f'device.driver == "{driver}" {added}'


@pytest.mark.parametrize("driver", ["rdma-hca.io", "hca.example.com"])
def test_notes_warn_of_the_guides_device_class_and_their_fix_selects_hcas_only(
        helm: Path, tmp_path: Path, driver: str) -> None:
    notes = _notes(helm, tmp_path, {**ALONE, "dra.driverName": driver})
    assert "all-hcas" in notes and "no such key" in notes
    published = [(driver, {**d, "attributes": {k.replace("rdma-hca.io", driver): v
                                               for k, v in d["attributes"].items()}})
                 for d in _published(tmp_path, Mode.SHARED)]
    hcas = {d["name"] for _, d in published} - {"all-hcas"}
    assert len(hcas) == 13

    def selected(expression: str) -> set[str]:
        return {d["name"] for drv, d in [*published, _GPU]
                if device_selected(expression, drv, d)}

    # The trap: what every guide writes takes the whole node as "an HCA".
    assert selected(f'device.driver == "{driver}"') == hcas | {"all-hcas"}
    assert selected(_advised(notes, driver)) == hcas
    # The chart's own class agrees, and also takes a device of an older driver.
    objs = _notes_objs(helm, tmp_path / "objs", {**ALONE, "dra.driverName": driver})
    (cls,) = [c for n, c in _classes(objs).items() if n == driver]
    (selector,) = cls["selectors"]
    old = (driver, _OLD[1])
    assert {d["name"] for drv, d in [*published, _GPU, old]
            if device_selected(selector["cel"]["expression"], drv, d)} == hcas | {"old-hca"}


def _notes_objs(helm: Path, tmp_path: Path, values: dict[str, str]) -> list[dict[str, Any]]:
    result = run_helm(helm, "template", "x", str(CHART), "--namespace", "kube-system",
                      *set_args(values))
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_the_dra_doc_warns_of_the_trap_and_says_what_node_device_off_means() -> None:
    text = (CHART.parents[2] / "docs" / "dra.md").read_text()
    assert 'device.attributes["rdma-hca.io"].kind == "hca"' in text
    assert "dra.nodeDevice" in text
