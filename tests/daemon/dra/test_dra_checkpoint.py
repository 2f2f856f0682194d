"""The checkpoint: nothing left behind by a failed Prepare, rebuilt from our CDI specs,
versioned with a checksum, today's (version 1) file migrated."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.contract.checkpoint import (
    CHECKPOINT_VERSION,
    CheckpointError,
    EncodedClaims,
    PreparedClaim,
    PreparedDevice,
    Share,
    decode,
    encode,
)
from rdma_hca.daemon.dra.checkpoint import LOCAL_LOCKS, Checkpoint, filesystem_of
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode


def _result(device: str, request: str = "hca") -> dict[str, str]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device}


def _specs(stage: DraStage) -> list[str]:
    return sorted(os.listdir(stage.cdi_dir)) if stage.cdi_dir.exists() else []


def _claim_gets(api: FakeApiServer) -> int:
    return sum(1 for r in api.requests if r.method == "GET" and "/resourceclaims/" in r.path)


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "256k") -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                           str(where)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): "
                    "the test needs CAP_SYS_ADMIN")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def _fill(directory: Path) -> None:
    """Write until the filesystem has no byte left."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    probe = os.open(directory / "probe", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError) as err:
            os.write(probe, b"x")
        assert err.value.errno == errno.ENOSPC
    finally:
        os.close(probe)


def test_todays_format_is_read_and_the_new_one_checks_itself() -> None:
    device = PreparedDevice(("hca",), NODE, "mlx5-0", "mlx5_0", (f"{DRIVER}/claim=u-mlx5-0",))
    claims = {"u": PreparedClaim("ns", "c", (device,))}
    v1 = json.dumps({"version": 1, "claims": {"u": {
        "namespace": "ns", "name": "c", "devices": [{
            "request_names": ["hca"], "pool": NODE, "device": "mlx5-0", "hca": "mlx5_0",
            "cdi_ids": [f"{DRIVER}/claim=u-mlx5-0"]}]}}})
    assert decode(v1, "cp") == (claims, 1)
    text = encode(claims)
    assert decode(text, "cp") == (claims, CHECKPOINT_VERSION)
    edited = text.replace('"name":"c"', '"name":"d"')
    assert edited != text
    with pytest.raises(CheckpointError, match="checksum"):
        decode(edited, "cp")
    with pytest.raises(CheckpointError, match="version"):
        decode(json.dumps({"version": 7, "claims": {}}), "cp")


def _claim(i: int, *, share: str | None = None) -> PreparedClaim:
    shares = (Share(share, 10**9),) if share else ()
    return PreparedClaim("ns", f"c{i}", (PreparedDevice(
        ("hca",), NODE, f"mlx5-{i % 8}", f"mlx5_{i % 8}", (f"{DRIVER}/claim=u{i}-mlx5",),
        shares),))


def test_a_writer_reencodes_only_the_claims_it_changed_and_writes_the_same_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rdma_hca.contract import checkpoint as contract

    encoded: list[str] = []
    real = contract._claim_json

    def claim_json(c: PreparedClaim) -> dict[str, object]:
        encoded.append(c.name)
        return real(c)

    monkeypatch.setattr(contract, "_claim_json", claim_json)
    memo = EncodedClaims()
    # Keys out of order, one that needs escaping and one that sorts between the others.
    claims = {f"u{i}": _claim(i) for i in (3, 1, 2)} | {"ü\\\"x": _claim(9), "u10": _claim(10)}
    steps = [
        lambda c: None,
        lambda c: c.__setitem__("u0", _claim(0, share="s")),  # a new claim
        lambda c: c.pop("u2"),  # one gone
        lambda c: c.__setitem__("u1", _claim(1, share="t")),  # one replaced, same UID
        lambda c: c.clear(),
        lambda c: c.__setitem__("u5", _claim(5)),
    ]
    for step in steps:
        step(claims)
        encoded.clear()
        with_memo = encode(claims, memo)
        names_encoded = sorted(encoded)
        assert with_memo == encode(claims)
        assert decode(with_memo, "cp") == (claims, CHECKPOINT_VERSION)
        encoded.clear()
        assert encode(claims, memo) == with_memo
        assert encoded == []  # nothing changed since: every entry reused
        if step is steps[3]:
            assert names_encoded == ["c1"]
    assert len(memo) == 1  # holds the last call's claims only


@pytest.mark.parametrize("fault", ["full", "read-only"])
async def test_a_prepare_that_cannot_write_its_checkpoint_leaves_nothing(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer, fault: str) -> None:
    with small_tmpfs(tmp_path / "state") as state:
        tune = lambda c: dataclasses.replace(  # noqa: E731
            c, checkpoint_path=str(state / "checkpoint.json"))
        async with DraStage(dra_node, tmp_path / "s", api=api, config=tune) as s:
            assert s.kubelet is not None and s.driver is not None and await s.registered()
            kept = api.add_claim("ns", "kept", [_result("mlx5-0")])
            assert (await s.kubelet.prepare(DRIVER, [("ns", kept, "kept")])).claims[kept] \
                .error == ""
            before = (state / "checkpoint.json").read_text()
            if fault == "full":
                _fill(state)
            else:
                subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
            uid = api.add_claim("ns", "c", [_result("mlx5-1")])
            resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])
            error = resp.claims[uid].error
            assert "cannot write the CDI spec or the checkpoint" in error
            assert ("No space left" if fault == "full" else "Read-only") in error
            assert _specs(s) == [f"{DRIVER}-claim-{kept}.json"]  # no orphan spec
            assert (state / "checkpoint.json").read_text() == before  # no entry
            assert uid not in s.driver.prepared
            if fault == "read-only":
                subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
            else:
                (state / "filler").unlink()
                (state / "probe").unlink(missing_ok=True)
            # Once the disk is back the kubelet's retry works.
            resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])
            assert resp.claims[uid].error == ""


@pytest.mark.parametrize("damage", ["corrupt", "lost"])
async def test_a_damaged_checkpoint_is_rebuilt_from_our_cdi_specs(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer,
        caplog: pytest.LogCaptureFixture, damage: str) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api) as s:
        assert s.kubelet is not None and s.driver is not None and await s.registered()
        uids = [api.add_claim("ns", f"c{i}", [_result(f"mlx5-{i}", f"r{i}")]) for i in range(2)]
        first = await s.kubelet.prepare(DRIVER, [("ns", u, f"c{i}") for i, u in enumerate(uids)])
        prepared = dict(s.driver.prepared)
        path = Path(s.driver.config.checkpoint)
        await s.stop_driver()
        if damage == "corrupt":
            path.write_text(path.read_text().replace('"c0"', '"cX"'))  # checksum no longer fits
        else:
            path.unlink()
        with caplog.at_level(logging.INFO, logger="rdma_hca.daemon.dra.recovery"):
            await s.start_driver()
        assert await s.registered(2)
        assert dict(s.driver.prepared) == prepared
        said = [r.getMessage() for r in caplog.records if "rebuilt" in r.getMessage()]
        assert len(said) == 1 and "rebuilt 2 prepared claim(s)" in said[0]
        if damage == "corrupt":
            assert "checksum" in said[0] and Path(str(path) + ".corrupt").exists()
        claims, version = decode(path.read_text(), str(path))
        assert version == CHECKPOINT_VERSION and claims == prepared
        await s.statuses_written()  # the start's status reads (one per claim) are done
        gets = _claim_gets(api)
        again = await s.kubelet.prepare(DRIVER, [("ns", u, f"c{i}") for i, u in enumerate(uids)])
        assert again == first and _claim_gets(api) == gets


async def test_a_version_1_checkpoint_is_migrated(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer,
        caplog: pytest.LogCaptureFixture) -> None:
    work = tmp_path / "s"
    work.mkdir()
    uid = "0a1b2c3d-0000-4000-8000-000000000001"
    cdi_id = f"{DRIVER}/claim={uid}-mlx5-3"
    (work / "checkpoint.json").write_text(json.dumps({"version": 1, "claims": {uid: {
        "namespace": "ns", "name": "old", "devices": [{
            "request_names": ["hca"], "pool": NODE, "device": "mlx5-3", "hca": "mlx5_3",
            "cdi_ids": [cdi_id]}]}}}, indent=1, sort_keys=True) + "\n")
    with caplog.at_level(logging.INFO, logger="rdma_hca.daemon.dra.recovery"):
        async with DraStage(dra_node, work, api=api) as s:
            assert s.kubelet is not None and await s.registered()
            # The status writer reads each checkpoint claim once at start (here: gone, 404).
            await s.statuses_written()
            gets = _claim_gets(api)
            resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "old")])
            assert resp.claims[uid].error == ""
            assert [list(d.cdi_device_ids) for d in resp.claims[uid].devices] == [[cdi_id]]
            assert _claim_gets(api) == gets  # from the migrated checkpoint
    assert any("migrated from version 1 to 2" in r.getMessage() for r in caplog.records)
    data = json.loads((work / "checkpoint.json").read_text())
    assert data["version"] == CHECKPOINT_VERSION and data["checksum"].startswith("sha256:")


def test_the_claim_locks_are_tried_on_the_loop_only_on_a_filesystem_that_keeps_them(
        tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "30 22 0:40 / /var/lib/kubelet rw,relatime shared:9 - nfs4 srv:/k rw\n"
        "31 30 0:41 / /var/lib/kubelet/plugins/local rw shared:10 - tmpfs tmpfs rw\n"
        "32 22 0:42 / /mnt/with\\040space rw shared:11 - xfs /dev/sdb rw\n")
    where = str(mountinfo)
    assert filesystem_of("/var/lib/kubelet/plugins/rdma-hca.io/claims.lock", where) == "nfs4"
    assert filesystem_of("/var/lib/kubelet/plugins/local/claims.lock", where) == "tmpfs"
    assert filesystem_of("/var/lib/kubeletx/claims.lock", where) == "ext4"
    assert filesystem_of("/mnt/with space/claims.lock", where) == "xfs"
    assert filesystem_of("/x", str(tmp_path / "missing")) is None
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.json"), str(tmp_path / "claims.lock"))
    assert not checkpoint.locks_now  # not open: opening blocks
    checkpoint.open()
    assert checkpoint.locks_now == (filesystem_of(str(tmp_path)) in LOCAL_LOCKS)
    checkpoint.close()
    assert not checkpoint.locks_now
