"""The claim status writer on its own, against the fake API server: our entries written
after Prepare and removed at Unprepare, other drivers' entries kept, conflicts retried, and
one log line where the server does not take the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rdma_hca.daemon.dra.claimstatus import ClaimStatusWriter
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.daemon.dra.files import PreparedDevice
from rdma_hca.daemon.dra.kubeapi import SliceApi
from rdma_hca.daemon.dra.service import ClaimRef
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.node.discovery import discover_node
from rdma_hca.settings.config import Mode

DRIVER = "rdma-hca.io"
NODE = "node-a"
GPU = "gpu.example.com"






@pytest.fixture
def node(tmp_path: Path) -> sim.SimNode:
    n = sim.gpu_node(tmp_path / "n", hcas=2, bond=False, gid_table_size=4)
    n.write("class/net/eth1/address", "b8:59:9f:d4:3c:23\n")
    return n


def writer(client: SliceApi, node: sim.SimNode, **kw: Any) -> ClaimStatusWriter:
    inventory = discover_node(node.sysfs_root, node.dev_root)
    offer = DeviceOffer.build(inventory.hcas, DRIVER, Mode.SHARED, True, inventory.rdma_cm)
    return ClaimStatusWriter(client, DRIVER, sysfs_root=str(node.sysfs_root),
                             hca_of=offer.hcas.get, files=OffLoop(5.0), **kw)


def claim(api: FakeApiServer) -> ClaimRef:
    uid = api.add_claim("ns", "c", [
        {"request": "gpu", "driver": GPU, "pool": NODE, "device": "gpu-0"},
        {"request": "hca", "driver": DRIVER, "pool": NODE, "device": "mlx5-1",
         "shareID": "3a4b7c1e-0000-4000-8000-000000000001"},
    ])
    return ClaimRef("ns", uid, "c")


PREPARED = (PreparedDevice(("hca",), NODE, "mlx5-1", "mlx5_1", ("rdma-hca.io/claim=x",)),)


def devices(api: FakeApiServer) -> list[dict[str, Any]]:
    return list(api.claim("ns", "c")["status"].get("devices") or [])


async def test_prepared_devices_get_an_entry_with_ready_and_network_data(
        api: FakeApiServer, client: SliceApi, node: sim.SimNode) -> None:
    ref = claim(api)
    w = writer(client, node)
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    (entry,) = devices(api)
    assert {k: entry[k] for k in ("driver", "pool", "device", "shareID")} == {
        "driver": DRIVER, "pool": NODE, "device": "mlx5-1",
        "shareID": "3a4b7c1e-0000-4000-8000-000000000001"}
    (ready,) = entry["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    assert entry["networkData"] == {"interfaceName": "eth1",
                                    "hardwareAddress": "b8:59:9f:d4:3c:23"}
    # Prepared again (a kubelet retry): nothing new to write.
    puts = api.count("PUT")
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    assert api.count("PUT") == puts


async def test_other_drivers_entries_stay_and_ours_go_at_unprepare(
        api: FakeApiServer, client: SliceApi, node: sim.SimNode) -> None:
    ref = claim(api)
    gpu_entry = {"driver": GPU, "pool": NODE, "device": "gpu-0"}
    stored = api.claim("ns", "c")
    stored["status"]["devices"] = [gpu_entry]
    await client.replace_claim_status(stored)  # the GPU driver wrote first
    w = writer(client, node)
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    assert [e["driver"] for e in devices(api)] == [GPU, DRIVER]
    await w.on_unprepared(ref)
    await w.drained()
    assert devices(api) == [gpu_entry]


async def test_a_concurrent_write_is_a_conflict_then_a_fresh_read(
        api: FakeApiServer, client: SliceApi, node: sim.SimNode) -> None:
    ref = claim(api)
    w = writer(client, node)
    touched = False

    def another_writer(record: Any) -> None:
        nonlocal touched
        if record.method == "PUT" and not touched:
            touched = True
            api.touch("resourceclaims", "ns", "c")

    api.on_request = another_writer
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    assert [e["device"] for e in devices(api)] == ["mlx5-1"]
    assert api.count("PUT", "/status") == 2 and api.count("GET", "/resourceclaims/c") == 2


async def test_with_the_feature_gate_off_one_line_and_no_more_writes(
        api: FakeApiServer, client: SliceApi, node: sim.SimNode,
        caplog: pytest.LogCaptureFixture) -> None:
    api.cluster.claim_device_status = False
    ref = claim(api)
    w = writer(client, node)
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    assert w.disabled is not None and "DRAResourceClaimDeviceStatus" in w.disabled
    before = len(api.requests)
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    await w.on_unprepared(ref)
    await w.drained()
    assert len(api.requests) == before
    assert sum("dropped status.devices" in r.message for r in caplog.records) == 1


async def test_refused_by_rbac_is_said_once(
        api: FakeApiServer, client: SliceApi, node: sim.SimNode,
        caplog: pytest.LogCaptureFixture) -> None:
    api.cluster.forbidden.add("resourceclaims/status")
    ref = claim(api)
    w = writer(client, node)
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    assert api.count("PUT") == 1
    assert sum("resourceclaims/driver" in r.message for r in caplog.records) == 1


async def test_a_claim_made_again_under_the_name_is_left_alone(
        api: FakeApiServer, client: SliceApi, node: sim.SimNode) -> None:
    claim(api)
    w = writer(client, node)
    await w.on_prepared(ClaimRef("ns", "another-uid", "c"), PREPARED)
    await w.drained()
    assert devices(api) == [] and api.count("PUT") == 0


async def test_addresses_go_in_where_a_source_knows_them(
        api: FakeApiServer, client: SliceApi, node: sim.SimNode) -> None:
    ref = claim(api)
    ips = {"eth1": ["10.0.1.11/24", "2001:db8::11/64"]}
    w = writer(client, node, ips_of=lambda n: ips.get(n, []))
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    (entry,) = devices(api)
    assert entry["networkData"]["ips"] == ["10.0.1.11/24", "2001:db8::11/64"]
