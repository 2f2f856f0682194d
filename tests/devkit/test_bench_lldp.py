"""The LLDP benchmark measures both figures on the recorded-frame path and says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdma_hca.devkit.bench_lldp import (
    LLDP_FLOOD_CPU,
    LLDP_SWITCH_SLICE,
    flood_cpu,
    switch_change_latency,
)
from rdma_hca.devkit.bench_plan import ordered


@pytest.mark.slow
async def test_the_flood_figure_has_ours_and_the_bare_reader() -> None:
    figure = await flood_cpu(0.5, veth=False)
    assert figure.key == LLDP_FLOOD_CPU.key
    assert figure.ours is not None and figure.ours > 0, figure.note
    assert figure.baseline is not None and figure.baseline > 0
    assert "recorded-frame path" in figure.note and "dropped by its rate limit" in figure.note


@pytest.mark.slow
async def test_a_switch_change_reaches_the_slice(tmp_path: Path) -> None:
    figure = await switch_change_latency(tmp_path, 1)
    assert figure.key == LLDP_SWITCH_SLICE.key
    assert figure.ours is not None and figure.ours > 0, figure.note


def test_the_report_has_the_lldp_rows() -> None:
    keys = [f.key for f in ordered({}, (8,), "not run")]
    assert keys[-2:] == [LLDP_FLOOD_CPU.key, LLDP_SWITCH_SLICE.key]
