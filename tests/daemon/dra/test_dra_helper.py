"""The kubelet plugin helper: options checked at start, a claim read and checked before
its lock, and the driver proper seen through one seam."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.daemon.dra.claims import ClaimError, ClaimRef, parse_claim
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.kubeletplugin.fetch import check_claim
from rdma_hca.daemon.dra.kubeletplugin.options import DraConfigError, HelperOptions
from rdma_hca.daemon.dra.kubeletplugin.serialize import ClaimBusy, ClaimLocks
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.settings.model import DraConfig, Settings


def _claim_gets(api: FakeApiServer) -> int:
    return sum(1 for r in api.requests if r.method == "GET" and "/resourceclaims/" in r.path)


def _result(device: str, driver: str = DRIVER) -> dict[str, str]:
    return {"request": "hca", "driver": driver, "pool": NODE, "device": device}


async def test_a_claim_is_read_before_its_lock_is_taken(stage: DraStage) -> None:
    assert stage.kubelet is not None and stage.driver is not None
    uid = stage.api.add_claim("ns", "c", [_result("mlx5-1")])
    gets = _claim_gets(stage.api)
    async with stage.driver.helper.locks.held(uid):
        call = asyncio.create_task(stage.kubelet.prepare(DRIVER, [("ns", uid, "c")]))
        # The API read is done while another call holds the claim's lock.
        assert await stage.until(lambda: _claim_gets(stage.api) == gets + 1)
        assert not call.done()
    resp = await call
    assert resp.claims[uid].error == ""
    assert _claim_gets(stage.api) == gets + 1


async def test_a_claim_refused_at_the_check_takes_no_lock(stage: DraStage) -> None:
    assert stage.kubelet is not None and stage.driver is not None
    other = stage.api.add_claim("ns", "gpu", [_result("gpu-0", driver="gpu.example.com")])
    async with stage.driver.helper.locks.held(other):
        # Answered although the claim's lock is held: it never got as far as the lock.
        resp = await asyncio.wait_for(
            stage.kubelet.prepare(DRIVER, [("ns", other, "gpu")]), 10)
    assert "no device of driver" in resp.claims[other].error
    assert stage.driver.stats().prepares == {"ok": 0, "error": 1}


async def test_a_call_crosses_the_seam_once_whatever_its_claims_need(
        stage: DraStage, monkeypatch: pytest.MonkeyPatch) -> None:
    assert stage.kubelet is not None and stage.driver is not None
    preparer = stage.driver.preparer
    known = stage.api.add_claim("ns", "known", [_result("mlx5-0")])
    assert (await stage.kubelet.prepare(DRIVER, [("ns", known, "known")])).claims[known] \
        .error == ""
    fresh = [stage.api.add_claim("ns", f"f{i}", [_result(f"mlx5-{i + 1}")]) for i in range(2)]
    other = stage.api.add_claim("ns", "gpu", [_result("gpu-0", driver="gpu.example.com")])
    batches: list[list[str]] = []
    prepare_claims = preparer.prepare_claims

    async def counted(claims: Any, fetch: Any) -> Any:
        batches.append(sorted(c.uid for c in claims))
        return await prepare_claims(claims, fetch)

    monkeypatch.setattr(preparer, "prepare_claims", counted)
    gets = _claim_gets(stage.api)
    resp = await stage.kubelet.prepare(DRIVER, [("ns", known, "known"), ("ns", other, "gpu"),
                                                *(("ns", u, f"f{i}") for i, u in
                                                  enumerate(fresh))])
    # One call with every claim that passed the check; the refused one never got there.
    assert batches == [sorted([known, *fresh])]
    assert all(resp.claims[u].error == "" for u in [known, *fresh])
    assert "no device of driver" in resp.claims[other].error
    assert _claim_gets(stage.api) == gets + 3  # the claim on record is not read
    assert set(stage.driver.prepared) == {known, *fresh}


def test_the_check_says_which_claim_is_not_preparable() -> None:
    body = {"metadata": {"namespace": "ns", "name": "c", "uid": "u1"},
            "status": {"allocation": {"devices": {"results": [_result("mlx5-0")]}}}}
    claim = parse_claim(body)
    check_claim(claim, ClaimRef("ns", "u1", "c"), DRIVER)
    with pytest.raises(ClaimError, match="has UID u1, not u2: it was deleted and created"):
        check_claim(claim, ClaimRef("ns", "u2", "c"), DRIVER)
    with pytest.raises(ClaimError, match=r"has no device of driver other\.example\.com"):
        check_claim(claim, ClaimRef("ns", "u1", "c"), "other.example.com")
    pending = parse_claim({"metadata": body["metadata"], "status": {}})
    assert not pending.allocated and claim.allocated
    with pytest.raises(ClaimError, match="ns/c is not allocated yet"):
        check_claim(pending, ClaimRef("ns", "u1", "c"), DRIVER)


def test_a_template_claim_keeps_its_pod_claim_name() -> None:
    claim = parse_claim({"metadata": {
        "namespace": "ns", "name": "pod-rdma-x1", "uid": "u1",
        "annotations": {"resource.kubernetes.io/pod-claim-name": "rdma"}}})
    assert claim.pod_claim == "rdma"
    assert parse_claim({"metadata": {"namespace": "ns", "name": "c", "uid": "u"}}) \
        .pod_claim is None


def _options(tmp_path: Path, **change: str) -> HelperOptions:
    settings = Settings(node_name=NODE, kubelet_root=str(tmp_path),
                        dra=DraConfig(enabled=True))
    config = dataclasses.replace(DriverConfig.from_settings(settings), **change)
    return HelperOptions.from_config(config)


def test_the_options_are_checked_once_with_a_fix_in_each_message(tmp_path: Path) -> None:
    _options(tmp_path).check()
    with pytest.raises(DraConfigError, match="set --node-name or NODE_NAME"):
        _options(tmp_path, node_name="").check()
    with pytest.raises(DraConfigError, match="is not a lowercase DNS subdomain"):
        _options(tmp_path, driver_name="Not_A_Name").check()
    with pytest.raises(DraConfigError, match=r"set POD_UID to the pod's metadata\.uid"):
        _options(tmp_path, pod_uid="a/b").check()
    with pytest.raises(DraConfigError, match="use a shorter kubelet root directory"):
        _options(tmp_path, plugins_dir="/" + "d" * 120).check()


class _Records:
    """Record locks that note the thread each call ran on; one claim held elsewhere."""

    def __init__(self, *, locks_now: bool, held: str = "") -> None:
        self.locks_now = locks_now
        self.held = held
        self.threads: list[tuple[str, int]] = []

    def try_lock_claim(self, uid: str) -> bool:
        self.threads.append(("lock", threading.get_ident()))
        return uid != self.held

    def unlock_claim(self, uid: str) -> None:
        self.threads.append(("unlock", threading.get_ident()))


@pytest.mark.parametrize("locks_now", [True, False])
async def test_the_record_lock_is_tried_on_the_loop_only_where_it_cannot_wait(
        locks_now: bool) -> None:
    records = _Records(locks_now=locks_now)
    locks = ClaimLocks(records, OffLoop(5.0), wait=1.0, lock_path="claims.lock")
    async with locks.held("a"):
        pass
    loop_thread = threading.get_ident()
    assert [what for what, _ in records.threads] == ["lock", "unlock"]
    assert all((thread == loop_thread) is locks_now for _, thread in records.threads)


async def test_a_record_lock_held_elsewhere_is_tried_again_until_the_wait_ends() -> None:
    records = _Records(locks_now=True, held="a")
    locks = ClaimLocks(records, OffLoop(5.0), wait=0.05, lock_path="claims.lock")
    with pytest.raises(ClaimBusy, match=r"claims\.lock"):
        async with locks.held("a"):
            pass
    assert locks.lock_waits >= 2 and len(records.threads) == locks.lock_waits
    assert all(what == "lock" for what, _ in records.threads)  # never taken: never dropped
