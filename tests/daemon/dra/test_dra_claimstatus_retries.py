"""The claim status writer's promises across restarts and a difficult API server: nothing
pending is lost at a stop, Retry-After is kept whatever its length (up to its cap), a
refusal is sent a few times, counted and told on the claim without silencing other
claims, a claim gone or made again is left alone, and retries in backoff count toward
the queue's bound."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from claimstatus_support import Claims, Sleeps, small_node, status_patches, writer
from dra_support import DRIVER, NODE

from rdma_hca.daemon.dra.claimevents import STATUS_REFUSED, ClaimEvents
from rdma_hca.daemon.dra.claims import parse_claim
from rdma_hca.daemon.dra.claimstatus import REFUSALS
from rdma_hca.daemon.dra.kubeapi import SliceApi
from rdma_hca.devkit.dra.stage import DraStage, with_changes
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kube.events import EventRecorder


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return small_node(tmp_path)


async def test_writes_pending_at_a_stop_are_made_by_the_next_start(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claims = Claims(api)
    refs = [claims.add(f"c{i}") for i in range(12)]
    # The server takes no status write: each hangs up without an answer (nothing stored).
    hang = api.hang(60, method="PATCH", path="/status", times=1 << 30)
    before = writer(client, node, claims)
    for ref in refs:
        await before.on_prepared(ref, claims.prepare(ref), parse_claim(api.claim("ns", ref.name)))
    assert before.pending == 12
    await before.close(drain=0.05)  # bounded: what is left is cancelled
    assert all(claims.entries(ref.name) == [] for ref in refs)
    hang.times = 0
    after = writer(client, node, claims)  # a new process over the same checkpoint
    after.start()
    await asyncio.wait_for(after.drained(), 30)
    assert all(len(claims.entries(ref.name)) == 1 for ref in refs)
    await after.close()


async def test_a_start_writes_nothing_where_the_entries_are_right(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claims = Claims(api)
    refs = [claims.add(f"c{i}") for i in range(3)]
    before = writer(client, node, claims)
    for ref in refs:
        await before.on_prepared(ref, claims.prepare(ref), parse_claim(api.claim("ns", ref.name)))
    await before.close()  # the drain writes them
    assert all(len(claims.entries(ref.name)) == 1 for ref in refs)
    written = api.count("PATCH")
    after = writer(client, node, claims)
    after.start()
    await asyncio.wait_for(after.drained(), 30)
    # One low-priority read each, and no write.
    assert api.count("PATCH") == written
    assert all(api.count("GET", f"/resourceclaims/{ref.name}") == 1 for ref in refs)


@pytest.mark.parametrize(("header", "cap", "waited"), [
    ("8", 60.0, 8.0),  # past the client's 5 s call budget: still what is waited
    ("7200", 60.0, 60.0),
    ("7200", 600.0, 600.0),
])
async def test_retry_after_is_kept_whatever_its_length_up_to_its_cap(
        api: FakeApiServer, client: SliceApi, node: SimNode,
        header: str, cap: float, waited: float) -> None:
    claims = Claims(api)
    ref = claims.add("c")
    sleeps = Sleeps()
    w = writer(client, node, claims, sleep=sleeps, retry_after_max=cap)
    api.fail(429, retry_after=header, method="PATCH", path="/status")
    await w.on_prepared(ref, claims.prepare(ref), parse_claim(api.claim("ns", "c")))
    await asyncio.wait_for(w.drained(), 10)
    assert sleeps.waits == [waited] and len(claims.entries("c")) == 1
    assert status_patches(api, "c") == 2


async def test_a_refusal_is_sent_a_few_times_told_on_the_claim_and_others_go_on(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claims = Claims(api)
    bad, good = claims.add("bad"), claims.add("good")
    recorder = EventRecorder(client.client, controller=DRIVER, instance=NODE)
    recorder.start()
    events = ClaimEvents(recorder, NODE)
    sleeps = Sleeps()
    w = writer(client, node, claims, sleep=sleeps, on_refused=events.status_refused)
    refusal = api.fail(422, method="PATCH", path="/bad/status", times=100)
    await w.on_prepared(bad, claims.prepare(bad), parse_claim(api.claim("ns", "bad")))
    await asyncio.wait_for(w.drained(), 10)
    assert status_patches(api, "bad") == REFUSALS and w.refused == REFUSALS
    await w.on_prepared(good, claims.prepare(good), parse_claim(api.claim("ns", "good")))
    await asyncio.wait_for(w.drained(), 10)
    assert len(claims.entries("good")) == 1
    await recorder.close(grace=10)
    (event,) = api.events(reason=STATUS_REFUSED)
    assert event["type"] == "Warning" and event["regarding"]["name"] == "bad"
    assert event["regarding"]["kind"] == "ResourceClaim"
    assert event.get("series", {}).get("count", 1) == REFUSALS
    assert "HTTP 422" in event["note"]
    # A new state of the claim (the kubelet's next Prepare) is sent again.
    refusal.times = 0
    await w.on_prepared(bad, claims.prepare(bad), parse_claim(api.claim("ns", "bad")))
    await asyncio.wait_for(w.drained(), 10)
    assert status_patches(api, "bad") == REFUSALS + 1 and len(claims.entries("bad")) == 1


async def test_a_claim_gone_or_made_again_is_not_written_nor_refused(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claims = Claims(api)
    gone, remade = claims.add("gone"), claims.add("remade")
    known = {r.name: parse_claim(api.claim("ns", r.name)) for r in (gone, remade)}
    api.delete("resourceclaims", "ns", "gone")
    api.delete("resourceclaims", "ns", "remade")
    claims.add("remade")
    w = writer(client, node, claims)
    for ref in (gone, remade):
        await w.on_prepared(ref, claims.prepare(ref), known[ref.name])
    await asyncio.wait_for(w.drained(), 10)
    assert claims.entries("remade") == [] and w.refused == 0 and w.retries == 0
    assert status_patches(api, "gone") == 1 and status_patches(api, "remade") == 1


async def test_retries_in_backoff_count_toward_the_bound(
        api: FakeApiServer, client: SliceApi, node: SimNode) -> None:
    claims = Claims(api)
    refs = [claims.add(f"c{i}") for i in range(4)]
    sleeps = Sleeps()
    sleeps.held = True  # a retry waits its backoff until released
    w = writer(client, node, claims, sleep=sleeps, max_pending=2, workers=1)
    api.fail(500, method="PATCH", path="/status", times=2)
    for ref in refs[:2]:
        await w.on_prepared(ref, claims.prepare(ref), parse_claim(api.claim("ns", ref.name)))
    await asyncio.wait_for(_until(lambda: len(sleeps.waits) == 2), 10)
    assert w.pending == 2 and w.set_aside == 0  # both in backoff: the queue is full
    await w.on_prepared(refs[2], claims.prepare(refs[2]), parse_claim(api.claim("ns", "c2")))
    assert w.set_aside == 1 and w.pending == 2
    sleeps.release()
    await w.on_prepared(refs[3], claims.prepare(refs[3]), parse_claim(api.claim("ns", "c3")))
    await asyncio.wait_for(w.drained(), 10)
    assert all(len(claims.entries(ref.name)) == 1 for ref in refs)


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.005)


async def test_an_update_mid_burst_loses_no_status(tmp_path: Path, api: FakeApiServer) -> None:
    """The driver stopped while its status writes get no answer, and a new one started
    over the same checkpoint: every claim's entry ends on the API server."""
    dra_node = sim.gpu_node(tmp_path / "node", hcas=4, gid_table_size=8)
    fast = with_changes(api_qps=1000.0, api_burst=1000)
    async with DraStage(dra_node, tmp_path / "stage", api=api, node_name=NODE, config=fast,
                        pod_uid="pod-a") as stage:
        assert stage.kubelet is not None and await stage.registered()
        assert await stage.until(lambda: bool(stage.devices()))
        hang = api.hang(60, method="PATCH", path="/status", times=1 << 30)
        uids = [api.add_claim("ns", f"c{i}", [
            {"request": "hca", "driver": DRIVER, "pool": NODE, "device": f"mlx5-{i % 4}"}])
            for i in range(20)]
        answers = await asyncio.gather(*(stage.kubelet.prepare(DRIVER, [("ns", u, f"c{i}")])
                                         for i, u in enumerate(uids)))
        assert all(a.claims[u].error == "" for a, u in zip(answers, uids, strict=True))
        await stage.stop_driver()
        assert all(not c["status"].get("devices") for c in api.cluster.resource_claims)
        hang.times = 0
        await stage.start_driver()
        await stage.statuses_written(30)
        assert all(len(c["status"]["devices"]) == 1 for c in api.cluster.resource_claims)
