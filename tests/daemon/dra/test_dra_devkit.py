"""The DRA demo and benchmark run the real driver end to end."""

from __future__ import annotations

import io
import math
import re

import pytest

from rdma_hca.devkit.dra.bench import run_dra_bench
from rdma_hca.devkit.dra.demo import run_dra_demo


@pytest.mark.slow
def test_demo_walks_through_slice_prepare_port_down_and_restart() -> None:
    out = io.StringIO()
    assert run_dra_demo(out=out) == 0
    text = out.getvalue()
    assert "registered the driver (v1.DRAPlugin)" in text
    # Nine HCAs, and the node-wide device.
    assert "pool gpu-node-1 generation 1, 10 devices" in text
    assert "request container-0-request-0, one device of rdma-hca.io-extended -> all-hcas" \
        in text
    assert "the container gets 9 HCAs' device nodes + rdma_cm, RDMA_HCA_DEVICES=mlx5_0," in text
    assert re.search(r"\n  mlx5-2 +mlx5_2 +pci0000:", text)
    assert re.search(r"\n  all-hcas +every usable \(9\) +- ", text)
    assert "CDI ID rdma-hca.io/claim=" in text
    assert "taint rdma-hca.io/link-down=down:NoSchedule" in text
    assert "gpu-node-1/mlx5-3 UNHEALTHY" in text
    # One slice rewritten in place: the pool generation stays (as upstream's helper keeps it).
    assert "up again -> taint cleared, ResourceSlice" in text
    assert "published again" in text


@pytest.mark.slow
def test_bench_measures_both_figures() -> None:
    figures = {f.key: f for f in run_dra_bench(quick=True)}
    for key in ("dra_prepare_p50_ms", "dra_prepare_100_p50_ms"):
        prepare = figures[key]
        assert prepare.ours is not None and prepare.baseline is not None, prepare.note
        assert math.isfinite(prepare.ours) and prepare.ours > 0 and prepare.baseline > 0
    port = figures["dra_port_down_slice_ms"]
    assert port.ours is not None and port.ours > 0, port.note
    # The API cost figures are counts from the fake API server.
    for key in ("dra_requests_per_slice_write", "dra_idle_requests_per_node_minute",
                "dra_flap_slice_writes_30s", "dra_flap_settle_ms", "dra_burst_300_s",
                "dra_burst_300_failed", "dra_prepare_after_burst_ms",
                "dra_claim_gets_per_fresh_claim", "dra_burst_300_status_written_s"):
        assert figures[key].ours is not None, figures[key].note
    assert figures["dra_requests_per_slice_write"].ours == 1.0
