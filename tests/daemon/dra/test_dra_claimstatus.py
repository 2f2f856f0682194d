"""The claim status writer on its own, against the fake API server: our entries applied
after Prepare and removed at Unprepare, other drivers' entries kept, another writer no
conflict, and one log line where the server does not take the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rdma_hca.contract.checkpoint import PreparedDevice
from rdma_hca.contract.dra import GROUP_VERSION
from rdma_hca.daemon.dra.claims import ClaimRef
from rdma_hca.daemon.dra.claimstatus import REFUSALS, ClaimStatusWriter
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.daemon.dra.kubeapi import SliceApi, claim_path
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import Mode

DRIVER = "rdma-hca.io"
NODE = "node-a"
GPU = "gpu.example.com"


async def no_wait(seconds: float) -> None:
    """The writer's backoff, passed at once."""



@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    n = sim.gpu_node(tmp_path / "n", hcas=2, bond=False, gid_table_size=4)
    n.write("class/net/eth1/address", "b8:59:9f:d4:3c:23\n")
    return n


def writer(client: SliceApi, node: SimNode, **kw: Any) -> ClaimStatusWriter:
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
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
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
    puts = api.count("PATCH")
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    assert api.count("PATCH") == puts


async def test_other_drivers_entries_stay_and_ours_go_at_unprepare(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    ref = claim(api)
    gpu_entry = {"driver": GPU, "pool": NODE, "device": "gpu-0"}
    await client.client.apply(  # the GPU driver wrote first, as its own field manager
        claim_path("ns", "c") + "/status",
        {"apiVersion": GROUP_VERSION, "kind": "ResourceClaim",
         "metadata": {"name": "c", "namespace": "ns"}, "status": {"devices": [gpu_entry]}},
        field_manager=GPU)
    w = writer(client, node)
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    assert [e["driver"] for e in devices(api)] == [GPU, DRIVER]
    await w.on_unprepared(ref)
    await w.drained()
    assert devices(api) == [gpu_entry]


async def test_a_concurrent_write_is_no_conflict(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    ref = claim(api)
    w = writer(client, node)
    touched = False

    def another_writer(record: Any) -> None:
        nonlocal touched
        if record.method == "PATCH" and not touched:
            touched = True
            api.touch("resourceclaims", "ns", "c")

    api.on_request = another_writer
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    assert touched and [e["device"] for e in devices(api)] == ["mlx5-1"]
    # An apply carries no resourceVersion: one read (for the allocation), one write.
    assert api.count("PATCH", "/status") == 1 and api.count("GET", "/resourceclaims/c") == 1


async def test_with_the_feature_gate_off_one_line_per_writer_and_other_claims_go_on(
        api: FakeApiServer, client: SliceApi, node: SimNode,
        caplog: pytest.LogCaptureFixture) -> None:
    api.cluster.claim_device_status = False
    ref = claim(api)
    other = ClaimRef("ns", api.add_claim("ns", "d", [
        {"request": "hca", "driver": DRIVER, "pool": NODE, "device": "mlx5-1"}]), "d")
    w = writer(client, node)
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    assert w.dropped == 1 and devices(api) == []
    # The claim is not written again and again; the next claim is still tried.
    await w.on_prepared(other, PREPARED)
    await w.drained()
    assert w.dropped == 2 and api.count("PATCH", "/resourceclaims/c/") == 1
    assert sum("DRAResourceClaimDeviceStatus" in r.message for r in caplog.records) == 1
    api.cluster.claim_device_status = True  # the gate on again (an API server update)
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    assert [e["device"] for e in devices(api)] == ["mlx5-1"]


async def test_refused_by_rbac_is_said_once(
        api: FakeApiServer, client: SliceApi, node: SimNode,
        caplog: pytest.LogCaptureFixture) -> None:
    api.cluster.forbidden.add("resourceclaims/status")
    ref = claim(api)
    w = writer(client, node, sleep=no_wait)
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    # Each state of the claim is sent at most three times, then left until it changes.
    assert api.count("PATCH") == 2 * REFUSALS and w.refused == 2 * REFUSALS
    assert sum("resourceclaims/driver" in r.message for r in caplog.records) == 1


async def test_a_claim_made_again_under_the_name_is_left_alone(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claim(api)
    w = writer(client, node)
    await w.on_prepared(ClaimRef("ns", "another-uid", "c"), PREPARED)
    await w.drained()
    assert devices(api) == [] and api.count("PATCH") == 0


async def test_addresses_go_in_where_a_source_knows_them(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    ref = claim(api)
    ips = {"eth1": ["10.0.1.11/24", "2001:db8::11/64"]}
    w = writer(client, node, ips_of=lambda n: ips.get(n, []))
    await w.on_prepared(ref, PREPARED)
    await w.drained()
    (entry,) = devices(api)
    assert entry["networkData"]["ips"] == ["10.0.1.11/24", "2001:db8::11/64"]
