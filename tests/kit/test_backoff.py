"""The one backoff: waits that double up to a cap, jittered, and start over on reset."""

from __future__ import annotations

import random

import pytest

from rdma_hca.kit.backoff import Backoff


def test_waits_double_to_the_cap_and_start_over_after_a_reset() -> None:
    b = Backoff(0.05, 0.2, rng=random.Random(1))
    caps = [0.05, 0.1, 0.2, 0.2]
    assert all(cap / 2 <= b.next() <= cap for cap in caps)
    b.reset()
    assert b.attempt == 0 and 0.025 <= b.next() <= 0.05


@pytest.mark.parametrize(("first", "most"), [(0, 1), (-1, 1), (2, 1)])
def test_a_backoff_that_cannot_wait_is_refused_with_its_numbers(first: float,
                                                                most: float) -> None:
    with pytest.raises(ValueError, match=f"0 < first <= most, not {first}/{most}"):
        Backoff(first, most)
