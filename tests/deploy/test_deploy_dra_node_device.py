"""The chart's dra.nodeDevice and dra.defaultBandwidth: written into the daemon's config,
held to the declaration by the schema, and the extended class following the first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import CHART, RenderFn, ensure_helm, run_helm, set_args
from test_deploy_chart import config
from test_deploy_guard import rendered_notes
from vap_emulator import device_selected

from rdma_hca.daemon.dra.devices import NODE_DEVICE, DeviceOffer
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.config import load_settings
from rdma_hca.settings.model import Mode

ALONE = {"dra.enabled": "true", "devicePlugin.enabled": "false", "dra.driverName": "rdma-hca.io"}


def _selected(objs: list[dict[str, Any]], name: str, devices: list[dict[str, Any]]) -> set[str]:
    (cls,) = [o for o in objs if o["kind"] == "DeviceClass" and o["metadata"]["name"] == name]
    return {d["name"] for d in devices
            if all(device_selected(s["cel"]["expression"], "rdma-hca.io", d)
                   for s in cls["spec"]["selectors"])}


def test_the_defaults_keep_the_node_device_and_no_default_share(render: RenderFn) -> None:
    dra = config(render(ALONE))["dra"]
    assert dra["nodeDevice"] is True and dra["defaultBandwidth"] == "0"


def test_the_values_reach_the_daemon(render: RenderFn, tmp_path: Path) -> None:
    objs = render({**ALONE, "dra.nodeDevice": "false", "dra.defaultBandwidth": "100G"})
    written = config(objs)
    assert written["dra"]["nodeDevice"] is False and written["dra"]["defaultBandwidth"] == "100G"
    # What the template wrote, the daemon loads.
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(written))
    settings = load_settings(str(path), {}, {})
    assert (settings.dra.node_device, settings.dra.default_bandwidth) == (False, 100 * 10**9)
    # --set of a bare number is an integer to helm: it is written as the daemon reads it.
    objs = render({**ALONE, "dra.defaultBandwidth": "0"})
    assert config(objs)["dra"]["defaultBandwidth"] == "0"


@pytest.mark.parametrize("value", ["100Gi", "1.5", "-1G", "fast", "7"])
def test_the_schema_refuses_a_bandwidth_the_daemon_refuses(value: str) -> None:
    args = set_args({**ALONE, "dra.defaultBandwidth": value})
    result = run_helm(ensure_helm(), "template", "x", str(CHART), *args)
    assert result.returncode != 0
    assert "defaultBandwidth" in result.stderr


def test_without_the_node_device_the_extended_class_gives_one_hca_per_unit(
        render: RenderFn, tmp_path: Path) -> None:
    node = gpu_node(tmp_path / "n", hcas=4, gid_table_size=8)
    inventory = discover_node(node.sysfs_root, node.dev_root)
    on = list(DeviceOffer.build(inventory.hcas, "rdma-hca.io", Mode.SHARED, True,
                                inventory.rdma_cm).devices)
    off = list(DeviceOffer.build(inventory.hcas, "rdma-hca.io", Mode.SHARED, True,
                                 inventory.rdma_cm, node_device_on=False).devices)
    hcas = {d["name"] for d in off}
    assert NODE_DEVICE not in hcas and len(hcas) == 5
    objs = render({**ALONE, "dra.nodeDevice": "false"})
    assert _selected(objs, "rdma-hca.io-extended", [dict(d) for d in off]) == hcas
    assert _selected(objs, "rdma-hca.io", [dict(d) for d in off]) == hcas
    # Kept on: the extended class takes the node-wide device only, as before.
    objs = render(ALONE)
    assert _selected(objs, "rdma-hca.io-extended", [dict(d) for d in on]) == {NODE_DEVICE}


def test_the_notes_say_what_the_extended_resource_then_means(tmp_path: Path) -> None:
    helm = ensure_helm()
    sub = "ack-rdma-device-plugin."  # the notes render inside a parent chart

    def notes(where: str, values: dict[str, str]) -> str:
        return rendered_notes(helm, tmp_path / where,
                              *set_args({sub + k: v for k, v in values.items()}))

    off = notes("a", {**ALONE, "dra.nodeDevice": "false"})
    assert "dra.nodeDevice is false: each unit of rdma/hca is one HCA" in off
    on = notes("b", ALONE)
    assert "DeviceClass rdma-hca.io-extended" in on and "dra.nodeDevice" not in on
