"""`rdma/hca: 1` through DRA's extended-resource class gets what the device plugin gave.

The scheduler turns a pod's `rdma/hca: 1` into a claim with one request
`container-0-request-0` of one device of the extended class: the node-wide device. Its
container must see the same HCAs, device nodes and variables as Allocate of one shared
slot gave it, on the same node, so moving a fleet to DRA changes nothing a workload gets.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.contract.dra import NODE_DEVICE
from rdma_hca.daemon.deviceplugin.pool import Allocation, select, shared_ids
from rdma_hca.daemon.dra.devices import DeviceOffer, hca_device_names
from rdma_hca.daemon.dra.resourceslice.slices import split
from rdma_hca.daemon.offer.cdi import build_spec
from rdma_hca.daemon.offer.env import EnvSettings
from rdma_hca.devkit.dra.extended import extended_claim, request_name
from rdma_hca.devkit.dra.stage import DraStage, with_changes
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import DeviceMetadata, Mode, NcclEnv, PoolConfig

EXTENDED_CLASS = f"{DRIVER}-extended"
HOST = EnvSettings(nccl=NcclEnv.AUTO)
NON_HOST = EnvSettings(nccl=NcclEnv.AUTO, non_host_network=True)


def _spec(stage: DraStage, uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (stage.cdi_dir / f"{DRIVER}-claim-{uid}.json").read_text())
    return data


def _container_view(spec: dict[str, Any], cdi_ids: list[str]) -> tuple[list[str], dict[str, str]]:
    """What the runtime puts in the container for these CDI IDs: device nodes and env."""
    kind = spec["kind"]
    nodes = [n["hostPath"] for n in spec.get("containerEdits", {}).get("deviceNodes", [])]
    env: dict[str, str] = {}
    for d in spec["devices"]:
        if f"{kind}={d['name']}" in cdi_ids:
            nodes += [n["hostPath"] for n in d["containerEdits"]["deviceNodes"]]
            env.update(e.split("=", 1) for e in d["containerEdits"].get("env", []))
    return nodes, env


def _device_plugin_view(allocation: Allocation, node: SimNode, *,
                        cdi: bool) -> tuple[list[str], dict[str, str]]:
    """What the device plugin's Allocate gives: device specs, or CDI names resolved in the
    device plugin's own CDI spec; its env either way."""
    env = dict(allocation.envs)
    if not cdi:
        return [d.host_path for d in allocation.devices], env
    inventory = discover_node(node.sysfs_root, node.dev_root)
    nodes, spec_env = _container_view(build_spec(inventory.hcas, inventory.rdma_cm),
                                      list(allocation.cdi_devices))
    assert not spec_env  # Allocate sets the env itself
    return nodes, env


async def _prepare_extended(stage: DraStage, pod: str, count: int = 1) -> tuple[str, Any]:
    assert stage.kubelet is not None
    name, uid = extended_claim(stage.api, "training", pod, driver=DRIVER, pool=NODE,
                               device=NODE_DEVICE, device_class=EXTENDED_CLASS, count=count,
                               consumed={f"{DRIVER}/slots": "1"})
    resp = await stage.kubelet.prepare(DRIVER, [("training", uid, name)])
    return uid, resp.claims[uid]


@pytest.mark.parametrize("env", [HOST, NON_HOST], ids=["hostNetwork", "nonHostNetwork"])
@pytest.mark.parametrize("cdi", [False, True], ids=["device-specs", "cdi"])
async def test_the_same_hcas_nodes_and_env_as_allocate_on_a_13_hca_node(
        tmp_path: Path, api: FakeApiServer, env: EnvSettings, cdi: bool) -> None:
    node = sim.gpu_node(tmp_path / "node", hcas=12, ipv6=env.non_host_network,
                        gid_table_size=8)
    node.set_port("mlx5_3", up=False)  # given, but not in NCCL_IB_HCA
    (node.dev_root / "infiniband" / node.uverbs_name("mlx5_5")).unlink()  # not given
    inventory = discover_node(node.sysfs_root, node.dev_root)
    assert len(inventory.hcas) == 13
    pool = select(PoolConfig(), inventory, env=env, cdi=cdi)
    allocation = pool.allocate(shared_ids(1000)[:1])
    before = _device_plugin_view(allocation, node, cdi=cdi)

    async with DraStage(node, tmp_path / "stage", api=api, env=env) as stage:
        assert await stage.registered()
        assert await stage.until(lambda: NODE_DEVICE in stage.devices())
        uid, entry = await _prepare_extended(stage, "hps-benchmark-0")
        assert entry.error == ""
        after = _container_view(_spec(stage, uid),
                                [i for d in entry.devices for i in d.cdi_device_ids])

    assert after == before
    nodes, variables = after
    names = variables["RDMA_HCA_DEVICES"].split(",")
    assert len(names) == 12 and "mlx5_5" not in names and "mlx5_3" in names
    assert nodes[0] == "/dev/infiniband/rdma_cm" and len(nodes) == 13
    assert "mlx5_3:1" not in variables["NCCL_IB_HCA"]
    assert variables["NCCL_IB_HCA"].startswith("=mlx5_0:1,")


async def test_the_kubelet_prepares_an_extended_claim_into_every_hca(
        stage: DraStage, dra_node: SimNode) -> None:
    device = stage.devices()[NODE_DEVICE]
    assert device["allowMultipleAllocations"] is True
    assert device["attributes"][f"{DRIVER}/kind"] == {"string": "node"}
    assert device["capacity"] == {f"{DRIVER}/slots": {
        "value": "1000", "requestPolicy": {"default": "1",
                                           "validRange": {"min": "1", "step": "1"}}}}
    uid, entry = await _prepare_extended(stage, "job-a")
    assert entry.error == ""
    (prepared,) = entry.devices
    assert (list(prepared.request_names), prepared.pool_name, prepared.device_name) == (
        [request_name(0)], NODE, NODE_DEVICE)
    spec = _spec(stage, uid)
    nodes, env = _container_view(spec, list(prepared.cdi_device_ids))
    every = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_bond_0"]
    assert nodes == ["/dev/infiniband/rdma_cm"] + [
        f"/dev/infiniband/{dra_node.uverbs_name(h)}" for h in every]
    assert env == {"RDMA_HCA_DEVICES": ",".join(every)}
    # A second pod shares the device, with a claim (and a share) of its own.
    uid_b, entry_b = await _prepare_extended(stage, "job-b")
    assert entry_b.error == "" and _container_view(
        _spec(stage, uid_b), list(entry_b.devices[0].cdi_device_ids)) == (nodes, env)
    assert stage.kubelet is not None
    resp = await stage.kubelet.unprepare(DRIVER, [("training", uid, "x")])
    assert resp.claims[uid].error == ""
    assert not (stage.cdi_dir / f"{DRIVER}-claim-{uid}.json").exists()


async def test_two_units_in_one_pod_are_one_cdi_device_and_two_status_entries(
        stage: DraStage) -> None:
    """`rdma/hca: 2` is count 2 of the class: with consumable capacity the allocator puts the
    node-wide device in the claim twice, each with a share ID of its own."""
    uid, entry = await _prepare_extended(stage, "job-c", count=2)
    assert entry.error == ""
    # One entry per share, the one CDI device on the first: what the kubelet hands the
    # container (every entry's CDI IDs) names it once.
    first, second = entry.devices
    assert [list(d.request_names) for d in entry.devices] == [[request_name(0)]] * 2
    assert [d.device_name for d in entry.devices] == [NODE_DEVICE] * 2
    assert len(first.cdi_device_ids) == 1 and list(second.cdi_device_ids) == []
    spec = _spec(stage, uid)
    assert len(spec["devices"]) == 1  # a CDI spec naming one device twice is refused
    assert stage.driver is not None
    await stage.statuses_written()
    claims = [c for c in stage.api.cluster.resource_claims if c["metadata"]["uid"] == uid]
    shares = {r["shareID"] for r in claims[0]["status"]["allocation"]["devices"]["results"]}
    assert {first.share_id, second.share_id} == shares
    entries = claims[0]["status"].get("devices") or []
    assert {e["shareID"] for e in entries} == shares and len(shares) == 2
    assert all(e["device"] == NODE_DEVICE for e in entries)


async def test_the_node_wide_device_is_tainted_only_when_no_hca_is_up(
        stage: DraStage, dra_node: SimNode) -> None:
    dra_node.set_port("mlx5_0", up=False)
    assert await stage.until(lambda: "taints" in stage.devices().get("mlx5-0", {}))
    node_device = stage.devices()[NODE_DEVICE]
    assert "taints" not in node_device
    assert node_device["attributes"][f"{DRIVER}/linkState"] == {"string": "up"}
    assert node_device["attributes"][f"{DRIVER}/hcaCount"] == {"int": 5}
    for hca, spec in dra_node.specs.items():
        for port in range(1, len(spec.ports) + 1):
            dra_node.set_port(hca, port, up=False)
    assert await stage.until(lambda: "taints" in stage.devices().get(NODE_DEVICE, {}))
    node_device = stage.devices()[NODE_DEVICE]
    assert node_device["taints"] == [{"key": f"{DRIVER}/link-down", "value": "down",
                                      "effect": "NoSchedule"}]
    assert node_device["attributes"][f"{DRIVER}/linkState"] == {"string": "down"}
    assert stage.kubelet is not None
    events = stage.kubelet.events.health
    assert await stage.until(lambda: bool(events) and events[-1].devices.get(
        f"{NODE}/{NODE_DEVICE}") == "UNHEALTHY")
    dra_node.set_port("mlx5_2", up=True)
    assert await stage.until(lambda: "taints" not in stage.devices().get(NODE_DEVICE, {}))


async def test_exclusive_mode_has_no_node_wide_device(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api, mode=Mode.EXCLUSIVE) as s:
        assert await s.registered() and await s.until(lambda: bool(s.devices()))
        assert sorted(s.devices()) == ["mlx5-0", "mlx5-1", "mlx5-2", "mlx5-3", "mlx5-bond-0"]
        assert s.kubelet is not None
        # A claim naming it (made for a shared node) is refused, not half prepared.
        uid, entry = await _prepare_extended(s, "job-d")
        assert "no longer on this node" in entry.error
        assert not (s.cdi_dir / f"{DRIVER}-claim-{uid}.json").exists()


def test_the_node_wide_device_counts_toward_the_slice_limits(dra_node: SimNode) -> None:
    inventory = discover_node(dra_node.sysfs_root, dra_node.dev_root)
    # 64 HCAs (one record under 64 names: only the count matters to the limits).
    hcas = [dataclasses.replace(inventory.hcas[0], name=f"mlx5_{i}") for i in range(64)]
    shared = DeviceOffer.build(hcas, DRIVER, Mode.SHARED, True, inventory.rdma_cm)
    assert [len(c) for c in split(shared.devices, taints=True)] == [64, 1]
    assert [len(c) for c in split(shared.devices, taints=False)] == [65]
    exclusive = DeviceOffer.build(hcas, DRIVER, Mode.EXCLUSIVE, True, inventory.rdma_cm)
    assert [len(c) for c in split(exclusive.devices, taints=True)] == [64]
    (node_device,) = [d for d in shared.devices if d["name"] == NODE_DEVICE]
    assert len(node_device["attributes"]) + len(node_device["capacity"]) <= 32


def test_an_hca_named_like_the_node_wide_device_gets_another_name() -> None:
    names = hca_device_names(["all_hcas", "mlx5_0"], node_device=True)
    assert names["mlx5_0"] == "mlx5-0"
    assert names["all_hcas"].startswith("all-hcas-") and names["all_hcas"] != NODE_DEVICE
    assert hca_device_names(["all_hcas"], node_device=False) == {"all_hcas": "all-hcas"}


def test_the_fake_api_server_checks_the_request_policy(api: FakeApiServer) -> None:
    def slice_with(device: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": f"s-{len(api.slices(NODE))}"},
                "spec": {"driver": DRIVER, "nodeName": NODE,
                         "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                         "devices": [device]}}

    def capacity(policy: dict[str, Any], multiple: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {"name": "d", "capacity": {f"{DRIVER}/slots": {
            "value": "1000", "requestPolicy": policy}}}
        if multiple:
            d["allowMultipleAllocations"] = True
        return d

    ok = {"default": "1", "validRange": {"min": "1", "step": "1"}}
    api.put("resourceslices", slice_with(capacity(ok)))
    refused = [
        (capacity(ok, multiple=False), "allowMultipleAllocations must be true"),
        (capacity({"validRange": {"min": "1"}}), "default: Required value"),
        (capacity({"default": "0", "validRange": {"min": "1"}}), "default is less than min"),
        (capacity({"default": "2", "validRange": {"min": "1", "step": "2"}}),
         "not a multiple"),
        (capacity({"default": "1", "validRange": {"min": "1"}, "validValues": ["1"]}),
         "exactly one policy"),
        (capacity({"default": "3", "validValues": ["1", "2"]}), "default value is not valid"),
    ]
    for device, message in refused:
        with pytest.raises(ValueError, match=message):
            api.put("resourceslices", slice_with(device))


async def test_device_metadata_of_the_node_wide_device(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    tune = with_changes(device_metadata=DeviceMetadata.V1ALPHA1)
    async with DraStage(dra_node, tmp_path / "s", api=api, config=tune) as s:
        assert await s.registered() and await s.until(lambda: NODE_DEVICE in s.devices())
        uid, entry = await _prepare_extended(s, "job-e")
        assert entry.error == ""
        (device,) = _spec(s, uid)["devices"]
        ((host, inside),) = [(m["hostPath"], m["containerPath"])
                             for m in device["containerEdits"]["mounts"]]
        assert inside.endswith(f"/{request_name(0)}/{DRIVER}-metadata.json")
        doc = json.loads(Path(host).read_text())  # one version: one object
        (listed,) = doc["requests"][0]["devices"]
        attrs = listed["attributes"]
        # What the slice publishes of it, and the env naming every HCA.
        published = s.devices()[NODE_DEVICE]["attributes"]
        assert set(attrs) == set(published) | {f"{DRIVER}/containerEnv"}
        assert {k: v for k, v in attrs.items() if k in published} == published
        assert "RDMA_HCA_DEVICES=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_bond_0" in \
            attrs[f"{DRIVER}/containerEnv"]["strings"]
