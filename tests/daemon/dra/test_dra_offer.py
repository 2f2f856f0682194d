"""What the DRA driver offers follows the settings and the one health verdict.

``dra.mode`` given explicitly (file, variable or flag) once stayed a plain string and the
driver published no ``allowMultipleAllocations`` at all; and the DRA offer judged an HCA
healthy without looking at rdma_cm, where the device plugin's pool did.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rdma_hca.cli import build_parser, settings_from_args
from rdma_hca.daemon.deviceplugin.pool import select
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.model import NodeInventory
from rdma_hca.settings.config import load_settings
from rdma_hca.settings.model import Mode, PoolConfig, Settings


def _settings(layer: str, mode: str, tmp_path: Path) -> Settings:
    if layer == "file":
        file = tmp_path / "config.yaml"
        file.write_text("devicePlugin:\n  enabled: false\n"
                        f"dra:\n  enabled: true\n  mode: {mode}\n")
        return load_settings(str(file), {}, {})
    if layer == "variable":
        return load_settings(None, {"RDMA_HCA_DRA_MODE": mode, "RDMA_HCA_DRA": "true",
                                    "RDMA_HCA_DEVICE_PLUGIN": "false"}, {})
    args = build_parser().parse_args(["serve", "--dra", "--no-device-plugin",
                                      "--dra-mode", mode])
    return settings_from_args(args, {})


def _inventory(tmp_path: Path) -> NodeInventory:
    node = gpu_node(tmp_path / "node", gid_table_size=8)
    return discover_node(node.sysfs_root, node.dev_root)


@pytest.mark.parametrize("layer", ["file", "variable", "flag"])
@pytest.mark.parametrize("mode", ["shared", "exclusive"])
def test_dra_mode_from_every_layer_decides_multiple_allocations(
        tmp_path: Path, layer: str, mode: str) -> None:
    settings = _settings(layer, mode, tmp_path)
    config = DriverConfig.from_settings(settings)
    assert config.mode is Mode(mode)
    inventory = _inventory(tmp_path)
    offer = DeviceOffer.build(inventory.hcas, config.driver_name, config.mode, True,
                              inventory.rdma_cm)
    assert offer.devices
    shared = [d.get("allowMultipleAllocations") is True for d in offer.devices]
    assert all(shared) if mode == "shared" else not any(shared)


@pytest.mark.parametrize("rdma_cm", [True, False])
def test_the_dra_health_is_the_pools_verdict(tmp_path: Path, rdma_cm: bool) -> None:
    node = gpu_node(tmp_path / "node", gid_table_size=8)
    node.set_port("mlx5_1", up=False)
    if not rdma_cm:
        (node.dev_root / "infiniband" / "rdma_cm").unlink()
    inventory = discover_node(node.sysfs_root, node.dev_root)
    offer = DeviceOffer.build(inventory.hcas, "rdma-hca.io", Mode.SHARED, True, inventory.rdma_cm)
    pool = select(PoolConfig(), inventory)
    by_hca = {h.name: pool.hca_healthy(h) for h in inventory.hcas}
    health = offer.health()
    assert {h.name: health[n] for n, h in offer.hcas.items()} == by_hca
    assert by_hca["mlx5_1"] is False
    assert by_hca["mlx5_0"] is rdma_cm
    # The node-wide device: healthy while one HCA is, as a device plugin slot is given.
    assert offer.health()["all-hcas"] is rdma_cm
