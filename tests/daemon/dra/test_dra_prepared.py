"""The prepared claims' one owner: what it records is durable first, the shared file is
the record beside another instance, and a version another instance wrote makes it stop
trusting what it verified."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.contract.checkpoint import PreparedClaim, PreparedDevice
from rdma_hca.daemon.dra.checkpoint import Checkpoint
from rdma_hca.daemon.dra.prepared import PreparedClaims
from rdma_hca.kit.offloop import OffLoop


def _claim(uid: str) -> PreparedClaim:
    return PreparedClaim("ns", uid, (PreparedDevice(("hca",), NODE, "mlx5-0", "mlx5_0",
                                                    (f"{DRIVER}/claim-{uid}=mlx5-0",)),))


@pytest.fixture
def files(tmp_path: Path) -> Iterator[tuple[Checkpoint, Checkpoint]]:
    """This instance's checkpoint and another instance's, on one file."""
    path, lock = str(tmp_path / "checkpoint.json"), str(tmp_path / "claims.lock")
    ours, theirs = Checkpoint(path, lock), Checkpoint(path, lock)
    ours.open()
    theirs.open()
    yield ours, theirs
    ours.close()
    theirs.close()


async def test_a_claim_added_is_on_disk_and_verified_and_removed_from_both(
        files: tuple[Checkpoint, Checkpoint]) -> None:
    ours, _ = files
    prepared = PreparedClaims(ours, OffLoop(5.0), {"old": _claim("old")}, shared=False)
    assert prepared.holds("old") and not prepared.holds("new")
    assert prepared.verified("old") is None  # recovered: its spec not seen yet
    prepared.verify("old")
    assert prepared.verified("old") == _claim("old")
    await prepared.add("new", _claim("new"))
    assert set(ours.read()[0]) == {"new"} and prepared.verified("new") == _claim("new")
    assert dict(prepared) == {"old": _claim("old"), "new": _claim("new")}
    assert await prepared.remove("new")
    assert "new" not in prepared and ours.read()[0] == {}
    assert not await prepared.remove("never")  # not on record: no write for it
    assert prepared.commits.batches == 2


async def test_shared_the_file_is_the_record_and_another_writer_ends_what_was_verified(
        files: tuple[Checkpoint, Checkpoint]) -> None:
    ours, theirs = files
    prepared = PreparedClaims(ours, OffLoop(5.0), {}, shared=True)
    assert prepared.holds("anything")  # any claim may be on the shared record
    await prepared.add("mine", _claim("mine"))
    theirs.update(lambda c: c.__setitem__("theirs", _claim("theirs")), {})
    assert await prepared.look_up("theirs") == _claim("theirs")  # read again, kept
    assert "theirs" in prepared
    theirs.update(lambda c: c.pop("theirs"), {})
    assert await prepared.look_up("theirs") is None and "theirs" not in prepared
    # The follower hands on a version the other instance wrote: nothing verified stays.
    prepared.followed({"mine": _claim("mine")}, True)
    assert prepared.foreign_writes == 1 and prepared.verified("mine") is None
    assert dict(prepared) == {"mine": _claim("mine")}
    prepared.followed(None, True)  # unreadable: the claims stay, trusted no more
    assert dict(prepared) == {"mine": _claim("mine")} and prepared.foreign_writes == 2
    # Unprepared by us although the other instance's version left it out of memory.
    prepared.followed({}, False)
    theirs.update(lambda c: c.__setitem__("gone", _claim("gone")), {})
    assert await prepared.remove("gone")
    assert "gone" not in ours.read()[0]


async def test_shared_a_claim_the_other_instance_recorded_first_is_answered_from_its_entry(
        files: tuple[Checkpoint, Checkpoint], tmp_path: Path) -> None:
    ours, theirs = files
    prepared = PreparedClaims(ours, OffLoop(5.0), {}, shared=True)
    await prepared.add("mine", _claim("mine"))
    # The other instance prepared "c" before this one took the claim's lock, and this one
    # has not followed the file since: its entry is looked at under the file lock.
    their_entry = PreparedClaim("ns", "c", _claim("theirs").devices)
    theirs.update(lambda c: c.__setitem__("c", their_entry), {})
    spec = tmp_path / "spec.json"
    spec.write_text("theirs")
    written, undone = [], []

    def write() -> None:
        written.append(1)
        spec.write_text("ours")

    writes = ours.writes
    found = await prepared.add("c", _claim("c"), (write, lambda: undone.append(1)),
                               unless_recorded=True)
    assert found == their_entry
    assert written == [] and undone == [] and spec.read_text() == "theirs"
    assert ours.writes == writes and ours.read()[0]["c"] == their_entry
    assert prepared["c"] == their_entry and prepared.verified("c") is None  # spec not seen
    # Not on the record: written as usual, the files first.
    found = await prepared.add("d", _claim("d"), (write, lambda: undone.append(1)),
                               unless_recorded=True)
    assert found is None and written == [1] and spec.read_text() == "ours"
    assert set(ours.read()[0]) == {"mine", "c", "d"} and prepared.verified("d") == _claim("d")
