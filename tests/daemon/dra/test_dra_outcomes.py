"""Prepare and Unprepare outcomes per claim on /metrics: what the kubelet's gRPC metrics
cannot see, an error for one claim inside an OK answer."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.dra.kubelet import DraKubelet
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.settings.model import DraConfig, Settings

DRIVER = "rdma-hca.io"
NODE = "node-a"


def _result(device: str, pool: str = NODE) -> dict[str, str]:
    return {"request": "hca", "driver": DRIVER, "pool": pool, "device": device}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


@pytest.fixture
def kubelet_root() -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="dra-o-", dir="/tmp")  # socket paths are short
    yield root
    shutil.rmtree(root, ignore_errors=True)


async def test_a_failing_claim_counts_one_error_beside_a_good_one(stage: DraStage) -> None:
    assert stage.kubelet is not None and stage.driver is not None
    keeper = stage.driver.helper
    assert keeper.prepare_results == {"ok": 0, "error": 0}
    good = stage.api.add_claim("ns", "good", [_result("mlx5-0")])
    bad = stage.api.add_claim("ns", "bad", [_result("mlx5-1", pool="node-b")])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", good, "good"), ("ns", bad, "bad")])
    # One answer, OK for gRPC, with an error inside for one claim.
    assert resp.claims[good].error == ""
    assert "pool node-b" in resp.claims[bad].error
    assert keeper.prepare_results == {"ok": 1, "error": 1}
    counts = keeper.prepare_seconds.counts()
    assert counts.count == 2 and counts.total > 0
    resp = await stage.kubelet.unprepare(DRIVER, [("ns", good, "good"), ("ns", bad, "bad")])
    assert keeper.unprepare_results == {"ok": 2, "error": 0}


async def test_a_claim_unprepare_cannot_remove_counts_one_error(stage: DraStage) -> None:
    assert stage.kubelet is not None and stage.driver is not None
    keeper = stage.driver.helper
    uid = stage.api.add_claim("ns", "c", [_result("mlx5-2")])
    assert (await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])).claims[uid].error == ""
    # A directory where the spec was: unlink fails, as on a broken filesystem (as root too).
    spec = stage.cdi_dir / f"{DRIVER}-claim-{uid}.json"
    spec.unlink()
    spec.mkdir()
    resp = await stage.kubelet.unprepare(DRIVER, [("ns", uid, "c")])
    spec.rmdir()
    assert "cannot remove" in resp.claims[uid].error
    assert keeper.unprepare_results == {"ok": 0, "error": 1}
    resp = await stage.kubelet.unprepare(DRIVER, [("ns", uid, "c")])
    assert resp.claims[uid].error == ""
    assert keeper.unprepare_results == {"ok": 1, "error": 1}


async def test_the_daemon_serves_the_outcomes_at_zero_from_the_start(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path, api: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    kubelet = DraKubelet(kubelet_root, NODE)
    await kubelet.start()
    settings = Settings(sysfs_root=str(dra_node.sysfs_root), dev_root=str(dra_node.dev_root),
                        kubelet_root=kubelet_root, node_name=NODE,
                        metrics_address="127.0.0.1:0", device_plugin_enabled=False,
                        dra=DraConfig(enabled=True, start_jitter_seconds=0))
    os.makedirs(settings.kubelet_dir, exist_ok=True)
    daemon = Daemon(settings, netlink=False)
    try:
        await daemon.start()
        assert await kubelet.wait_registered(DRIVER)
        assert await wait_until(lambda: len(api.slices(NODE)) == 1, 10.0)
        assert daemon.http is not None
        url = f"http://127.0.0.1:{daemon.http.bound_port}/metrics"
        before = _samples(await asyncio.to_thread(_get, url))
        for family in ("rdma_hca_dra_prepare_total", "rdma_hca_dra_unprepare_total"):
            for result in ("ok", "error"):
                assert before[(family, (("result", result),))] == 0.0
        assert before[("rdma_hca_dra_prepare_seconds_count", ())] == 0.0
        assert before[("rdma_hca_dra_prepare_seconds_bucket", (("le", "+Inf"),))] == 0.0
        assert before[("rdma_hca_dra_prepare_seconds_bucket", (("le", "10.0"),))] == 0.0

        good = api.add_claim("ns", "good", [_result("mlx5-0")])
        bad = api.add_claim("ns", "bad", [_result("mlx5-1", pool="elsewhere")])
        resp = await kubelet.prepare(DRIVER, [("ns", good, "good"), ("ns", bad, "bad")])
        assert resp.claims[bad].error and not resp.claims[good].error
        after = _samples(await asyncio.to_thread(_get, url))
        assert after[("rdma_hca_dra_prepare_total", (("result", "ok"),))] == 1.0
        assert after[("rdma_hca_dra_prepare_total", (("result", "error"),))] == 1.0
        assert after[("rdma_hca_dra_prepare_seconds_count", ())] == 2.0
        assert after[("rdma_hca_dra_prepare_seconds_bucket", (("le", "+Inf"),))] == 2.0
        await kubelet.unprepare(DRIVER, [("ns", good, "good")])
        last = _samples(await asyncio.to_thread(_get, url))
        assert last[("rdma_hca_dra_unprepare_total", (("result", "ok"),))] == 1.0
        assert last[("rdma_hca_dra_unprepare_total", (("result", "error"),))] == 0.0
    finally:
        await daemon.stop()
        await kubelet.stop()
