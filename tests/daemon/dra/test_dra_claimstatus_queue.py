"""The claim status writer's queue, against the fake API server holding requests: one
pending write per claim, a bounded queue that loses no prepared claim's state, retries on
409 and on faults until written; and the driver's claim reads and slice writes never
waiting behind a backlog of status writes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from claimstatus_support import Claims, Sleeps, small_node, status_patches, writer
from dra_support import DRIVER, NODE

from rdma_hca.daemon.dra.claims import parse_claim
from rdma_hca.daemon.dra.kubeapi import SliceApi
from rdma_hca.devkit.dra.stage import DraStage, with_changes
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return small_node(tmp_path)


async def held(fault: Any, count: int = 1) -> None:
    assert await wait_until(lambda: fault.held >= count, 10.0, step=0.005)


async def test_prepare_then_unprepare_before_the_write_sends_nothing(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claims = Claims(api)
    busy, quiet = claims.add("busy"), claims.add("quiet")
    w = writer(client, node, claims, workers=1)
    hold = api.hold(method="PATCH", path="/busy/status")
    await w.on_prepared(busy, claims.prepare(busy))
    await held(hold)  # the one worker is busy: the next claim's write waits its turn
    await w.on_prepared(quiet, claims.prepare(quiet), parse_claim(api.claim("ns", "quiet")))
    claims.prepared.pop(quiet.uid)
    await w.on_unprepared(quiet)
    hold.release()
    await asyncio.wait_for(w.drained(), 10)
    assert status_patches(api, "quiet") == 0 and api.count("GET", "/resourceclaims/quiet") == 0
    assert claims.entries("quiet") == [] and len(claims.entries("busy")) == 1
    assert w.coalesced == 1


async def test_a_claim_prepared_before_a_restart_gets_its_removal(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claims = Claims(api)
    ref = claims.add("c")
    before = writer(client, node, claims)
    await before.on_prepared(ref, claims.prepare(ref), parse_claim(api.claim("ns", "c")))
    await asyncio.wait_for(before.drained(), 10)
    await before.close()
    after = writer(client, node, claims)  # a new process: it wrote nothing itself
    await after.on_unprepared(ref)
    await asyncio.wait_for(after.drained(), 10)
    assert claims.entries("c") == [] and status_patches(api, "c") == 2


async def test_unprepare_while_the_write_is_out_is_one_removal_after_it(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claims = Claims(api)
    ref = claims.add("c")
    w = writer(client, node, claims)
    hold = api.hold(method="PATCH", path="/c/status")
    await w.on_prepared(ref, claims.prepare(ref))
    await held(hold)
    claims.prepared.pop(ref.uid)
    await w.on_unprepared(ref)
    await w.on_prepared(ref, claims.prepare(ref))  # and prepared again, and unprepared
    claims.prepared.pop(ref.uid)
    await w.on_unprepared(ref)
    hold.release()
    await asyncio.wait_for(w.drained(), 10)
    # The write that was out, then one removal: never a second write of the entries.
    assert status_patches(api, "c") == 2 and claims.entries("c") == []


async def test_a_full_queue_sets_a_prepared_claim_aside_and_writes_it_later(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claims = Claims(api)
    first, *rest = [claims.add(f"c{i}") for i in range(5)]
    w = writer(client, node, claims, workers=1, max_pending=2)
    hold = api.hold(method="PATCH", path="/c0/status")
    await w.on_prepared(first, claims.prepare(first), parse_claim(api.claim("ns", "c0")))
    await held(hold)
    for ref in rest:  # four more, two more than the queue holds, while the first is out
        await w.on_prepared(ref, claims.prepare(ref), parse_claim(api.claim("ns", ref.name)))
    assert w.set_aside == 2 and w.lost == 0
    hold.release()
    await asyncio.wait_for(w.drained(), 10)
    assert all(len(claims.entries(f"c{i}")) == 1 for i in range(5))
    # The two set aside were read again (the queue kept no copy of them), once each.
    assert api.count("GET", "/resourceclaims/") == 2


async def test_a_full_queue_of_removals_drops_the_oldest_and_says_so(
        api: FakeApiServer, client: SliceApi, node: SimNode,
        caplog: pytest.LogCaptureFixture) -> None:
    claims = Claims(api)
    refs = [claims.add(f"c{i}") for i in range(4)]
    w = writer(client, node, claims, workers=1, max_pending=2)
    for ref in refs:
        await w.on_prepared(ref, claims.prepare(ref))
    await asyncio.wait_for(w.drained(), 10)
    hold = api.hold(method="PATCH", path="/c0/status")
    for ref in refs:  # all unprepared while the server holds the first removal
        claims.prepared.pop(ref.uid)
        await w.on_unprepared(ref)
        if ref is refs[0]:
            await held(hold)
    assert w.lost == 1
    assert sum("keeps this driver's entries" in r.message for r in caplog.records) == 1
    hold.release()
    await asyncio.wait_for(w.drained(), 10)
    assert [len(claims.entries(f"c{i}")) for i in range(4)] == [0, 1, 0, 0]


async def test_faults_are_retried_with_a_growing_backoff_until_written(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claims = Claims(api)
    ref = claims.add("c")
    sleeps = Sleeps()
    w = writer(client, node, claims, sleep=sleeps)
    api.fail(500, method="PATCH", path="/status", times=3)
    await w.on_prepared(ref, claims.prepare(ref), parse_claim(api.claim("ns", "c")))
    await asyncio.wait_for(w.drained(), 10)
    assert len(claims.entries("c")) == 1 and status_patches(api, "c") == 4
    assert len(sleeps.waits) == 3 and sleeps.waits[2] > sleeps.waits[0]
    # After a failure the claim is read again: what Prepare read may be stale by then.
    assert api.count("GET", "/resourceclaims/c") == 3


async def test_a_claim_written_since_prepare_read_it_is_applied_without_a_read(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claims = Claims(api)
    ref = claims.add("c")
    w = writer(client, node, claims)
    known = parse_claim(api.claim("ns", "c"))
    api.touch("resourceclaims", "ns", "c")  # someone wrote it after Prepare read it
    await w.on_prepared(ref, claims.prepare(ref), known)
    await asyncio.wait_for(w.drained(), 10)
    assert len(claims.entries("c")) == 1
    # No resourceVersion in an apply: a newer claim is no conflict, and costs no read.
    assert status_patches(api, "c") == 1 and api.count("GET", "/resourceclaims/c") == 0


async def test_a_status_backlog_delays_neither_a_claim_read_nor_a_taint(
        tmp_path: Path, api: FakeApiServer) -> None:
    node = sim.gpu_node(tmp_path / "node", hcas=4, gid_table_size=8)
    # The driver's budget raised only so the backlog drains quickly once released.
    async with DraStage(node, tmp_path / "stage", api=api, node_name=NODE, pod_uid="pod-a",
                        config=with_changes(api_qps=100.0)) as stage:
        assert stage.kubelet is not None and stage.driver is not None
        assert await stage.registered() and await stage.until(lambda: bool(stage.devices()))
        writer_ = stage.driver.status_writer
        assert writer_ is not None
        hold = api.hold(method="PATCH", path="/status")
        uids = [api.add_claim("ns", f"c{i}", [
            {"request": "hca", "driver": DRIVER, "pool": NODE, "device": f"mlx5-{i % 4}"}])
            for i in range(30)]
        answers = await asyncio.gather(*(stage.kubelet.prepare(DRIVER, [("ns", u, f"c{i}")])
                                         for i, u in enumerate(uids)))
        assert all(a.claims[u].error == "" for a, u in zip(answers, uids, strict=True))
        await held(hold, 4)  # every worker waits on the server: a backlog of 26 more
        assert writer_.pending == 30
        # A fresh claim is read and prepared, and a port going down is published.
        uid = api.add_claim("ns", "late", [
            {"request": "hca", "driver": DRIVER, "pool": NODE, "device": "mlx5-0"}])
        late = await stage.kubelet.prepare(DRIVER, [("ns", uid, "late")])
        assert late.claims[uid].error == ""
        node.set_port("mlx5_2", up=False)
        assert await stage.until(lambda: "taints" in stage.devices().get("mlx5-2", {}))
        assert all(not c["status"].get("devices") for c in api.cluster.resource_claims)
        hold.release()
        await asyncio.wait_for(writer_.drained(), 30)
        assert all(len(c["status"]["devices"]) == 1 for c in api.cluster.resource_claims)


async def test_every_status_is_written_after_a_burst(
        tmp_path: Path, api: FakeApiServer) -> None:
    node = sim.gpu_node(tmp_path / "node", hcas=4, gid_table_size=8)
    # A raised driver budget only to keep the test short: what it asserts is that none is
    # lost, under faults (the time at default settings is a benchmark figure).
    fast = with_changes(api_qps=1000.0, api_burst=1000)
    async with DraStage(node, tmp_path / "stage", api=api, node_name=NODE, config=fast,
                        pod_uid="pod-a") as stage:
        assert stage.kubelet is not None and stage.driver is not None
        assert await stage.registered() and await stage.until(lambda: bool(stage.devices()))
        writer_ = stage.driver.status_writer
        assert writer_ is not None
        api.fail(500, method="PATCH", path="/status", times=10)
        api.fail(429, retry_after="0", method="PATCH", path="/status", times=10)
        api.hang(0.2, method="PATCH", path="/status", times=3)
        uids = [api.add_claim("ns", f"c{i}", [
            {"request": "hca", "driver": DRIVER, "pool": NODE, "device": f"mlx5-{i % 4}"}])
            for i in range(60)]
        answers = await asyncio.gather(*(stage.kubelet.prepare(DRIVER, [("ns", u, f"c{i}")])
                                         for i, u in enumerate(uids)))
        assert all(a.claims[u].error == "" for a, u in zip(answers, uids, strict=True))
        await asyncio.wait_for(writer_.drained(), 60)
        assert all(len(c["status"]["devices"]) == 1 for c in api.cluster.resource_claims)
        assert writer_.retries > 0
