"""A cancelled caller of ``OffLoop`` ends, whenever the cancel lands.

The health loop reads the machine through ``OffLoop``; ``Daemon.stop`` cancels it and
waits. A cancel that arrived just as a thread's answer was being handed over was lost
(``asyncio.wait_for`` on Python 3.11 returns the result instead), so the loop went on to
its next poll and the stop waited for a task that never ended.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from rdma_hca.kit.offloop import OffLoop, Stalled


async def test_a_cancel_that_lands_as_the_answer_arrives_is_never_lost() -> None:
    off = OffLoop(5.0)
    loop = asyncio.get_running_loop()
    landed = 0
    # The answer reaches the awaiting task over a few loop passes; a cancel is tried at
    # each of them (and a little after), one call per pass count. A cancel the task took
    # (it had not ended yet) must end it.
    for passes in range(8):
        took: list[bool] = []
        caller: list[asyncio.Task[str]] = []

        def cancel_after(n: int, took: list[bool] = took,
                         caller: list[asyncio.Task[str]] = caller) -> None:
            if n:
                loop.call_soon(cancel_after, n - 1)
            else:
                took.append(caller[0].cancel())

        def answer(n: int = passes) -> str:
            # Queued just before the thread hands its answer to the loop.
            loop.call_soon_threadsafe(cancel_after, n)
            return "answer"

        task = asyncio.create_task(off.run("the answer", answer))
        caller.append(task)
        await asyncio.wait({task}, timeout=5.0)
        assert task.done(), "the call did not end"
        while not took:
            await asyncio.sleep(0)
        if took[0]:
            landed += 1
            assert task.cancelled(), (
                f"a cancel {passes} loop passes after the answer was lost: the call "
                f"returned {task.result()!r}")
    assert landed >= 2, "no cancel landed while the answer was on its way"


async def test_a_loop_of_calls_stops_when_cancelled() -> None:
    # The shape of the health loop: call after call until cancelled, each answered at once.
    off = OffLoop(5.0)
    calls = 0

    def answer() -> int:
        nonlocal calls
        calls += 1
        return calls

    async def poll() -> None:
        while True:
            await off.run("the answer", answer)

    for _ in range(50):
        task = asyncio.create_task(poll())
        while calls < 3:
            await asyncio.sleep(0)
        calls = 0
        task.cancel()
        await asyncio.wait({task}, timeout=5.0)
        assert task.cancelled(), "the loop went on after its cancel"


async def test_a_stalled_call_still_raises_and_an_answer_still_comes_back() -> None:
    off = OffLoop(0.1)
    release = threading.Event()
    with pytest.raises(Stalled):
        await off.run("stuck", lambda: release.wait(10.0))
    release.set()
    assert await off.run("fine", lambda: 7) == 7
    with pytest.raises(ValueError, match="bad"):
        await off.run("fails", lambda: int("bad"))
