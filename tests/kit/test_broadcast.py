"""The one broadcast value: every follower sees the newest value, none steals another's."""

from __future__ import annotations

import asyncio

from rdma_hca.kit.broadcast import Broadcast


async def test_every_follower_sees_every_publish_it_waits_for() -> None:
    b: Broadcast[int] = Broadcast(0)
    seen_a: list[int] = []
    seen_b: list[int] = []
    got_one = [asyncio.Event(), asyncio.Event()]

    async def follow(out: list[int], got: asyncio.Event) -> None:
        async for v in b.follow():
            out.append(v)
            got.set()
            if v == 2:
                return

    tasks = [asyncio.create_task(follow(seen_a, got_one[0])),
             asyncio.create_task(follow(seen_b, got_one[1]))]
    await asyncio.sleep(0)
    assert b.publish(1)
    # Both take the first value; a queue shared by the two would give it to one only.
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in got_one)), 5)
    assert b.publish(2)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert seen_a == seen_b == [1, 2]


async def test_a_busy_follower_gets_the_newest_value_not_a_queue() -> None:
    b: Broadcast[int] = Broadcast(0)
    for v in (1, 2, 3):
        b.publish(v)
    it = b.follow()
    assert await asyncio.wait_for(anext(it), 5) == 3
    assert b.generation == 3


def test_an_equal_value_is_no_news_and_same_decides_it() -> None:
    b: Broadcast[list[int]] = Broadcast([1])
    assert not b.publish([1])
    assert b.generation == 0
    by_identity: Broadcast[list[int]] = Broadcast([1], same=lambda x, y: x is y)
    assert by_identity.publish([1])
    assert by_identity.generation == 1


async def test_a_waiter_that_times_out_leaves_the_publisher_free() -> None:
    b: Broadcast[int] = Broadcast(0)
    assert await b.wait_newer(0, timeout=0.01) == 0
    waiter = asyncio.create_task(b.wait_newer(0))
    await asyncio.sleep(0)
    waiter.cancel()
    assert b.publish(5)  # returns at once: nothing holds a lock
    assert await b.wait_newer(0) == 1
