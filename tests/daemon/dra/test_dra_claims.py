"""Claims are independent: concurrency, per-claim serialization, hooks, one read deadline."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.contract.checkpoint import PreparedDevice
from rdma_hca.daemon.dra.checkpoint import Checkpoint
from rdma_hca.daemon.dra.claims import Claim, ClaimError, ClaimRef, parse_claim, read_claim
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.daemon.dra.driver import DraDriver
from rdma_hca.daemon.dra.hooks import ClaimHooks
from rdma_hca.daemon.dra.prepare import ClaimPreparer
from rdma_hca.daemon.dra.prepared import PreparedClaims
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.kube.cluster import Recorded
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.settings.model import DraConfig, Mode, Settings


def _result(device: str, request: str = "hca") -> dict[str, str]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device}


class ClaimGate:
    """Holds the fake API server's claim reads until released; counts them."""

    def __init__(self, api: FakeApiServer) -> None:
        self.open = threading.Event()
        self.open.set()
        self.waiting = 0
        self.most_waiting = 0
        self.reads = 0
        self._lock = threading.Lock()
        api.on_request = self._on_request

    def _on_request(self, record: Recorded) -> None:
        if record.method != "GET" or "/resourceclaims/" not in record.path:
            return
        with self._lock:
            self.reads += 1
            self.waiting += 1
            self.most_waiting = max(self.most_waiting, self.waiting)
        self.open.wait(30)
        with self._lock:
            self.waiting -= 1


@pytest.fixture
def gate(api: FakeApiServer) -> Iterator[ClaimGate]:
    g = ClaimGate(api)
    yield g
    g.open.set()
    api.on_request = None


async def test_a_calls_claims_are_read_at_once_and_a_prepared_claim_does_not_wait(
        stage: DraStage, gate: ClaimGate) -> None:
    assert stage.kubelet is not None
    known = stage.api.add_claim("ns", "known", [_result("mlx5-0")])
    assert (await stage.kubelet.prepare(DRIVER, [("ns", known, "known")])).claims[known].error \
        == ""
    new = [stage.api.add_claim("ns", f"n{i}", [_result(f"mlx5-{i + 1}")]) for i in range(3)]
    gate.open.clear()  # the API server hangs
    slow = asyncio.create_task(stage.kubelet.prepare(
        DRIVER, [("ns", uid, f"n{i}") for i, uid in enumerate(new)]))
    assert await stage.until(lambda: gate.waiting == 3)  # all three in flight together
    reads = gate.reads
    fast = await stage.kubelet.prepare(DRIVER, [("ns", known, "known")])
    assert fast.claims[known].error == "" and not slow.done()
    assert gate.reads == reads  # answered from what was prepared
    gate.open.set()
    resp = await slow
    assert all(resp.claims[uid].error == "" for uid in new)
    assert gate.most_waiting == 3


async def test_a_hanging_api_costs_a_call_one_read_deadline_not_one_per_claim(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer, gate: ClaimGate) -> None:
    tune = lambda c: dataclasses.replace(c, read_deadline=0.5)  # noqa: E731
    async with DraStage(dra_node, tmp_path / "s", api=api, config=tune) as s:
        assert s.kubelet is not None and await s.registered()
        uids = [api.add_claim("ns", f"c{i}", [_result(f"mlx5-{i}")]) for i in range(4)]
        gate.open.clear()
        resp = await s.kubelet.prepare(DRIVER, [("ns", u, f"c{i}") for i, u in enumerate(uids)])
        # Every read was waiting at the same time: the deadlines ran side by side.
        assert gate.most_waiting == 4 and gate.reads == 4
        assert all("no answer within 0.5 s" in resp.claims[u].error for u in uids)
        gate.open.set()


async def test_one_claim_in_two_calls_is_read_once(stage: DraStage, gate: ClaimGate) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim("ns", "twice", [_result("mlx5-2")])
    gate.open.clear()
    first = asyncio.create_task(stage.kubelet.prepare(DRIVER, [("ns", uid, "twice")]))
    assert await stage.until(lambda: gate.waiting == 1)
    second = asyncio.create_task(stage.kubelet.prepare(DRIVER, [("ns", uid, "twice")]))
    gate.open.set()
    a, b = await first, await second
    assert a.claims[uid] == b.claims[uid] and a.claims[uid].error == ""
    assert gate.reads == 1  # the second waited for the first, then found it prepared


async def test_hooks_see_the_claim_and_a_failing_one_fails_nothing(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer,
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, tuple[PreparedDevice, ...]]] = []
    gone: list[str] = []

    async def on_prepared(ref: ClaimRef, devices: tuple[PreparedDevice, ...],
                          claim: Claim) -> None:
        assert claim.ref == ref  # the claim as Prepare read it
        seen.append((claim.name, devices))
        raise RuntimeError("status write refused")

    async def on_unprepared(ref: ClaimRef) -> None:
        gone.append(ref.name)

    def driver(config: DriverConfig) -> DraDriver:
        return DraDriver(config, on_prepared=on_prepared, on_unprepared=on_unprepared)

    async with DraStage(dra_node, tmp_path / "s", api=api, driver=driver) as s:
        assert s.kubelet is not None and s.driver is not None and await s.registered()
        uids = [api.add_claim("ns", f"c{i}", [_result(f"mlx5-{i}")]) for i in range(2)]
        with caplog.at_level(logging.WARNING, logger="rdma_hca.daemon.dra.hooks"):
            for i, uid in enumerate(uids):
                resp = await s.kubelet.prepare(DRIVER, [("ns", uid, f"c{i}")])
                assert resp.claims[uid].error == ""
            await s.driver.preparer.hooks.done()
        assert [name for name, _ in seen] == ["c0", "c1"]
        assert [d.device for d in seen[0][1]] == ["mlx5-0"]
        assert s.driver.preparer.hooks.failures == 2
        said = [r for r in caplog.records if "hook failed" in r.getMessage()]
        assert len(said) == 1  # once per reason
        await s.kubelet.unprepare(DRIVER, [("ns", uids[0], "c0")])
        await s.driver.preparer.hooks.done()
        assert gone == ["c0"]


def test_a_claim_is_parsed_at_the_edge() -> None:
    claim = parse_claim({
        "metadata": {"namespace": "ns", "name": "c", "uid": "u1"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": DRIVER, "pool": NODE, "device": "mlx5-0",
             "shareID": "s-1"},
            {"request": "g", "driver": "gpu.example.com", "pool": NODE, "device": "gpu-0"},
            "not a result"]}}}})
    assert claim.uid == "u1" and len(claim.devices) == 2
    assert [(d.device, d.share_id) for d in claim.of(DRIVER)] == [("mlx5-0", "s-1")]
    with pytest.raises(ClaimError, match="has no uid"):
        parse_claim({"metadata": {"namespace": "ns", "name": "c"}})
    with pytest.raises(ClaimError, match="not a ResourceClaim"):
        parse_claim(["x"])


def test_the_claim_prepare_parsed_is_what_the_status_writer_reads() -> None:
    claim = parse_claim({
        "metadata": {"namespace": "ns", "name": "c", "uid": "u1", "generation": 3},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "r", "driver": DRIVER, "pool": NODE, "device": "mlx5-0"}]}},
            "devices": [
                {"driver": DRIVER, "pool": NODE, "device": "mlx5-0",
                 "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                                 "message": "m", "lastTransitionTime": "t",
                                 "observedGeneration": 2}]},
                {"driver": "gpu.example.com", "pool": NODE, "device": "gpu-0"},
                "not an entry"]}})
    assert claim.generation == 3 and len(claim.entries) == 2
    [ours] = claim.entries_of(DRIVER)
    assert ours.key == (DRIVER, NODE, "mlx5-0", "")
    assert [c.observed_generation for c in ours.conditions] == [2]
    # An answer to a status write is read as found: what is missing reads as none.
    answered = read_claim({"status": {"devices": [{"driver": DRIVER}]}})
    assert (answered.uid, answered.generation, answered.devices) == ("", None, ())
    assert not answered.allocated and [e.driver for e in answered.entries] == [DRIVER]


@pytest.mark.parametrize("mode", [Mode.EXCLUSIVE, Mode.SHARED])
async def test_an_exclusive_device_takes_one_claim_at_a_time(tmp_path: Path, mode: Mode) -> None:
    settings = Settings(node_name=NODE, kubelet_root=str(tmp_path),
                        dra=DraConfig(enabled=True, mode=mode))
    config = DriverConfig.from_settings(settings)
    offer = DeviceOffer.build((), config.driver_name, config.mode, False, None)
    io = OffLoop(5.0)
    prepared = PreparedClaims(Checkpoint(config.checkpoint, config.lock_path), io, {},
                              shared=False)
    keeper = ClaimPreparer(config, io, prepared, offer=lambda: offer, hooks=ClaimHooks())
    order: list[str] = []
    release = asyncio.Event()

    async def claim(name: str, devices: list[str], hold: bool, admin: bool = False) -> None:
        prepared = [PreparedDevice(("r",), NODE, d, d, (), admin_access=admin)
                    for d in devices]
        async with keeper._devices_locked(prepared):
            order.append(f"{name} in")
            if hold:
                await release.wait()
            order.append(f"{name} out")

    first = asyncio.create_task(claim("a", ["mlx5-0", "mlx5-1"], True))
    assert await wait_until(lambda: order == ["a in"], 5.0)
    # Admin access takes no turn, in either mode: it neither waits nor is waited for.
    await claim("watch", ["mlx5-1"], False, admin=True)
    assert order == ["a in", "watch in", "watch out"] and keeper.device_waits == 0
    del order[1:]
    second = asyncio.create_task(claim("b", ["mlx5-1"], False))
    if mode is Mode.EXCLUSIVE:
        assert await wait_until(lambda: keeper.device_waits == 1, 5.0)
        release.set()
        await asyncio.gather(first, second)
        assert order == ["a in", "a out", "b in", "b out"]
    else:
        await second  # shared: nothing to wait for
        release.set()
        await first
        assert order == ["a in", "b in", "b out", "a out"] and keeper.device_waits == 0
