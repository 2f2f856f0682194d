"""``Workers.run``: the project's threads awaited as ``asyncio.to_thread`` would be."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rdma_hca.kit.workers import Workers


async def test_a_call_answers_on_a_named_thread_that_goes_back_to_the_pool() -> None:
    workers = Workers()
    names = await asyncio.gather(*(workers.run(lambda: threading.current_thread().name,
                                               f"job-{i}") for i in range(3)))
    assert sorted(names) == ["job-0", "job-1", "job-2"]
    # Back in the pool, a thread is named as idle again and takes the next call.
    assert await workers.run(lambda: threading.current_thread().name, "again") == "again"


async def test_the_calls_error_is_the_callers() -> None:
    def fail() -> None:
        raise ValueError("the call failed")

    with pytest.raises(ValueError, match="the call failed"):
        await Workers().run(fail, "failing")


async def test_a_cancelled_caller_stops_waiting_and_the_thread_comes_back() -> None:
    workers = Workers()
    release = threading.Event()
    caller = asyncio.create_task(workers.run(release.wait, "held"))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set()
    # The thread that was held answers the next call once it is back in the pool.
    assert await workers.run(lambda: "free", "next") == "free"


async def test_threads_beyond_the_idle_ones_kept_end_once_their_calls_are_done() -> None:
    workers = Workers(keep_idle=1)
    release = threading.Event()
    held = [asyncio.ensure_future(workers.run(release.wait, f"held-{i}")) for i in range(3)]
    threads: list[threading.Thread] = []
    for _ in range(500):  # until the three have taken their calls
        threads = [t for t in threading.enumerate() if t.name.startswith("held-")]
        if len(threads) == 3:
            break
        await asyncio.sleep(0.01)
    assert len(threads) == 3
    release.set()
    await asyncio.gather(*held)
    for _ in range(500):  # until the two not kept have ended
        if sum(t.is_alive() for t in threads) == 1:
            break
        await asyncio.sleep(0.01)
    assert sum(t.is_alive() for t in threads) == 1
    # The one kept takes the next call.
    assert await workers.run(lambda: threading.current_thread() in threads, "next")
