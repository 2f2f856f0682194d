"""Publishing a big pool within the API's limits, and what each change costs: the publisher
against the fake API server, with devices made up for each case."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.daemon.dra.devices import DeviceOffer, digest
from rdma_hca.daemon.dra.kubeapi import SliceApi
from rdma_hca.daemon.dra.resourceslice.pace import Damper
from rdma_hca.daemon.dra.resourceslice.publisher import SlicePublisher
from rdma_hca.daemon.dra.resourceslice.slices import fit_device, split
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.sriov import sriov_node
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import Mode

DRIVER = "rdma-hca.io"
NODE = "node-a"


def dev(i: int, *, down: bool = False) -> dict[str, Any]:
    d: dict[str, Any] = {"name": f"vf-{i:03d}",
                         "attributes": {f"{DRIVER}/linkState": {"string":
                                                                "down" if down else "up"}}}
    if down:
        d["taints"] = [{"key": f"{DRIVER}/link-down", "value": "down", "effect": "NoSchedule"}]
    return d


def offer(devices: list[dict[str, Any]]) -> DeviceOffer:
    return DeviceOffer({}, devices, digest(devices))


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node(NODE)
        yield server




def mine(api: FakeApiServer) -> list[dict[str, Any]]:
    return [s for s in api.slices(NODE) if s["spec"]["driver"] == DRIVER]


def pool_is_whole(api: FakeApiServer) -> list[str]:
    """Every slice of the pool at one generation and count; the device names, each once."""
    slices = mine(api)
    pools = {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"])
             for s in slices}
    assert len(pools) == 1, pools
    assert next(iter(pools))[1] == len(slices)
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert len(names) == len(set(names)), "a device is in two slices"
    return names


def test_split_keeps_to_the_limits() -> None:
    devices = [dev(i) for i in range(200)]
    assert [len(c) for c in split(devices, taints=True)] == [64, 64, 64, 8]
    assert [len(c) for c in split(devices, taints=False)] == [128, 72]
    tainted = [dev(i, down=i == 150) for i in range(200)]
    assert [len(c) for c in split(tainted, taints=False)] == [64, 64, 64, 8]
    assert split([], taints=True) == [[]]
    wide = {"name": "x", "attributes": {f"a{i}": {"int": i} for i in range(40)}}
    assert len(fit_device(wide)["attributes"]) == 32


async def test_a_200_device_sriov_node_publishes(
        api: FakeApiServer, client: SliceApi, tmp_path: Path) -> None:
    node = sriov_node(tmp_path / "n")
    inventory = discover_node(node.sysfs_root, node.dev_root)
    big = DeviceOffer.build(inventory.hcas, DRIVER, Mode.SHARED, True, inventory.rdma_cm)
    # 200 functions and the node-wide device: the latter counts toward the limits too.
    assert len(big.devices) == 201
    publisher = SlicePublisher(client, DRIVER, NODE, NODE)
    assert await publisher.publish(big)
    names = pool_is_whole(api)
    assert sorted(names) == sorted(d["name"] for d in big.devices)
    assert len(mine(api)) == 4
    uid = api.cluster.nodes[0]["metadata"]["uid"]
    for s in mine(api):
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid, "controller": True}]


async def test_one_port_change_is_one_put_and_no_list(
        api: FakeApiServer, client: SliceApi) -> None:
    publisher = SlicePublisher(client, DRIVER, NODE, NODE)
    await publisher.publish(offer([dev(i) for i in range(200)]))
    generation = mine(api)[0]["spec"]["pool"]["generation"]
    before = len(api.requests)
    await publisher.publish(offer([dev(i, down=i == 70) for i in range(200)]))
    sent = [(r.method, r.path.rsplit("/", 1)[-1]) for r in api.requests[before:]]
    assert len(sent) == 1 and sent[0][0] == "PUT"
    changed = next(s for s in mine(api) if s["metadata"]["name"] == sent[0][1])
    assert "vf-070" in [d["name"] for d in changed["spec"]["devices"]]
    pool_is_whole(api)
    assert mine(api)[0]["spec"]["pool"]["generation"] == generation
    # The same offer again costs nothing at all.
    before = len(api.requests)
    assert not await publisher.publish(offer([dev(i, down=i == 70) for i in range(200)]))
    assert len(api.requests) == before


async def test_a_smaller_pool_bumps_the_generation_and_removes_stale_slices(
        api: FakeApiServer, client: SliceApi) -> None:
    publisher = SlicePublisher(client, DRIVER, NODE, NODE)
    await publisher.publish(offer([dev(i) for i in range(200)]))
    await publisher.publish(offer([dev(i) for i in range(100)]))
    assert sorted(pool_is_whole(api)) == [f"vf-{i:03d}" for i in range(100)]
    assert {s["spec"]["pool"]["generation"] for s in mine(api)} == {2}
    assert api.count("DELETE") == 2 and api.count("GET") == 2  # the first LIST, the Node


async def test_a_conflict_or_a_missing_slice_makes_one_fresh_read(
        api: FakeApiServer, client: SliceApi) -> None:
    publisher = SlicePublisher(client, DRIVER, NODE, NODE)
    await publisher.publish(offer([dev(i) for i in range(10)]))
    (s,) = mine(api)
    api.touch("resourceslices", "", s["metadata"]["name"])  # another writer: a 409 next
    lists = api.count("GET", "/resourceslices")
    await publisher.publish(offer([dev(i, down=i == 3) for i in range(10)]))
    assert api.count("GET", "/resourceslices") == lists + 1
    assert mine(api)[0]["spec"]["devices"][3]["taints"]
    api.delete("resourceslices", "", s["metadata"]["name"])
    await publisher.publish(offer([dev(i) for i in range(10)]))
    assert api.count("GET", "/resourceslices") == lists + 2
    pool_is_whole(api)
    assert [r.method for r in api.writes()][-2:] == ["PUT", "POST"]


async def test_a_recreated_node_gets_slices_owned_by_the_new_object(
        api: FakeApiServer, client: SliceApi) -> None:
    publisher = SlicePublisher(client, DRIVER, NODE, NODE)
    await publisher.publish(offer([dev(i) for i in range(3)]))
    new_uid = api.add_node(NODE)
    for s in mine(api):  # the garbage collector removes the old node's slices
        api.delete("resourceslices", "", s["metadata"]["name"])
    await publisher.publish(offer([dev(i) for i in range(3)]), check=True)
    assert [s["metadata"]["ownerReferences"][0]["uid"] for s in mine(api)] == [new_uid]


async def test_without_a_node_object_slices_go_out_unowned(
        api: FakeApiServer, client: SliceApi, caplog: pytest.LogCaptureFixture) -> None:
    api.cluster.nodes.clear()
    publisher = SlicePublisher(client, DRIVER, NODE, NODE)
    await publisher.publish(offer([dev(0)]))
    await publisher.publish(offer([dev(1)]), check=True)
    assert "ownerReferences" not in mine(api)[0]["metadata"]
    assert sum("not found on the API server" in r.message for r in caplog.records) == 1


def test_a_flapping_port_is_written_at_most_every_spacing() -> None:
    # 30 s of a port flapping every 100 ms, on a simulated clock: when the loop may write,
    # it writes the state of that moment.
    damper = Damper(2.5)
    writes: list[tuple[float, bool]] = []
    changes = [(round(i * 0.1, 1), i % 2 == 1) for i in range(301)]
    pending: bool | None = None
    t, c = 0.0, 0
    while t <= 40:
        while c < len(changes) and changes[c][0] <= t:
            pending = changes[c][1]
            c += 1
        if pending is not None and damper.hold(t) == 0:
            writes.append((t, pending))
            damper.wrote(t)
            pending = None
        t = round(t + 0.05, 2)
    assert writes[0][0] == 0.0  # the first change of a quiet node: at once
    assert len([w for w in writes if w[0] <= 30]) <= 15
    last_change = changes[-1][0]
    assert writes[-1][1] == changes[-1][1] and writes[-1][0] - last_change <= 3


async def test_the_first_publish_waits_its_start_jitter_and_a_retry_backs_off(
        api: FakeApiServer, client: SliceApi) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    publisher = SlicePublisher(client, DRIVER, NODE, NODE, desired=offer([dev(0)]),
                               start_jitter=8.0, sleep=sleep, rng=random.Random(7))
    api.fail(500, path="/resourceslices")  # the first LIST fails: backoff, then again
    task = asyncio.create_task(publisher.run())
    try:
        assert await asyncio.wait_for(publisher.published.wait(), 10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert 0 <= waits[0] <= 8.0 and waits[0] == random.Random(7).uniform(0, 8.0)
    assert 0.1 <= waits[1] <= 0.2  # the backoff after the 500
    assert [s["spec"]["devices"] for s in mine(api)] == [[dev(0)]]
    assert publisher.stats.error is None and publisher.stats.passes == 1


async def test_the_stats_count_each_write_read_and_pass(
        api: FakeApiServer, client: SliceApi) -> None:
    publisher = SlicePublisher(client, DRIVER, NODE, NODE)
    await publisher.publish(offer([dev(i) for i in range(200)]))
    assert (publisher.stats.created, publisher.stats.updated, publisher.stats.deleted,
            publisher.stats.reads) == (4, 0, 0, 1)
    await publisher.publish(offer([dev(i) for i in range(100)]))
    # Two slices gone, the two left rewritten at the next generation.
    assert (publisher.stats.created, publisher.stats.updated, publisher.stats.deleted) == (
        4, 2, 2)
    assert publisher.stats.writes == 8 == len(api.writes())
    assert publisher.stats.generation == 2


async def test_a_failed_pass_is_counted_with_its_error_until_a_good_one(
        api: FakeApiServer, client: SliceApi) -> None:
    seen: list[tuple[int, str | None]] = []

    async def sleep(seconds: float) -> None:
        # The loop backs off after counting the failed pass: what it counted shows here.
        seen.append((publisher.stats.errors, publisher.stats.error))

    publisher = SlicePublisher(client, DRIVER, NODE, NODE, desired=offer([dev(0)]),
                               sleep=sleep, rng=random.Random(1))
    api.fail(500, times=2, path="/resourceslices")
    task = asyncio.create_task(publisher.run())
    try:
        await asyncio.wait_for(publisher.published.wait(), 10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [n for n, _ in seen] == [1, 2]
    assert all("HTTP 500" in (error or "") for _, error in seen)
    assert publisher.stats.errors == 2 and publisher.stats.passes == 1
    assert publisher.stats.error is None  # cleared by the good pass


async def test_an_update_with_the_same_devices_queues_nothing(
        api: FakeApiServer, client: SliceApi) -> None:
    # No desired devices yet: nothing to publish, not even an empty pool (it would delete
    # what a previous instance published).
    assert SlicePublisher(client, DRIVER, NODE, NODE).idle
    publisher = SlicePublisher(client, DRIVER, NODE, NODE, desired=offer([dev(0)]), resync=0)
    assert not publisher.idle  # the first pass is due
    task = asyncio.create_task(publisher.run())
    try:
        await asyncio.wait_for(publisher.published.wait(), 10)
        assert publisher.idle
        writes = len(api.writes())
        publisher.update(offer([dev(0)]))
        assert publisher.idle  # the same devices: no pass
        publisher.published.clear()
        publisher.update(offer([dev(0, down=True)]))
        assert not publisher.idle
        await asyncio.wait_for(publisher.published.wait(), 10)
        assert len(api.writes()) == writes + 1 and publisher.stats.passes == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
