"""The DRA driver's Events: a Prepare that fails warns the Pod the claim is reserved for
(and the claim), with the error and the fix; the kubelet's retries are one series; and
an API server holding every Event request delays neither a Prepare nor a slice write."""

from __future__ import annotations

import time
from typing import Any

from dra_support import DRIVER, NODE

from rdma_hca.daemon.dra.claims import (
    AllocationUnreadable,
    ClaimError,
    HcaGone,
    HcaUnusable,
    NotAllocatedHere,
)
from rdma_hca.devkit.dra.stage import DraStage, share_result
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode


def _result(device: str, pool: str = NODE) -> dict[str, str]:
    return {"request": "hca", "driver": DRIVER, "pool": pool, "device": device}


def _reserve(api: FakeApiServer, namespace: str, name: str, pod: str) -> None:
    with api.store.lock:
        for claim in api.cluster.resource_claims:
            if claim["metadata"]["name"] == name and claim["metadata"]["namespace"] == namespace:
                claim["status"]["reservedFor"] = [
                    {"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]


def _count(event: dict[str, Any]) -> int:
    return int((event.get("series") or {}).get("count") or 1)


def _misallocated_claim(stage: DraStage) -> str:
    """A claim allocated from another node's pool: its Prepare fails at once."""
    uid = stage.api.add_claim("ml", "trainer-hca", [_result("mlx5-1", pool="node-b")])
    _reserve(stage.api, "ml", "trainer-hca", "trainer-0")
    return uid


async def _failing_claim(stage: DraStage, dra_node: SimNode) -> str:
    uid = stage.api.add_claim("ml", "trainer-hca", [_result("mlx5-1")])
    _reserve(stage.api, "ml", "trainer-hca", "trainer-0")
    dra_node.remove_hca("mlx5_1")
    assert await stage.until(lambda: "mlx5-1" not in stage.devices())
    return uid


async def test_a_failed_prepare_warns_the_pod_with_the_reason_and_the_fix(
        stage: DraStage, dra_node: SimNode) -> None:
    assert stage.kubelet is not None
    uid = await _failing_claim(stage, dra_node)
    started = time.monotonic()
    resp = await stage.kubelet.prepare(DRIVER, [("ml", uid, "trainer-hca")])
    assert "no longer on this node" in resp.claims[uid].error
    assert await stage.until(lambda: bool(stage.api.events(kind="Pod")))
    print(f"\nthe Pod's Event was stored {time.monotonic() - started:.3f} s after the Prepare")
    (event,) = stage.api.events(kind="Pod")
    assert event["type"] == "Warning" and event["reason"] == "ClaimPrepareFailed"
    assert event["regarding"]["name"] == "trainer-0"
    assert event["regarding"]["uid"] == "uid-trainer-0"
    assert event["metadata"]["namespace"] == "ml"
    assert event["related"]["kind"] == "ResourceClaim"
    assert event["related"]["uid"] == uid
    assert "no longer on this node" in event["note"]
    assert event["note"].endswith(f"To fix: {HcaGone.fix}")
    assert "To fix: the HCA left this node after the claim was allocated" in event["note"]
    assert "HcaDeviceGone" in event["note"]
    assert event["reportingInstance"] == NODE
    assert await stage.until(lambda: bool(stage.api.events(kind="ResourceClaim")))
    (on_claim,) = stage.api.events(kind="ResourceClaim")
    assert on_claim["note"] == event["note"]


async def test_21_failures_are_at_most_3_events_with_their_count(stage: DraStage) -> None:
    assert stage.kubelet is not None
    uid = _misallocated_claim(stage)
    for _ in range(21):
        resp = await stage.kubelet.prepare(DRIVER, [("ml", uid, "trainer-hca")])
        assert resp.claims[uid].error
    assert await stage.until(
        lambda: sum(_count(e) for e in stage.api.events(kind="Pod")) == 21)
    assert await stage.until(
        lambda: sum(_count(e) for e in stage.api.events(kind="ResourceClaim")) == 21)
    pod_events = stage.api.events(kind="Pod")
    assert len(pod_events) <= 3
    assert len(pod_events) == 1 and pod_events[0]["series"]["count"] == 21
    assert stage.driver is not None and stage.driver.events is not None
    assert stage.driver.events.dropped == 0


async def test_held_event_requests_delay_neither_a_prepare_nor_a_slice_write(
        stage: DraStage, dra_node: SimNode) -> None:
    assert stage.kubelet is not None and stage.driver is not None
    api = stage.api
    api.hang(60, path="/events", times=10_000)  # discovery and every Event request
    uid = _misallocated_claim(stage)
    failed = await stage.kubelet.prepare(DRIVER, [("ml", uid, "trainer-hca")])
    assert failed.claims[uid].error
    assert await stage.until(lambda: api.count(path="/events") >= 1)
    # The recorder is stuck on the server; the driver's own calls go on.
    fine = api.add_claim("ml", "fine", [_result("mlx5-0")])
    started = time.monotonic()
    resp = await stage.kubelet.prepare(DRIVER, [("ml", fine, "fine")])
    print(f"\na Prepare with the Event path held took {time.monotonic() - started:.3f} s")
    assert resp.claims[fine].error == ""
    dra_node.remove_hca("mlx5_2")
    assert await stage.until(lambda: "mlx5-2" not in stage.devices())
    assert stage.driver.events is not None
    assert not await stage.driver.events.drain(0.01)  # still held: nothing was sent
    assert api.events() == []


async def test_each_kind_of_failure_carries_its_own_fix(stage: DraStage) -> None:
    assert stage.kubelet is not None
    # Asked for by a UID the claim no longer has: it was deleted and created again.
    stage.api.add_claim("ml", "again", [_result("mlx5-0")])
    _reserve(stage.api, "ml", "again", "again-0")
    resp = await stage.kubelet.prepare(DRIVER, [("ml", "old-uid", "again")])
    assert "deleted and created again" in resp.claims["old-uid"].error
    # The API server refuses the read: the driver's RBAC.
    denied = stage.api.add_claim("ml", "denied", [_result("mlx5-1")])
    stage.api.fail(403, method="GET", path="/resourceclaims/denied", times=1)
    resp = await stage.kubelet.prepare(DRIVER, [("ml", denied, "denied")])
    assert "HTTP 403" in resp.claims[denied].error
    assert await stage.until(lambda: len(stage.api.events(kind="ResourceClaim")) == 2)
    notes = {e["regarding"]["name"]: e["note"] for e in stage.api.events(kind="ResourceClaim")}
    assert notes["again"].endswith("To fix: the claim was re-created; delete the pod so it is "
                                   "scheduled with the new claim")
    assert "To fix: the driver may not read the claim: give its service account get on " \
        "resourceclaims" in notes["denied"]
    # The Pods of another claim by the same name are not told of this one's failure.
    assert stage.api.events(kind="Pod") == []


async def _claim_note(stage: DraStage, name: str, results: list[dict[str, Any]]) -> str:
    """Prepare a claim that fails; the note of the Event on it."""
    assert stage.kubelet is not None
    uid = stage.api.add_claim("ml", name, results)
    resp = await stage.kubelet.prepare(DRIVER, [("ml", uid, name)])
    assert resp.claims[uid].error
    assert await stage.until(lambda: any(
        e["regarding"]["name"] == name for e in stage.api.events(kind="ResourceClaim")))
    (note,) = [e["note"] for e in stage.api.events(kind="ResourceClaim")
               if e["regarding"]["name"] == name]
    return str(note)


async def test_a_claim_of_another_pool_is_told_it_was_not_allocated_here(
        stage: DraStage) -> None:
    note = await _claim_note(stage, "elsewhere", [_result("mlx5-1", pool="node-b")])
    assert "was allocated from pool node-b" in note
    assert note.endswith(f"To fix: {NotAllocatedHere.fix}")
    assert NotAllocatedHere.fix != ClaimError.fix


async def test_an_unusable_hca_is_told_to_be_fixed(stage: DraStage, dra_node: SimNode) -> None:
    assert stage.driver is not None
    driver = stage.driver
    dra_node.remove_dev_node(dra_node.uverbs_name("mlx5_1"))
    assert await stage.until(lambda: not driver.offering.offer().hcas["mlx5-1"].usable)
    note = await _claim_note(stage, "broken", [_result("mlx5-1")])
    assert "device mlx5-1 (mlx5_1) cannot be used" in note
    assert note.endswith(f"To fix: {HcaUnusable.fix}")
    assert "the HCA is on the node but not usable" in note


async def test_a_consumed_bandwidth_that_is_no_quantity_is_told_apart(stage: DraStage) -> None:
    note = await _claim_note(stage, "odd", [share_result("hca", "mlx5-0", NODE, bandwidth="lots")])
    assert "which is not a quantity" in note
    assert note.endswith(f"To fix: {AllocationUnreadable.fix}")
