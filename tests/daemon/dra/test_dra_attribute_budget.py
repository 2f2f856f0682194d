"""Nothing vanishes silently: a device keeps within the API's 32 attributes and capacities
by design, what is left out is chosen least useful first (never the device's identity),
and each device that loses something is said once in the log and counted."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.contract.dra import (
    BANDWIDTH,
    HCA_NAME,
    KIND,
    LINK_STATE,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    RATE_GBPS,
)
from rdma_hca.contract.fabric import SWITCH, SWITCH_PORT
from rdma_hca.daemon.dra import devices as devices_module
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.devices import (
    KEEP_ORDER,
    MAX_ATTRIBUTES_AND_CAPACITIES,
    NEVER_LEFT_OUT,
    Device,
    DeviceOffer,
    device,
    fit,
)
from rdma_hca.daemon.dra.offering import NodeOffer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.model import NodeInventory
from rdma_hca.settings.config import DraConfig
from rdma_hca.settings.model import Mode, Settings


def _inventory(tmp_path: Path) -> NodeInventory:
    node = sim.gpu_node(tmp_path / "node", hcas=4, bond=True, gid_table_size=4)
    return discover_node(node.sysfs_root, node.dev_root)


def _size(d: Device) -> int:
    return len(d["attributes"]) + len(d.get("capacity") or {})


def _with_fabric(d: Device) -> Device:
    """The device as it will be once the fabric's attributes are published."""
    attrs = {**d["attributes"], f"{DRIVER}/{SWITCH}": {"string": "leaf-1"},
             f"{DRIVER}/{SWITCH_PORT}": {"string": "Ethernet12"}}
    return {**d, "attributes": attrs}


def test_every_device_fits_with_room_for_the_fabric(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path)
    for mode in Mode:
        offer = DeviceOffer.build(inventory.hcas, DRIVER, mode, True, inventory.rdma_cm)
        assert offer.left_out == {}
        for d in offer.devices:
            assert _size(_with_fabric(d)) <= MAX_ATTRIBUTES_AND_CAPACITIES
            assert fit(_with_fabric(d)).left_out == ()


def test_the_least_useful_go_first_and_the_identity_never(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (hca, *_) = _inventory(tmp_path).hcas
    full = _with_fabric(device(hca, "mlx5-0", DRIVER, Mode.SHARED, True))
    assert _size(full) == 16
    # A tighter limit stands in for a device that outgrew 32.
    monkeypatch.setattr(devices_module, "MAX_ATTRIBUTES_AND_CAPACITIES", 10)
    fitted = fit(full)
    short = [k.rpartition("/")[2] for k in fitted.left_out]
    assert short == ["firmware", "nodeGUID", "vendor", "netdev", "roceV2IPv6", "linkLayer"]
    assert _size(fitted.device) == 10
    kept = set(fitted.device["attributes"]) | set(fitted.device.get("capacity") or {})
    assert kept == {PCIE_ROOT, PCI_BUS_ID, NUMA_NODE, *(f"{DRIVER}/{n}" for n in (
        KIND, HCA_NAME, LINK_STATE, SWITCH, SWITCH_PORT, RATE_GBPS, BANDWIDTH))}
    # The input is not changed; names nobody documents go before any of ours.
    assert _size(full) == 16
    odd = {**full, "attributes": {**full["attributes"], "example.com/extra": {"int": 1}}}
    assert fit(odd).left_out[0] == "example.com/extra"
    # Squeezed to the bone: everything but the identity goes, capacities last.
    monkeypatch.setattr(devices_module, "MAX_ATTRIBUTES_AND_CAPACITIES", 6)
    bone = fit(full)
    assert [k.rpartition("/")[2] for k in bone.left_out][-3:] == [SWITCH_PORT, SWITCH,
                                                                   BANDWIDTH]
    assert "capacity" not in bone.device
    assert {k if k.startswith("resource.") else k.rpartition("/")[2]
            for k in bone.device["attributes"]} == NEVER_LEFT_OUT
    # A device of only what is never left out stays whole, even over the limit.
    monkeypatch.setattr(devices_module, "MAX_ATTRIBUTES_AND_CAPACITIES", 3)
    assert _size(fit(full).device) == 6
    assert set(KEEP_ORDER).isdisjoint(NEVER_LEFT_OUT)


def test_what_is_left_out_is_said_once_and_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    inventory = _inventory(tmp_path)
    settings = Settings(kubelet_root=str(tmp_path / "k"), node_name=NODE,
                        dra=DraConfig(enabled=True))
    offering = NodeOffer(DriverConfig.from_settings(settings))
    monkeypatch.setattr(devices_module, "MAX_ATTRIBUTES_AND_CAPACITIES", 12)
    caplog.set_level(logging.WARNING, logger="rdma_hca.daemon.dra.offering")
    offer = offering.update(inventory)
    # Each per-HCA device (13 attributes and the bandwidth) loses two: firmware, nodeGUID.
    assert set(offer.left_out) == {d["name"] for d in offer.devices
                                   if d["name"] != "all-hcas"}
    assert all(names == (f"{DRIVER}/firmware", f"{DRIVER}/nodeGUID")
               for names in offer.left_out.values())
    assert offering.attributes_dropped == 2 * len(offer.left_out)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(offer.left_out)
    assert all("rdma-hca.io/firmware, rdma-hca.io/nodeGUID left out" in line
               and "docs/dra.md" in line for line in lines)
    # The same offer again: nothing new to say or count.
    offering.update(inventory)
    assert len(caplog.records) == len(lines)
    assert offering.attributes_dropped == 2 * len(offer.left_out)
    # Room again, then not: counted again when it starts again.
    monkeypatch.setattr(devices_module, "MAX_ATTRIBUTES_AND_CAPACITIES", 32)
    assert offering.update(inventory).left_out == {}
    monkeypatch.setattr(devices_module, "MAX_ATTRIBUTES_AND_CAPACITIES", 12)
    offering.update(inventory)
    assert offering.attributes_dropped == 4 * len(offer.left_out)
