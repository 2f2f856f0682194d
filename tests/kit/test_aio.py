"""The asyncio helpers the daemon's tasks share."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rdma_hca.kit.aio import unless, wait_event


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
