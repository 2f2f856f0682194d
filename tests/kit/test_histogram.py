"""The plain-count histogram: cumulative buckets as Prometheus reads them."""

from __future__ import annotations

import pytest

from rdma_hca.kit.histogram import Histogram, HistogramCounts


def test_counts_are_cumulative_and_a_value_on_a_bound_is_in_it() -> None:
    h = Histogram((0.1, 1.0))
    assert h.counts() == HistogramCounts((0.1, 1.0), (0, 0), 0, 0.0)
    for v in (0.05, 0.1, 0.5, 7.0):
        h.observe(v)
    c = h.counts()
    assert c.cumulative == (2, 3)
    assert c.count == 4  # the one above every bound is only in +Inf
    assert c.total == pytest.approx(7.65)


def test_bounds_must_increase() -> None:
    with pytest.raises(ValueError, match="not strictly increasing"):
        Histogram((1.0, 0.5))
