"""The one inotify directory watch both front ends follow the kubelet's directories with."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rdma_hca.kit.dirwatch import DirEvent, watch_dir


async def test_the_watch_sees_entries_come_and_go(tmp_path: Path) -> None:
    seen: list[DirEvent] = []
    started = asyncio.Event()
    got_removal = asyncio.Event()

    async def follow() -> None:
        async for event in watch_dir(str(tmp_path)):
            seen.append(event)
            if event.watching:
                started.set()
            if event.removed:
                got_removal.set()

    task = asyncio.create_task(follow())
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

    async def follow() -> None:
        async for event in watch_dir(str(where), missing_poll=0.01):
            events.append(event)
            if event.watching:
                watching.set()
            if event.gone:
                gone.set()

    task = asyncio.create_task(follow())
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

    async def follow() -> None:
        async for event in watch_dir(str(tmp_path), creations=False, writes=False):
            seen.append(event)
            if event.watching:
                started.set()
            if event.name == "a" and event.removed:
                got_removal.set()

    task = asyncio.create_task(follow())
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
