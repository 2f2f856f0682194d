"""Group commit of the checkpoint: the claims ready at one moment cost one write, two
instances on one file never lose each other's entries, and a failed write fails every
claim it carried with nothing left behind."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from dra_support import DRIVER, NODE

from rdma_hca.daemon.dra.checkpoint import Checkpoint
from rdma_hca.daemon.dra.claims import ClaimRef
from rdma_hca.daemon.dra.driver import DraDriver
from rdma_hca.daemon.dra.groupcommit import GroupCommit
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim

CLAIMS = 12


def _result(device: str) -> dict[str, str]:
    return {"request": "hca", "driver": DRIVER, "pool": NODE, "device": device}


def _claims(api: FakeApiServer, prefix: str, count: int = CLAIMS) -> list[ClaimRef]:
    refs = []
    for i in range(count):
        name = f"{prefix}-{i}"
        refs.append(ClaimRef("ns", api.add_claim("ns", name, [_result(f"mlx5-{i % 4}")]),
                             name))
    return refs


def _on_disk(path: str) -> set[str]:
    return set(json.loads(Path(path).read_text())["claims"])


def _specs(stage: DraStage) -> list[str]:
    return sorted(os.listdir(stage.cdi_dir)) if stage.cdi_dir.exists() else []


class Gate:
    """A checkpoint write hook that holds the first write until released, counts every
    write with its size, and fails the writes after the first when told to."""

    def __init__(self, checkpoint: Checkpoint, *, fail_after_first: bool = False) -> None:
        self.inner: Callable[[str, str], None] = checkpoint.write
        self.held = threading.Event()  # the first write is waiting
        self.release = threading.Event()
        self.sizes: list[int] = []
        self.fail_after_first = fail_after_first
        checkpoint.write = self

    def __call__(self, path: str, text: str) -> None:
        first = not self.sizes
        self.sizes.append(len(text))
        if first:
            self.held.set()
            self.release.wait(30)
        elif self.fail_after_first:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        self.inner(path, text)


def _piled_up(gate: Gate, commits: GroupCommit) -> Callable[[], bool]:
    """The first write is held and every other claim waits behind it."""
    return lambda: gate.held.is_set() and commits.in_flight + commits.waiting == CLAIMS


async def _until(fact: Callable[[], bool]) -> None:
    for _ in range(2000):
        if fact():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never happened")


async def test_the_claims_ready_at_one_moment_cost_one_checkpoint_write(
        dra_node: sim.SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api, pod_uid="pod-a") as s:
        assert s.driver is not None and await s.registered()
        keeper = s.driver.claims
        gate = Gate(keeper.checkpoint)
        refs = _claims(api, "c")
        # The first claim's write is held under the file lock; the others pile up behind.
        call = asyncio.create_task(s.driver.prepare(refs))
        await _until(_piled_up(gate, keeper.commits))
        assert not call.done()  # no Prepare is answered before its entry is durable
        gate.release.set()
        results = await call
        assert all(r.error == "" for r in results.values())
        # The held one, and (unless all were in it) one for all the rest.
        assert len(gate.sizes) == keeper.checkpoint.writes == keeper.commits.batches <= 2
        assert _on_disk(s.driver.config.checkpoint) == {r.uid for r in refs}
        # Bytes written grow with the claims, not with their square.
        assert sum(gate.sizes) < 2 * gate.sizes[-1]
        # Unprepared together, they cost at most two writes again.
        gate, batches = Gate(keeper.checkpoint), keeper.commits.batches
        call_un = asyncio.create_task(s.driver.unprepare(refs))
        await _until(_piled_up(gate, keeper.commits))
        gate.release.set()
        assert all(e == "" for e in (await call_un).values())
        assert len(gate.sizes) == keeper.commits.batches - batches <= 2
        assert _on_disk(s.driver.config.checkpoint) == set()


async def test_a_failed_batch_fails_each_of_its_claims_and_leaves_no_spec(
        dra_node: sim.SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api, pod_uid="pod-a") as s:
        assert s.driver is not None and await s.registered()
        keeper = s.driver.claims
        gate = Gate(keeper.checkpoint, fail_after_first=True)
        refs = _claims(api, "c")
        call = asyncio.create_task(s.driver.prepare(refs))
        await _until(_piled_up(gate, keeper.commits))
        first = keeper.commits.in_flight
        gate.release.set()
        results = await call
        ok = [uid for uid, r in results.items() if r.error == ""]
        failed = {uid: r.error for uid, r in results.items() if r.error}
        assert len(ok) == first and len(failed) == CLAIMS - first > 0
        assert all("cannot write the CDI spec or the checkpoint" in e and "No space left" in e
                   for e in failed.values())
        assert _specs(s) == sorted(f"{DRIVER}-claim-{u}.json" for u in ok)  # no orphan
        assert _on_disk(s.driver.config.checkpoint) == set(ok)
        assert set(s.driver.prepared) == set(ok)
        # The disk is back: the kubelet's retry prepares them.
        gate.fail_after_first = False
        again = await s.driver.prepare([r for r in refs if r.uid in failed])
        assert all(r.error == "" for r in again.values())
        assert _on_disk(s.driver.config.checkpoint) == {r.uid for r in refs}


async def test_two_instances_committing_at_once_keep_each_others_entries(
        dra_node: sim.SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api, pod_uid="pod-a") as s:
        assert s.driver is not None and s.watcher is not None and await s.registered()
        a = s.driver
        b = DraDriver(dataclasses.replace(s.config(), pod_uid="pod-b"))
        await b.start(s.watcher.inventory)
        try:
            gate = Gate(a.claims.checkpoint)
            refs_a, refs_b = _claims(api, "a"), _claims(api, "b")
            # A holds the file lock in its first write while B's batch waits for it: B must
            # read A's write under the lock, not what it saw before.
            call_a = asyncio.create_task(a.prepare(refs_a))
            await _until(gate.held.is_set)
            call_b = asyncio.create_task(b.prepare(refs_b))
            await _until(lambda: b.claims.commits.batches >= 1)
            gate.release.set()
            ra, rb = await call_a, await call_b
            assert all(r.error == "" for r in [*ra.values(), *rb.values()])
            every = {r.uid for r in refs_a + refs_b}
            assert _on_disk(a.config.checkpoint) == every
            # Each unprepares half of the other's claims, at once.
            gone = refs_b[:CLAIMS // 2] + refs_a[:CLAIMS // 2]
            ua, ub = await asyncio.gather(a.unprepare(gone[:CLAIMS // 2]),
                                          b.unprepare(gone[CLAIMS // 2:]))
            assert all(e == "" for e in [*ua.values(), *ub.values()])
            assert _on_disk(a.config.checkpoint) == every - {r.uid for r in gone}
        finally:
            gate.release.set()
            await b.stop()
