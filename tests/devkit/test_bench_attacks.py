"""The attack benchmarks run end to end on small counts (figures are checked, not timed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdma_hca.devkit import bench_attacks


@pytest.mark.slow
async def test_attack_figures(tmp_path: Path) -> None:
    load = await bench_attacks.allocate_under_clients(str(tmp_path / "a"), clients=3,
                                                      seconds=0.5)
    assert load.clients == 3 and load.calls > 0 and load.errors == 0
    assert load.requests_per_second > 0

    stray = await bench_attacks.stray_stream_registrations(str(tmp_path / "s"), streams=5)
    assert stray == bench_attacks.StrayStreams(streams=5, registrations=0)

    flood = await bench_attacks.rss_after_floods(str(tmp_path / "f"), oversized=2,
                                                 malformed=10)
    assert flood.still_serves
    assert flood.rss_before_kib > 0 and flood.rss_after_kib > 0

    pref = await bench_attacks.preferred_allocation_time(str(tmp_path / "p"), available=200,
                                                         must_include=100)
    assert pref.available == 200 and pref.seconds > 0
