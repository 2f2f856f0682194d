"""The node's ResourceSlice: attributes, sharing, changes, health, other nodes' slices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra_support import DRIVER, NODE

from rdma_hca.devkit.dra.stage import DraStage, with_changes
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.settings.model import Mode

STD = "resource.kubernetes.io"


def _attr(device: dict[str, Any], key: str) -> object:
    (value,) = device["attributes"][key].values()
    return value


def _generation(stage: DraStage) -> int:
    (only,) = stage.slices()
    return int(only["spec"]["pool"]["generation"])


async def test_one_slice_one_device_per_hca_with_standard_and_own_attributes(
        stage: DraStage, dra_node: SimNode) -> None:
    (only,) = stage.slices()
    spec = only["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    devices = stage.devices()
    # One device per HCA, and (shared mode) the node-wide one for rdma/hca.
    assert sorted(devices) == ["all-hcas", "mlx5-0", "mlx5-1", "mlx5-2", "mlx5-3",
                               "mlx5-bond-0"]
    assert _attr(devices.pop("all-hcas"), f"{DRIVER}/kind") == "node"
    for name, hca in (("mlx5-0", "mlx5_0"), ("mlx5-3", "mlx5_3"), ("mlx5-bond-0", "mlx5_bond_0")):
        d = devices[name]
        spec_of = dra_node.specs[hca]
        assert _attr(d, f"{STD}/pcieRoot") == dra_node.expected_pcie_root(hca)
        assert _attr(d, f"{STD}/pciBusID") == spec_of.pci_address
        assert _attr(d, f"{STD}/numaNode") == spec_of.numa_node
        assert _attr(d, f"{DRIVER}/hcaName") == hca
        assert _attr(d, f"{DRIVER}/kind") == "hca"
        assert _attr(d, f"{DRIVER}/vendor") == "0x15b3"
        assert _attr(d, f"{DRIVER}/nodeGUID") == spec_of.node_guid
        assert _attr(d, f"{DRIVER}/linkLayer") == "Ethernet"
        assert _attr(d, f"{DRIVER}/linkState") == "up"
        assert _attr(d, f"{DRIVER}/roceV2IPv6") is False  # IPv4 only on this node
        assert d["allowMultipleAllocations"] is True
        assert "taints" not in d
    roots = {n: _attr(d, f"{STD}/pcieRoot") for n, d in devices.items()}
    # Two HCAs per root complex, each beside two GPUs; the bond under a root of its own.
    assert roots["mlx5-0"] == roots["mlx5-1"] != roots["mlx5-2"] == roots["mlx5-3"]
    assert roots["mlx5-bond-0"] not in {roots["mlx5-0"], roots["mlx5-2"]}
    assert len(dra_node.gpus_by_root()[str(roots["mlx5-2"])]) == 2
    assert _attr(devices["mlx5-0"], f"{DRIVER}/netdev") == "eth0"
    assert _attr(devices["mlx5-0"], f"{DRIVER}/rateGbps") == 400
    assert _attr(devices["mlx5-bond-0"], f"{DRIVER}/rateGbps") == 200
    assert _attr(devices["mlx5-0"], f"{DRIVER}/firmware") == dra_node.specs["mlx5_0"].fw_ver


async def test_numa_node_is_omitted_when_the_platform_has_none(
        tmp_path: Path, api: FakeApiServer) -> None:
    node = sim.gpu_node(tmp_path / "n", hcas=2, bond=False, numa_nodes=0, ipv6=True,
                        gid_table_size=8)
    async with DraStage(node, tmp_path / "s", api=api) as s:
        assert await s.until(lambda: bool(s.devices()))
        d = s.devices()["mlx5-0"]
        assert f"{STD}/numaNode" not in d["attributes"]
        assert _attr(d, f"{DRIVER}/roceV2IPv6") is True


async def test_exclusive_mode_devices_are_not_shared(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api, mode=Mode.EXCLUSIVE) as s:
        assert await s.until(lambda: bool(s.devices()))
        assert all("allowMultipleAllocations" not in d for d in s.devices().values())


async def test_port_down_taints_the_device_in_one_write_and_reports_health(
        stage: DraStage, dra_node: SimNode) -> None:
    assert stage.kubelet is not None
    events = stage.kubelet.events.health
    assert await stage.until(lambda: bool(events))
    assert events[-1].devices[f"{NODE}/mlx5-2"] == "HEALTHY"

    writes = len(stage.api.writes())
    dra_node.set_port("mlx5_2", up=False)
    assert await stage.until(lambda: "taints" in stage.devices().get("mlx5-2", {}))
    d = stage.devices()["mlx5-2"]
    assert d["taints"] == [{"key": f"{DRIVER}/link-down", "value": "down",
                            "effect": "NoSchedule"}]
    assert _attr(d, f"{DRIVER}/linkState") == "down"
    # The one slice is replaced in place, no LIST first; one write, the generation kept.
    assert [w.method for w in stage.api.writes()[writes:]] == ["PUT"]
    assert _generation(stage) == 1
    assert "taints" not in stage.devices()["mlx5-1"]
    assert await stage.until(lambda: events[-1].devices.get(f"{NODE}/mlx5-2") == "UNHEALTHY")
    assert events[-1].devices[f"{NODE}/mlx5-1"] == "HEALTHY"

    dra_node.set_port("mlx5_2", up=True)
    assert await stage.until(lambda: "taints" not in stage.devices().get("mlx5-2", {"taints": 1}))
    assert _attr(stage.devices()["mlx5-2"], f"{DRIVER}/linkState") == "up"
    assert _generation(stage) == 1
    assert await stage.until(lambda: events[-1].devices.get(f"{NODE}/mlx5-2") == "HEALTHY")


async def test_hca_gone_removes_its_device(stage: DraStage, dra_node: SimNode) -> None:
    dra_node.remove_hca("mlx5_1")
    assert await stage.until(lambda: "mlx5-1" not in stage.devices())
    assert sorted(stage.devices()) == ["all-hcas", "mlx5-0", "mlx5-2", "mlx5-3",
                                       "mlx5-bond-0"]
    assert stage.devices()["all-hcas"]["attributes"][f"{DRIVER}/hcaCount"] == {"int": 4}
    assert _generation(stage) == 1  # one slice rewritten: no need to bump


async def test_unchanged_inventory_writes_nothing(stage: DraStage, dra_node: SimNode) -> None:
    assert stage.watcher is not None
    writes = len(stage.api.writes())
    # Full rediscoveries with nothing changed on the node.
    for _ in range(3):
        await stage.watcher.refresh()
    # A change elsewhere (a counter) is not a change of the offer either.
    dra_node.set_counter("mlx5_0", 1, "port_rcv_data", 12345)
    await stage.watcher.refresh()
    assert len(stage.api.writes()) == writes
    assert [r.method for r in stage.api.requests].count("GET") >= 1


async def test_other_nodes_slices_are_untouched_and_stale_ones_of_this_node_removed(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    def slice_of(node: str, driver: str, pool: str, generation: int) -> dict[str, Any]:
        return {"metadata": {"name": f"{node}-{driver}-{pool}-{generation}"},
                "spec": {"driver": driver, "nodeName": node,
                         "pool": {"name": pool, "generation": generation,
                                  "resourceSliceCount": 1},
                         "devices": [{"name": "old"}]}}

    other = api.put("resourceslices", slice_of("node-b", DRIVER, "node-b", 7))
    other_driver = api.put("resourceslices", slice_of(NODE, "gpu.example.com", NODE, 1))
    api.put("resourceslices", slice_of(NODE, DRIVER, NODE, 4))
    api.put("resourceslices", slice_of(NODE, DRIVER, "leftover-pool", 2))
    # A driver restart, not a kubelet one: nobody wiped the node's slices.
    async with DraStage(dra_node, tmp_path / "s", api=api, kubelet_wipes=False) as s:
        assert await s.until(lambda: len([x for x in s.slices()
                                          if x["spec"]["driver"] == DRIVER]) == 1
                             and "mlx5-0" in s.devices_of(DRIVER))
        (mine,) = [x for x in s.slices() if x["spec"]["driver"] == DRIVER]
        # The old slice of our pool was replaced one generation above it.
        assert mine["spec"]["pool"] == {"name": NODE, "generation": 5, "resourceSliceCount": 1}
    assert api.slices("node-b") == [other]
    assert [x for x in api.slices(NODE) if x["spec"]["driver"] != DRIVER] == [other_driver]
    assert not [w for w in api.writes() if other["metadata"]["name"] in w.path
                or other_driver["metadata"]["name"] in w.path]


async def test_without_device_taints_a_down_port_shows_only_in_the_attribute(
        dra_node: SimNode, tmp_path: Path) -> None:
    with FakeApiServer(taints_allowed=False) as api:
        async with DraStage(dra_node, tmp_path / "s", api=api) as s:
            assert await s.until(lambda: bool(s.devices()))
            dra_node.set_port("mlx5_0", up=False)
            assert await s.until(lambda: s.devices().get("mlx5-0", {}).get("attributes", {})
                                 .get(f"{DRIVER}/linkState") == {"string": "down"})
            assert all("taints" not in d for d in s.devices().values())


async def test_selectors_limit_the_offered_hcas(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    from rdma_hca.settings.model import Selectors

    tune = with_changes(selectors=Selectors(names=("mlx5_1", "mlx5_bond_*")))
    async with DraStage(dra_node, tmp_path / "s", api=api, config=tune) as s:
        assert await s.until(lambda: bool(s.devices()))
        assert sorted(s.devices()) == ["all-hcas", "mlx5-1", "mlx5-bond-0"]


async def test_api_server_errors_are_retried_never_fatal(
        stage: DraStage, dra_node: SimNode) -> None:
    assert stage.driver is not None and stage.kubelet is not None
    driver = stage.driver
    token = stage.api.token
    stage.api.token = "rotated"  # every request of the driver is now refused (401)
    dra_node.set_port("mlx5_0", up=False)
    assert await stage.until(lambda: driver.stats().publish_error is not None)
    assert "HTTP 401" in (driver.stats().publish_error or "")
    uid = "u-1"
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    assert "HTTP 401" in resp.claims[uid].error  # a per-claim error, the call succeeds
    stage.api.token = token
    assert await stage.until(lambda: "taints" in stage.devices().get("mlx5-0", {}))
    # The slice lands on the server just before the driver hears back; then it is clear.
    assert await stage.until(lambda: driver.stats().publish_error is None)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _taint(stage: DraStage, device: str) -> str | None:
    taints = stage.devices().get(device, {}).get("taints") or []
    return str(taints[0]["value"]) if taints else None


async def test_a_flapping_port_is_tainted_at_once_and_held_until_stable(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    hold = 30.0
    async with DraStage(dra_node, tmp_path / "s", api=api, flap_hold_seconds=hold) as s:
        assert s.driver is not None and s.watcher is not None and await s.registered()
        clock = Clock()
        s.watcher.flaps.clock = clock
        driver = s.driver
        driver.helper.publisher.damper.spacing = 0.5  # the test's pace; the order is the same

        def seen(up: bool) -> bool:
            inv = s.watcher.inventory if s.watcher else None
            return inv is not None and any(h.name == "mlx5_2" and h.any_port_up == up
                                           for h in inv.hcas)

        async def flip(up: bool) -> None:
            clock.now += 0.1
            dra_node.set_port("mlx5_2", up=up)
            assert await s.until(lambda: seen(up))

        assert await s.until(lambda: driver.stats().idle)
        # A lone change goes out at once, and so does the way back.
        await flip(False)
        assert await s.until(lambda: _taint(s, "mlx5-2") == "down")
        await flip(True)
        assert await s.until(lambda: _taint(s, "mlx5-2") is None)
        # Two more changes make a flap: tainted, and held so though the port is up.
        await flip(False)
        assert await s.until(lambda: _taint(s, "mlx5-2") == "down")  # newly down: at once
        await flip(True)
        assert await s.until(lambda: _taint(s, "mlx5-2") == "flapping")
        assert _attr(s.devices()["mlx5-2"], f"{DRIVER}/linkState") == "down"
        assert driver.board.health["mlx5-2"] is False  # the kubelet's health stream too
        assert await s.until(lambda: driver.stats().idle)
        # While held, the port flapping on costs no write at all.
        writes = len(api.writes())
        for i in range(10):
            await flip(i % 2 == 1)
        assert await s.until(lambda: driver.stats().idle)
        assert len(api.writes()) == writes and _taint(s, "mlx5-2") == "flapping"
        # Up, but short of the hold since it last came up: still held.
        clock.now += hold - 1
        assert await s.watcher.release_holds() is False
        assert _taint(s, "mlx5-2") == "flapping"
        clock.now += 1
        assert await s.until(lambda: _taint(s, "mlx5-2") is None)
        assert _attr(s.devices()["mlx5-2"], f"{DRIVER}/linkState") == "up"
        assert len(api.writes()) == writes + 1


async def test_the_driver_owns_its_slices_by_its_node_and_writes_without_listing(
        stage: DraStage, dra_node: SimNode) -> None:
    (node,) = [n for n in stage.api.cluster.nodes if n["metadata"]["name"] == NODE]
    (mine,) = stage.slices()
    assert mine["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"],
         "controller": True}]
    assert await stage.until(lambda: stage.driver is not None and stage.driver.stats().idle)
    lists = stage.api.count("GET", "/resourceslices")
    dra_node.set_port("mlx5_1", up=False)
    assert await stage.until(lambda: "taints" in stage.devices().get("mlx5-1", {}))
    assert stage.api.count("GET", "/resourceslices") == lists
