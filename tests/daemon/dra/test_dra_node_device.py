"""dra.nodeDevice and dra.defaultBandwidth: the slice with and without the node-wide
device, the bandwidth a claim asking none holds, and selectors that cannot trap a class
that selects every device of the driver."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel
from dra_support import DRIVER, NODE

from rdma_hca.daemon.dra.devices import NODE_DEVICE, DeviceOffer, default_share
from rdma_hca.daemon.dra.kubeapi import SliceApi
from rdma_hca.daemon.dra.resourceslice.publisher import SlicePublisher
from rdma_hca.devkit.dra.stage import DraStage, with_changes
from rdma_hca.devkit.kube import validation
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.model import Hca
from rdma_hca.settings.model import Mode

BANDWIDTH = f"{DRIVER}/bandwidth"
G = 10**9


def _hcas(node: SimNode) -> tuple[Hca, ...]:
    return discover_node(node.sysfs_root, node.dev_root).hcas


def _by_name(offer: DeviceOffer) -> dict[str, Any]:
    return {d["name"]: d for d in offer.devices}


def _with_rate(hca: Hca, gbps: float) -> Hca:
    return dataclasses.replace(hca, ports=tuple(dataclasses.replace(p, rate_gbps=gbps)
                                                for p in hca.ports))


def test_without_the_node_device_only_the_hcas_are_offered(dra_node: SimNode) -> None:
    hcas = _hcas(dra_node)
    on = DeviceOffer.build(hcas, DRIVER, Mode.SHARED, True, None)
    off = DeviceOffer.build(hcas, DRIVER, Mode.SHARED, True, None, node_device_on=False)
    assert NODE_DEVICE in _by_name(on) and NODE_DEVICE in on.groups
    assert sorted(_by_name(off)) == sorted(set(_by_name(on)) - {NODE_DEVICE})
    assert dict(off.groups) == {}
    assert set(off.health()) == set(_by_name(off))
    # The HCA devices themselves are the same either way.
    assert [d for d in on.devices if d["name"] != NODE_DEVICE] == list(off.devices)


def test_the_default_share_is_the_setting_within_each_hcas_rate(
        dra_node: SimNode) -> None:
    hcas = _hcas(dra_node)
    offer = DeviceOffer.build(hcas, DRIVER, Mode.SHARED, True, None,
                              default_bandwidth=300 * G)
    devices = _by_name(offer)
    policy = devices["mlx5-0"]["capacity"][BANDWIDTH]["requestPolicy"]
    assert policy == {"default": "300G", "validRange": {"min": "0", "step": "1G"}}
    # The bond runs at 200G: a claim asking nothing holds all of it, never more.
    bond = devices["mlx5-bond-0"]["capacity"][BANDWIDTH]
    assert bond["value"] == "200G" and bond["requestPolicy"]["default"] == "200G"
    # The node-wide device holds slots, no bandwidth (docs/dra.md says why).
    assert BANDWIDTH not in devices[NODE_DEVICE]["capacity"]
    # A rate that is not whole G: the default stays on a step below it.
    assert default_share(13_640_000_000, 100 * G) == 13 * G
    assert default_share(400 * G, 0) == 0
    odd = DeviceOffer.build((_with_rate(hcas[0], 13.64),), DRIVER, Mode.SHARED, True, None,
                            default_bandwidth=100 * G)
    assert odd.devices[0]["capacity"][BANDWIDTH]["requestPolicy"]["default"] == "13G"
    validation.check_slice({
        "metadata": {"name": "s"},
        "spec": {"driver": DRIVER, "nodeName": NODE, "devices": list(odd.devices),
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}}},
        taints_allowed=True)


@pytest.mark.parametrize("node_device", [True, False])
async def test_the_strict_api_server_takes_the_slice(
        api: FakeApiServer, client: SliceApi, dra_node: SimNode, node_device: bool) -> None:
    api.add_node(NODE)
    offer = DeviceOffer.build(_hcas(dra_node), DRIVER, Mode.SHARED, True, None,
                              node_device_on=node_device, default_bandwidth=100 * G)
    publisher = SlicePublisher(client, DRIVER, NODE, NODE)
    assert await publisher.publish(offer)
    (stored,) = api.slices(NODE)
    names = [d["name"] for d in stored["spec"]["devices"]]
    assert (NODE_DEVICE in names) is node_device
    assert {d["capacity"][BANDWIDTH]["requestPolicy"]["default"]
            for d in stored["spec"]["devices"] if BANDWIDTH in d.get("capacity", {})} == {
        "100G"}
    assert publisher.stats.created == 1 and publisher.stats.writes == 1


async def test_the_driver_follows_both_settings(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    tune = with_changes(node_device=False, default_bandwidth=50 * G)
    async with DraStage(dra_node, tmp_path / "s", api=api, config=tune) as s:
        assert await s.registered() and await s.until(lambda: bool(s.devices()))
        devices = s.devices()
        assert NODE_DEVICE not in devices
        assert {d["capacity"][BANDWIDTH]["requestPolicy"]["default"]
                for d in devices.values()} == {"50G"}
        driver = s.driver
        assert driver is not None
        # The slice lands on the server just before the driver hears back.
        assert await s.until(lambda: driver.helper.publisher.stats.created >= 1)
        assert driver.helper.publisher.stats.error is None


# --- selectors a class that selects every device of the driver may carry ------------------


def _cel_device(device: dict[str, Any]) -> Any:
    """A published device as DRA CEL sees it: attributes grouped by domain."""
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in device["attributes"].items():
        domain, _, name = key.rpartition("/")
        grouped.setdefault(domain, {})[name] = next(iter(value.values()))
    return json_to_cel({"driver": DRIVER, "attributes": grouped})


@pytest.mark.parametrize(("selector", "hca_matches", "node_matches"), [
    ('device.attributes["rdma-hca.io"].hcaName == "mlx5_0"', {"mlx5-0"}, False),
    ('device.attributes["rdma-hca.io"].hcaName.startsWith("mlx5")', "all", False),
    ('device.attributes["rdma-hca.io"].rateGbps >= 400', "fast", False),
    ('device.attributes["rdma-hca.io"].rateGbps >= 200', "all", True),
    ('device.attributes["rdma-hca.io"].linkLayer == "Ethernet"', "all", True),
    ('device.attributes["rdma-hca.io"].vendor == "0x15b3"', "all", True),
    ('device.attributes["rdma-hca.io"].roceV2IPv6', "none", False),
    ('device.attributes["rdma-hca.io"].linkState == "up"', "all", True),
])
def test_a_per_hca_selector_is_false_for_the_node_device_not_an_error(
        dra_node: SimNode, selector: str, hca_matches: object, node_matches: bool) -> None:
    """The scheduler fails the whole allocation on "no such key": a class written as DRA
    guides write it (``device.driver == ...``) also reaches the node-wide device."""
    offer = DeviceOffer.build(_hcas(dra_node), DRIVER, Mode.SHARED, True, None)
    env = celpy.Environment()
    program = env.program(env.compile(f'device.driver == "{DRIVER}" && {selector}'))
    matched = {d["name"] for d in offer.devices
               if bool(program.evaluate({"device": _cel_device(dict(d))}))}
    hcas = {d["name"] for d in offer.devices} - {NODE_DEVICE}
    expected = {"all": hcas, "none": set(), "fast": hcas - {"mlx5-bond-0"}}.get(
        str(hca_matches), hca_matches)
    assert matched - {NODE_DEVICE} == expected
    assert (NODE_DEVICE in matched) is node_matches


def test_node_device_attributes_say_what_holds_for_every_hca(dra_node: SimNode) -> None:
    hcas = _hcas(dra_node)
    node = _by_name(DeviceOffer.build(hcas, DRIVER, Mode.SHARED, True, None))[NODE_DEVICE]
    attrs = {k.rpartition("/")[2]: next(iter(v.values()))
             for k, v in node["attributes"].items()}
    assert attrs == {"kind": "node", "hcaCount": 5, "linkState": "up", "hcaName": "all",
                     "linkLayer": "Ethernet", "rateGbps": 200, "vendor": "0x15b3",
                     "roceV2IPv6": False}
    # Standard attributes have no one value for HCAs under several roots: left out, so
    # a matchAttribute on them never pairs a GPU with the whole node.
    assert not [k for k in node["attributes"] if k.startswith("resource.kubernetes.io/")]
    mixed = (hcas[0], dataclasses.replace(hcas[1], pci_vendor="0x8086"))
    wide = _by_name(DeviceOffer.build(mixed, DRIVER, Mode.SHARED, True, None))[NODE_DEVICE]
    assert f"{DRIVER}/vendor" not in wide["attributes"]
