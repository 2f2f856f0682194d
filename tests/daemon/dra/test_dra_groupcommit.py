"""Group commit of the checkpoint: the claims ready at one moment cost one write, two
instances on one file never lose each other's entries, and a failed write fails every
claim it carried with nothing left behind."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.contract.checkpoint import Claims, PreparedClaim, PreparedDevice
from rdma_hca.daemon.dra.checkpoint import Checkpoint, CheckpointBusy, write_file
from rdma_hca.daemon.dra.claims import ClaimRef
from rdma_hca.daemon.dra.driver import DraDriver
from rdma_hca.daemon.dra.groupcommit import GroupCommit
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kit.offloop import OffLoop

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
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api, pod_uid="pod-a") as s:
        assert s.driver is not None and await s.registered()
        keeper = s.driver.prepared
        gate = Gate(keeper.checkpoint)
        refs = _claims(api, "c")
        # The first claim's write is held under the file lock; the others pile up behind.
        call = asyncio.create_task(s.driver.helper.prepare(refs))
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
        call_un = asyncio.create_task(s.driver.helper.unprepare(refs))
        await _until(_piled_up(gate, keeper.commits))
        gate.release.set()
        assert all(e == "" for e in (await call_un).values())
        assert len(gate.sizes) == keeper.commits.batches - batches <= 2
        assert _on_disk(s.driver.config.checkpoint) == set()


async def test_a_failed_batch_fails_each_of_its_claims_and_leaves_no_spec(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api, pod_uid="pod-a") as s:
        assert s.driver is not None and await s.registered()
        driver = s.driver
        # The first publish is done: the batches are formed by the claims alone.
        assert await s.until(lambda: driver.stats().published and driver.stats().idle)
        keeper = s.driver.prepared
        gate = Gate(keeper.checkpoint, fail_after_first=True)
        refs = _claims(api, "c")
        # One claim's write first, then the rest behind it: in one call, a slow machine
        # had every claim ready before the first batch began, and no second batch failed.
        call = asyncio.create_task(s.driver.helper.prepare(refs[:1]))
        await _until(gate.held.is_set)
        rest = asyncio.create_task(s.driver.helper.prepare(refs[1:]))
        await _until(_piled_up(gate, keeper.commits))
        first = keeper.commits.in_flight
        gate.release.set()
        results = {**await call, **await rest}
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
        again = await s.driver.helper.prepare([r for r in refs if r.uid in failed])
        assert all(r.error == "" for r in again.values())
        assert _on_disk(s.driver.config.checkpoint) == {r.uid for r in refs}


async def test_two_instances_committing_at_once_keep_each_others_entries(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api, pod_uid="pod-a") as s:
        assert s.driver is not None and s.watcher is not None and await s.registered()
        a = s.driver
        b = DraDriver(dataclasses.replace(s.config(), pod_uid="pod-b"))
        await b.start(s.watcher.inventory)
        try:
            gate = Gate(a.prepared.checkpoint)
            refs_a, refs_b = _claims(api, "a"), _claims(api, "b")
            # A holds the file lock in its first write while B's batch waits for it: B must
            # read A's write under the lock, not what it saw before.
            call_a = asyncio.create_task(a.helper.prepare(refs_a))
            await _until(gate.held.is_set)
            call_b = asyncio.create_task(b.helper.prepare(refs_b))
            await _until(lambda: b.prepared.commits.batches >= 1)
            gate.release.set()
            ra, rb = await call_a, await call_b
            assert all(r.error == "" for r in [*ra.values(), *rb.values()])
            every = {r.uid for r in refs_a + refs_b}
            assert _on_disk(a.config.checkpoint) == every
            # Each unprepares half of the other's claims, at once.
            gone = refs_b[:CLAIMS // 2] + refs_a[:CLAIMS // 2]
            ua, ub = await asyncio.gather(a.helper.unprepare(gone[:CLAIMS // 2]),
                                          b.helper.unprepare(gone[CLAIMS // 2:]))
            assert all(e == "" for e in [*ua.values(), *ub.values()])
            assert _on_disk(a.config.checkpoint) == every - {r.uid for r in gone}
        finally:
            gate.release.set()
            await b.stop()


# --- written only for a live caller ------------------------------------------------------


def _hold_file_lock(lock_path: str) -> int:
    """Another instance holding the checkpoint's lock (byte 0 of the lock file)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET,
                                                    0, 1, 0))
    return fd


def _entry(uid: str) -> Callable[[Claims], None]:
    claim = PreparedClaim("ns", uid, (PreparedDevice(("hca",), NODE, "mlx5-0", "mlx5_0",
                                                     (f"{DRIVER}/claim-{uid}=mlx5-0",)),))
    return lambda claims: claims.__setitem__(uid, claim)


async def test_a_change_whose_caller_gave_up_before_its_batch_is_not_written(
        tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"), str(tmp_path / "claims.lock"))
    commits = GroupCommit(checkpoint, OffLoop(30.0).run, dict)
    gate = Gate(checkpoint)
    try:
        first = asyncio.create_task(commits.apply(_entry("first")))
        await _until(gate.held.is_set)
        late = asyncio.create_task(commits.apply(_entry("late")))
        await _until(lambda: commits.waiting == 1)
        late.cancel()  # the kubelet cancelled that Prepare
        with contextlib.suppress(asyncio.CancelledError):
            await late
        gate.release.set()
        await first
        await _until(lambda: commits.skipped == 1)
        assert _on_disk(checkpoint.path) == {"first"}
        assert checkpoint.writes == commits.batches == 1
    finally:
        gate.release.set()
        checkpoint.close()


async def test_a_batch_waiting_for_the_lock_is_not_written_once_its_caller_gave_up(
        tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"), str(tmp_path / "claims.lock"))
    commits = GroupCommit(checkpoint, OffLoop(30.0).run, dict)
    other = _hold_file_lock(checkpoint.lock_path)
    spec = tmp_path / "spec.json"
    try:
        call = asyncio.create_task(commits.apply(_entry("gone"), _files(spec)))
        await _until(lambda: checkpoint.lock_waits > 0)  # in flight, waiting for the lock
        # Its files were never written (they are written under the lock), nor are they
        # once the lock is free.
        assert not spec.exists()
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        os.close(other)  # the other instance lets go: the batch takes the lock
        other = -1
        await _until(lambda: commits.in_flight == 0 and not spec.exists())
        assert checkpoint.writes == 0 and not os.path.exists(checkpoint.path)
    finally:
        if other >= 0:
            os.close(other)
        checkpoint.close()


async def test_a_lock_held_elsewhere_fails_the_update_within_its_deadline(
        tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"), str(tmp_path / "claims.lock"),
                            deadline=0.2)
    other = _hold_file_lock(checkpoint.lock_path)
    try:
        # On a thread as the driver calls it: the thread itself returns, with the error.
        outcome: list[BaseException] = []

        def update() -> None:
            try:
                checkpoint.update(_entry("x"), {})
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=update, daemon=True)
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
        (error,) = outcome
        assert isinstance(error, CheckpointBusy) and "held the lock" in str(error)
        # Through the group commit: its caller hears the same, and no thread is left
        # stuck behind it (the deadline of the calls off the loop is longer).
        io = OffLoop(30.0)
        commits = GroupCommit(checkpoint, io.run, dict)
        with pytest.raises(CheckpointBusy):
            await commits.apply(_entry("y"))
        assert io.stuck == frozenset() and io.stalls_total == 0
        assert checkpoint.writes == 0 and not os.path.exists(checkpoint.path)
    finally:
        os.close(other)
        checkpoint.close()


def test_the_directory_is_fsynced_after_the_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[tuple[bool, bool]] = []  # (a directory, the new file in place then)
    real = os.fsync
    path = tmp_path / "checkpoint.json"

    def fsync(fd: int) -> None:
        synced.append((stat.S_ISDIR(os.fstat(fd).st_mode), path.exists()))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_file(str(path), "{}")
    assert synced[0] == (False, False) and synced[-1] == (True, True)


def _files(path: Path, *, fails: bool = False) -> tuple[Callable[[], None], Callable[[], None]]:
    """A change's own file: written before the checkpoint, removed when undone."""

    def write() -> None:
        if fails:
            raise OSError(errno.ENOSPC, "no space left on the CDI directory")
        path.write_text("spec")

    return write, lambda: path.unlink(missing_ok=True)


async def test_a_change_whose_own_files_fail_fails_alone_in_its_batch(tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"), str(tmp_path / "claims.lock"))
    commits = GroupCommit(checkpoint, OffLoop(30.0).run, dict)
    try:
        good, bad = tmp_path / "good.json", tmp_path / "bad.json"
        results = await asyncio.gather(
            commits.apply(_entry("good"), _files(good)),
            commits.apply(_entry("bad"), _files(bad, fails=True)), return_exceptions=True)
        assert results[0] is None and isinstance(results[1], OSError)
        assert commits.batches == 1 and commits.largest == 2  # one batch, one thread
        assert _on_disk(checkpoint.path) == {"good"}
        assert good.exists() and not bad.exists()
    finally:
        checkpoint.close()


async def test_files_whose_entry_is_not_written_are_undone(tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"), str(tmp_path / "claims.lock"),
                            deadline=0.2)
    other = _hold_file_lock(checkpoint.lock_path)
    spec = tmp_path / "spec.json"
    try:
        # The checkpoint cannot be written: the files written first are removed again.
        commits = GroupCommit(checkpoint, OffLoop(30.0).run, dict)
        with pytest.raises(CheckpointBusy):
            await commits.apply(_entry("x"), _files(spec))
        assert not spec.exists() and checkpoint.writes == 0
    finally:
        os.close(other)
        checkpoint.close()


async def test_staged_files_go_in_place_before_the_checkpoint_and_a_failed_one_fails_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rdma_hca.daemon.dra.files import StagedFile

    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"), str(tmp_path / "claims.lock"))
    commits = GroupCommit(checkpoint, OffLoop(30.0).run, dict)
    renamed: list[str] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        renamed.append(os.path.basename(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    (tmp_path / "blocked").write_text("a file where the spec directory belongs\n")
    good = StagedFile(str(tmp_path / "cdi" / "good.json"), "good\n")
    bad = StagedFile(str(tmp_path / "blocked" / "bad.json"), "bad\n")
    try:
        results = await asyncio.gather(
            commits.apply(_entry("good"), (good.place, lambda: None),
                          staging=(good.flush, good.discard)),
            commits.apply(_entry("bad"), (bad.place, lambda: None),
                          staging=(bad.flush, bad.discard)), return_exceptions=True)
        assert results[0] is None and isinstance(results[1], OSError)
        assert commits.batches == 1
        assert _on_disk(checkpoint.path) == {"good"}
        assert (tmp_path / "cdi" / "good.json").read_text() == "good\n"
        assert renamed == ["good.json", "checkpoint.json"]  # the spec first
        leftovers = [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
        assert leftovers == []
        # The checkpoint cannot be written: the staged file is not left behind either.
        (tmp_path / "checkpoint.json").unlink()
        (tmp_path / "checkpoint.json").mkdir()
        late = StagedFile(str(tmp_path / "cdi" / "late.json"), "late\n")
        with pytest.raises(OSError):
            await commits.apply(_entry("late"), (late.place, Path(late.path).unlink),
                                staging=(late.flush, late.discard))
        assert not (tmp_path / "cdi" / "late.json").exists()
        assert [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")] == []
    finally:
        checkpoint.close()
