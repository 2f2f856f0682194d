"""Saying a problem once per reason."""

from __future__ import annotations

from rdma_hca.kit.sayonce import Latch, Once


def test_latch_speaks_on_a_new_reason_and_once_when_it_is_over() -> None:
    latch = Latch()
    assert not latch.clear()
    assert latch.set("disk full")
    assert not latch.set("disk full")
    assert latch.set("read-only")
    assert latch.reason == "read-only"
    assert latch.clear()
    assert not latch.clear()
    assert latch.set("disk full")


def test_once_says_each_message_the_first_time_only() -> None:
    once = Once()
    assert once.first("a")
    assert not once.first("a")
    assert once.first("b")


def test_once_with_a_limit_starts_over_when_full() -> None:
    once = Once(limit=2)
    assert once.first("a") and once.first("b")
    assert not once.first("a")
    assert once.first("c")  # the third distinct message: the memory starts over
    assert once.first("a")
    assert not once.first("c")
