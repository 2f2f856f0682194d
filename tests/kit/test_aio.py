"""The asyncio helpers the daemon's tasks share."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rdma_hca.kit.aio import cancel_all, settle, unless, wait_event


async def _sleep_then(value: int, seconds: float) -> int:
    await asyncio.sleep(seconds)
    return value


async def _fail() -> int:
    raise ValueError("work failed")


async def test_work_that_finishes_first_is_returned_and_stop_is_cancelled() -> None:
    stop = asyncio.Event()
    waiter = asyncio.ensure_future(stop.wait())
    done = await unless(_sleep_then(7, 0), waiter)
    assert done is not None and done.result() == 7
    await asyncio.sleep(0)
    assert waiter.cancelled()


async def test_stop_first_gives_none_and_cancels_the_work() -> None:
    stop = asyncio.Event()
    work = asyncio.ensure_future(_sleep_then(1, 60))
    asyncio.get_running_loop().call_soon(stop.set)
    assert await unless(work, stop.wait()) is None
    await asyncio.sleep(0)
    assert work.cancelled()


async def test_an_error_of_the_work_is_the_callers_to_take() -> None:
    done = await unless(_fail(), asyncio.Event().wait())
    assert done is not None
    with pytest.raises(ValueError, match="work failed"):
        done.result()


async def test_cancelling_the_caller_cancels_both() -> None:
    work = asyncio.ensure_future(_sleep_then(1, 60))
    stop = asyncio.ensure_future(asyncio.Event().wait())
    caller = asyncio.ensure_future(unless(work, stop))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.sleep(0)
    assert work.cancelled() and stop.cancelled()


async def test_wait_event_answers_set_or_timeout() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5.0) is True


async def test_wait_event_never_loses_a_cancel_that_meets_the_event() -> None:
    # The event is set and the waiter cancelled in the same turn of the loop, many times:
    # the cancel must always win, or a loop waiting this way outlives its stop.
    for _ in range(200):
        event = asyncio.Event()
        waiter = asyncio.ensure_future(wait_event(event, 5.0))
        await asyncio.sleep(0)
        event.set()
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        assert waiter.cancelled()


async def _stubborn(release: asyncio.Event) -> None:
    """Swallows every cancel until released, as a stuck shutdown does."""
    while not release.is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await release.wait()


async def test_a_bounded_stop_names_and_leaves_a_task_that_will_not_end(
        caplog: pytest.LogCaptureFixture) -> None:
    release = asyncio.Event()
    stuck = asyncio.create_task(_stubborn(release), name="stubborn")
    quick = asyncio.create_task(asyncio.sleep(60), name="quick")
    await asyncio.sleep(0)  # both wait now: the cancel lands inside the stubborn loop
    left = await cancel_all([stuck, quick], within=0.05, what="the test's tasks")
    assert len(left) == 1 and left[0].startswith("stubborn at ")
    assert quick.cancelled() and not stuck.done()
    assert "stopping the test's tasks took over 0.05 s; left running: stubborn" in caplog.text
    release.set()
    await stuck


async def test_a_bounded_stop_logs_an_error_and_goes_on() -> None:
    assert await settle([_fail()], within=5, what="failing work") == []
    assert await settle([], within=5, what="nothing") == []


async def test_an_unbounded_cancel_raises_a_tasks_own_error() -> None:
    failed = asyncio.create_task(_fail())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="work failed"):
        await cancel_all([failed])
    assert await cancel_all([asyncio.create_task(asyncio.sleep(60))]) == []
