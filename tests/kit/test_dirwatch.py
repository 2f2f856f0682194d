"""The one inotify directory watch both front ends follow the kubelet's directories with."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rdma_hca.kit.dirwatch import DirEvent, follow_dir


async def test_the_watch_sees_entries_come_and_go(tmp_path: Path) -> None:
    seen: list[DirEvent] = []
    started = asyncio.Event()
    got_removal = asyncio.Event()

    def on_event(event: DirEvent) -> None:
        seen.append(event)
        if event.watching:
            started.set()
        if event.removed:
            got_removal.set()

    task = asyncio.create_task(follow_dir(str(tmp_path), on_event))
    try:
        await asyncio.wait_for(started.wait(), 10)
        (tmp_path / "a").write_text("x")
        (tmp_path / "a").unlink()
        await asyncio.wait_for(got_removal.wait(), 10)
    finally:
        task.cancel()
    names = [(e.name, e.created, e.removed) for e in seen if e.name == "a"]
    assert names[0] == ("a", True, False) and names[-1] == ("a", False, True)


async def test_the_watch_waits_for_its_directory_and_says_when_it_is_gone(
        tmp_path: Path) -> None:
    where = tmp_path / "later"
    events: list[DirEvent] = []
    gone = asyncio.Event()
    watching = asyncio.Event()

    def on_event(event: DirEvent) -> None:
        events.append(event)
        if event.watching:
            watching.set()
        if event.gone:
            gone.set()

    task = asyncio.create_task(follow_dir(str(where), on_event, missing_poll=0.01))
    try:
        where.mkdir()
        await asyncio.wait_for(watching.wait(), 10)
        where.rmdir()
        await asyncio.wait_for(gone.wait(), 10)
    finally:
        task.cancel()
    assert events[0].watching and any(e.gone for e in events)


async def test_a_watch_may_leave_out_creations_and_writes(tmp_path: Path) -> None:
    seen: list[DirEvent] = []
    started = asyncio.Event()
    got_removal = asyncio.Event()

    def on_event(event: DirEvent) -> None:
        seen.append(event)
        if event.watching:
            started.set()
        if event.name == "a" and event.removed:
            got_removal.set()

    task = asyncio.create_task(follow_dir(str(tmp_path), on_event, creations=False,
                                          writes=False))
    try:
        await asyncio.wait_for(started.wait(), 10)
        # A file written as every writer of the checkpoint does: a temp file created,
        # written and closed, then renamed over the name.
        (tmp_path / ".a.tmp").write_text("x")
        (tmp_path / ".a.tmp").rename(tmp_path / "a")
        (tmp_path / "a").unlink()
        await asyncio.wait_for(got_removal.wait(), 10)
    finally:
        task.cancel()
    named = [(e.name, e.created, e.removed) for e in seen if e.name is not None]
    # The temp file's creation and closing woke nobody: only the rename and the removal.
    assert named == [(".a.tmp", False, True), ("a", True, False), ("a", False, True)]


def _inotify_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            continue
    return count


async def _until(check: object, timeout: float = 10) -> None:
    async def wait() -> None:
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.005)
    await asyncio.wait_for(wait(), timeout)


async def test_followers_of_one_directory_share_one_watch_each_hearing_what_it_asked(
        tmp_path: Path) -> None:
    everything: list[DirEvent] = []
    renames: list[DirEvent] = []
    before = _inotify_fds()
    both = asyncio.gather(follow_dir(str(tmp_path), everything.append, writes=False),
                          follow_dir(str(tmp_path), renames.append, creations=False,
                                     writes=False))
    try:
        await _until(lambda: everything and renames)
        assert _inotify_fds() == before + 1  # one descriptor for both
        (tmp_path / ".a.tmp").write_text("x")
        (tmp_path / ".a.tmp").rename(tmp_path / "a")
        (tmp_path / "a").unlink()
        await _until(lambda: any(e.removed and e.name == "a" for e in everything)
                     and any(e.removed and e.name == "a" for e in renames))
    finally:
        both.cancel()
        with pytest.raises(asyncio.CancelledError):
            await both
    assert everything[0].watching and renames[0].watching
    named = [(e.name, e.created, e.removed) for e in renames if e.name is not None]
    assert named == [(".a.tmp", False, True), ("a", True, False), ("a", False, True)]
    named = [(e.name, e.created, e.removed) for e in everything if e.name is not None]
    assert named == [(".a.tmp", True, False), (".a.tmp", False, True), ("a", True, False),
                     ("a", False, True)]
    assert _inotify_fds() == before  # closed with its last follower


async def test_a_follower_that_leaves_or_fails_does_not_end_the_others(tmp_path: Path) -> None:
    kept: list[DirEvent] = []
    left: list[DirEvent] = []

    def failing(event: DirEvent) -> None:
        if event.name == "boom":
            raise ValueError("boom")

    stays = asyncio.create_task(follow_dir(str(tmp_path), kept.append))
    leaves = asyncio.create_task(follow_dir(str(tmp_path), left.append))
    fails = asyncio.create_task(follow_dir(str(tmp_path), failing))
    try:
        await _until(lambda: kept and left)
        await asyncio.sleep(0.01)
        leaves.cancel()
        (tmp_path / "boom").write_text("x")
        with pytest.raises(ValueError, match="boom"):
            await asyncio.wait_for(fails, 10)
        (tmp_path / "after").write_text("x")
        await _until(lambda: any(e.name == "after" for e in kept))
    finally:
        stays.cancel()
        leaves.cancel()
    assert not any(e.name == "after" for e in left)


async def test_a_follower_hears_its_directory_go_and_follows_it_when_it_is_back(
        tmp_path: Path) -> None:
    where = tmp_path / "later"
    events: list[DirEvent] = []
    task = asyncio.create_task(follow_dir(str(where), events.append, missing_poll=0.01))
    try:
        where.mkdir()
        await _until(lambda: any(e.watching for e in events))
        where.rmdir()
        await _until(lambda: any(e.gone for e in events))
        where.mkdir()
        await _until(lambda: sum(e.watching for e in events) == 2)
        (where / "b").write_text("x")
        await _until(lambda: any(e.name == "b" for e in events))
    finally:
        task.cancel()
