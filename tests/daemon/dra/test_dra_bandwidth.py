"""Sharing an HCA by bandwidth (DRAConsumableCapacity): each shared device publishes
``<driver>/bandwidth``, Prepare keeps each share (checkpoint, claim status, env) and
Unprepare releases it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.contract.checkpoint import (
    PreparedClaim,
    PreparedDevice,
    Share,
    decode,
    encode,
)
from rdma_hca.contract.dra import NODE_DEVICE
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.devkit.dra.stage import DraStage, share_result
from rdma_hca.devkit.kube import validation
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.model import Hca
from rdma_hca.settings.model import Mode

BANDWIDTH = f"{DRIVER}/bandwidth"
POLICY = {"default": "0", "validRange": {"min": "0", "step": "1G"}}
SHARE_A = "0b0a1c2d-0000-4000-8000-00000000000a"
SHARE_B = "0b0a1c2d-0000-4000-8000-00000000000b"


def _spec(stage: DraStage, uid: str) -> dict[str, Any]:
    (path,) = [p for p in stage.cdi_dir.iterdir() if uid in p.name]
    spec: dict[str, Any] = json.loads(path.read_text())
    return spec


def _env(stage: DraStage, uid: str) -> dict[str, str]:
    env = _spec(stage, uid)["devices"][0]["containerEdits"]["env"]
    return dict(e.split("=", 1) for e in env)


def _checkpoint(stage: DraStage) -> dict[str, Any]:
    assert stage.driver is not None
    raw: dict[str, Any] = json.loads(Path(stage.driver.config.checkpoint).read_text())
    return raw["claims"]


def _held(stage: DraStage, hca: str) -> int:
    assert stage.driver is not None
    return stage.driver.stats().bandwidth_held[hca]


# --- the slice --------------------------------------------------------------------------


async def test_every_device_of_a_13_hca_node_publishes_its_bandwidth(tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "node", hcas=12, bond=True, gid_table_size=4)
    async with DraStage(node, tmp_path / "stage") as stage:
        assert await stage.registered()
        # Published through the strict fake API server: it took every capacity.
        # 13 HCAs and the node-wide device, which holds slots, not bandwidth.
        assert await stage.until(lambda: len(stage.devices()) == 14)
        devices = stage.devices()
        node_wide = devices.pop(NODE_DEVICE)
        assert BANDWIDTH not in node_wide["capacity"]
        for name, d in devices.items():
            assert d["allowMultipleAllocations"] is True
            expected = "200G" if name == "mlx5-bond-0" else "400G"  # the bond's one port
            assert d["capacity"] == {BANDWIDTH: {"value": expected, "requestPolicy": POLICY}}
            assert len(d["attributes"]) + len(d["capacity"]) <= 32
        assert stage.driver is not None
        assert stage.driver.stats().bandwidth_capacity["mlx5_11"] == 400 * 10**9
        assert stage.driver.stats().bandwidth_held == dict.fromkeys(
            [f"mlx5_{i}" for i in range(12)] + ["mlx5_bond_0"], 0)


def _hcas(tmp_path: Path) -> tuple[Hca, ...]:
    node = sim.gpu_node(tmp_path / "node", hcas=2, bond=False, gid_table_size=4)
    return discover_node(node.sysfs_root, node.dev_root).hcas


def _with_rate(hca: Hca, gbps: float | None) -> Hca:
    return dataclasses.replace(hca, ports=tuple(dataclasses.replace(p, rate_gbps=gbps)
                                                for p in hca.ports))


def test_exclusive_devices_unknown_rates_and_other_driver_names(tmp_path: Path) -> None:
    hcas = _hcas(tmp_path)
    exclusive = DeviceOffer.build(hcas, DRIVER, Mode.EXCLUSIVE, True, None)
    assert not any("capacity" in d for d in exclusive.devices)
    assert exclusive.bandwidth() == {"mlx5_0": 0, "mlx5_1": 0}
    # No rate known, or one below the step: no capacity (the API wants room for a step).
    odd = (_with_rate(hcas[0], None), _with_rate(hcas[1], 2.5))
    offer = DeviceOffer.build(odd, DRIVER, Mode.SHARED, True, None)
    by_name = {d["name"]: d for d in offer.devices}
    assert "capacity" not in by_name["mlx5-0"]
    assert by_name["mlx5-1"]["capacity"][BANDWIDTH]["value"] == "2500M"
    assert offer.bandwidth() == {"mlx5_0": 0, "mlx5_1": 2_500_000_000}
    slow = DeviceOffer.build((_with_rate(hcas[0], 0.5),), DRIVER, Mode.SHARED, True, None)
    assert "capacity" not in slow.devices[0]
    # The capacity is qualified by the driver's name, like its attributes.
    other = DeviceOffer.build(hcas, "hca.example.com", Mode.SHARED, True, None)
    assert set(other.devices[0]["capacity"]) == {"hca.example.com/bandwidth"}


def test_the_published_devices_pass_the_strict_validation(tmp_path: Path) -> None:
    offer = DeviceOffer.build(_hcas(tmp_path), DRIVER, Mode.SHARED, True, None)
    validation.check_slice({
        "metadata": {"name": "s"},
        "spec": {"driver": DRIVER, "nodeName": NODE, "devices": list(offer.devices),
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}}},
        taints_allowed=True)


# --- Prepare and Unprepare ----------------------------------------------------------------


async def test_a_claim_holding_100g_prepares_and_unprepare_releases_it(stage: DraStage) -> None:
    assert stage.kubelet is not None and stage.driver is not None
    uid = stage.api.add_claim("ns", "c", [
        share_result("hca", "mlx5-0", NODE, bandwidth="100G", share_id=SHARE_A)])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    assert resp.claims[uid].error == ""
    assert _env(stage, uid)["RDMA_HCA_BANDWIDTH"] == "mlx5_0=100000000000"
    (device,) = _checkpoint(stage)[uid]["devices"]
    assert device["shares"] == [{"id": SHARE_A, "bandwidth": 100 * 10**9}]
    assert _held(stage, "mlx5_0") == 100 * 10**9 and _held(stage, "mlx5_1") == 0
    await stage.statuses_written()
    (entry,) = stage.api.claim("ns", "c")["status"]["devices"]
    assert (entry["device"], entry["shareID"]) == ("mlx5-0", SHARE_A)
    assert [r.share_id for r in stage.kubelet.claim_resources(uid)] == [SHARE_A]
    resp = await stage.kubelet.unprepare(DRIVER, [("ns", uid, "c")])
    assert resp.claims[uid].error == ""
    assert stage.kubelet.claim_resources(uid) == []
    assert _held(stage, "mlx5_0") == 0
    assert uid not in _checkpoint(stage)


async def test_a_claim_without_a_share_is_prepared_as_before(stage: DraStage) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim("ns", "plain", [
        {"request": "hca", "driver": DRIVER, "pool": NODE, "device": "mlx5-1"}])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "plain")])
    assert resp.claims[uid].error == ""
    assert "RDMA_HCA_BANDWIDTH" not in _env(stage, uid)
    (answered,) = resp.claims[uid].devices
    assert not answered.HasField("share_id")  # no share: no share ID, as before
    assert [r.share_id for r in stage.kubelet.claim_resources(uid)] == [None]
    (device,) = _checkpoint(stage)[uid]["devices"]
    assert "shares" not in device  # the file an older driver writes, and reads
    # A share that asked for no bandwidth (the policy's default 0): a share, no bandwidth.
    zero = stage.api.add_claim("ns", "zero", [share_result("hca", "mlx5-1", NODE)])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", zero, "zero")])
    assert resp.claims[zero].error == ""
    assert "RDMA_HCA_BANDWIDTH" not in _env(stage, zero)
    assert _checkpoint(stage)[zero]["devices"][0]["shares"][0]["bandwidth"] == 0
    assert _held(stage, "mlx5_1") == 0


async def test_two_requests_sharing_one_hca_add_up(stage: DraStage) -> None:
    assert stage.kubelet is not None and stage.driver is not None
    uid = stage.api.add_claim("ns", "two", [
        share_result("a", "mlx5-0", NODE, bandwidth="150G", share_id=SHARE_A),
        # The API server writes what the scheduler rounded up, in its own form.
        share_result("b", "mlx5-0", NODE, bandwidth="146484375Ki", share_id=SHARE_B),
        share_result("c", "mlx5-1", NODE, bandwidth="0")])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "two")])
    entry = resp.claims[uid]
    assert entry.error == ""
    # One CDI device for the HCA both requests got, and one entry for each share: the
    # CDI IDs on the first only, so the runtime gets each CDI device once.
    cdi = {d: f"{DRIVER}/claim={uid}-{d}" for d in ("mlx5-0", "mlx5-1")}
    (share_c,) = [r["shareID"] for r in stage.api.claim("ns", "two")["status"]["allocation"][
        "devices"]["results"] if r["request"] == "c"]
    assert [(list(d.request_names), d.device_name, d.share_id, list(d.cdi_device_ids))
            for d in entry.devices] == [
        (["a", "b"], "mlx5-0", SHARE_A, [cdi["mlx5-0"]]), (["a", "b"], "mlx5-0", SHARE_B, []),
        (["c"], "mlx5-1", share_c, [cdi["mlx5-1"]])]
    assert len(_spec(stage, uid)["devices"]) == 2
    # What the PodResources API shows a container naming the claim: each share.
    assert [(r.device, r.share_id, r.cdi_devices) for r in stage.kubelet.claim_resources(uid)
            ] == [("mlx5-0", SHARE_A, (cdi["mlx5-0"],)), ("mlx5-0", SHARE_B, ()),
                  ("mlx5-1", share_c, (cdi["mlx5-1"],))]
    assert _env(stage, uid)["RDMA_HCA_BANDWIDTH"] == "mlx5_0=300000000000,mlx5_1=0"
    assert _held(stage, "mlx5_0") == 300 * 10**9
    await stage.statuses_written()
    status = stage.api.claim("ns", "two")["status"]["devices"]
    assert sorted((e["device"], e["shareID"]) for e in status if e["device"] == "mlx5-0") == [
        ("mlx5-0", SHARE_A), ("mlx5-0", SHARE_B)]


async def test_shares_survive_a_restart_and_a_lost_checkpoint(stage: DraStage) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim("ns", "keep", [
        share_result("hca", "mlx5-2", NODE, bandwidth="100G", share_id=SHARE_A)])
    first = await stage.kubelet.prepare(DRIVER, [("ns", uid, "keep")])
    stage.api.delete("resourceclaims", "ns", "keep")  # only the checkpoint knows it now
    driver = await stage.restart_driver()
    assert await stage.registered(2)
    assert driver.stats().bandwidth_held["mlx5_2"] == 100 * 10**9
    again = await stage.kubelet.prepare(DRIVER, [("ns", uid, "keep")])
    assert again.claims[uid] == first.claims[uid]
    # The checkpoint lost: rebuilt from the CDI spec, whose annotations carry the shares.
    Path(driver.config.checkpoint).unlink()
    driver = await stage.restart_driver()
    assert await stage.registered(3)
    assert driver.stats().bandwidth_held["mlx5_2"] == 100 * 10**9
    assert _checkpoint(stage)[uid]["devices"][0]["shares"] == [
        {"id": SHARE_A, "bandwidth": 100 * 10**9}]
    resp = await stage.kubelet.unprepare(DRIVER, [("ns", uid, "keep")])
    assert resp.claims[uid].error == ""
    assert driver.stats().bandwidth_held["mlx5_2"] == 0


async def test_a_consumed_capacity_that_is_no_quantity_fails_the_claim(
        stage: DraStage) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim("ns", "bad", [
        share_result("hca", "mlx5-0", NODE, bandwidth="lots")])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "bad")])
    assert "consumed 'lots' of rdma-hca.io/bandwidth, which is not a quantity" in \
        resp.claims[uid].error
    assert _held(stage, "mlx5_0") == 0


# --- the checkpoint format -----------------------------------------------------------------


def test_shares_round_trip_and_an_older_file_still_loads() -> None:
    plain = PreparedDevice(("hca",), NODE, "mlx5-0", "mlx5_0", (f"{DRIVER}/claim=u-mlx5-0",))
    shared = dataclasses.replace(plain, shares=(Share(SHARE_A, 10**11), Share(SHARE_B, 5)))
    claims = {"u": PreparedClaim("ns", "c", (shared,)), "v": PreparedClaim("ns", "d", (plain,))}
    assert decode(encode(claims), "f") == (claims, 2)
    assert claims["u"].devices[0].bandwidth == 10**11 + 5
    # A version-2 file an older driver wrote (no shares) loads with none.
    older = json.loads(encode({"v": claims["v"]}))
    assert "shares" not in older["claims"]["v"]["devices"][0]
    assert decode(encode({"v": claims["v"]}), "f")[0]["v"].devices[0].shares == ()


@pytest.mark.parametrize("shares", [{"id": "x"}, [{"id": "x", "bandwidth": -1}],
                                    [{"id": "x", "bandwidth": "1G"}], [{"bandwidth": 1}]])
def test_malformed_shares_make_the_checkpoint_unreadable(shares: object) -> None:
    from rdma_hca.contract.checkpoint import CheckpointError, checksum

    body = {"u": {"namespace": "ns", "name": "c", "devices": [
        {"request_names": ["hca"], "pool": NODE, "device": "mlx5-0", "hca": "mlx5_0",
         "cdi_ids": [], "shares": shares}]}}
    text = json.dumps({"version": 2, "checksum": checksum(body), "claims": body})
    with pytest.raises(CheckpointError, match="malformed claim entry"):
        decode(text, "f")


# --- /metrics -------------------------------------------------------------------------------


async def test_metrics_show_1e11_held_while_a_claim_holds_100g(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from rdma_hca.daemon.wiring import Daemon
    from rdma_hca.devkit.dra.kubelet import DraKubelet
    from rdma_hca.devkit.waiting import wait_until
    from rdma_hca.settings.model import DraConfig, Settings

    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    root = tempfile.mkdtemp(prefix="dra-b-", dir="/tmp")  # unix socket paths: 107 bytes
    settings = Settings(sysfs_root=str(dra_node.sysfs_root), dev_root=str(dra_node.dev_root),
                        kubelet_root=root, node_name=NODE, metrics_address="127.0.0.1:0",
                        device_plugin_enabled=False,
                        dra=DraConfig(enabled=True, start_jitter_seconds=0))
    kubelet = DraKubelet(root, NODE)
    await kubelet.start()
    daemon = Daemon(settings, netlink=False)

    async def scrape() -> dict[tuple[str, str], float]:
        assert daemon.http is not None
        url = f"http://127.0.0.1:{daemon.http.bound_port}/metrics"

        def get() -> str:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return str(resp.read().decode())

        text = await asyncio.to_thread(get)
        return {(s.name, s.labels["hca"]): s.value
                for f in text_string_to_metric_families(text) for s in f.samples
                if s.name.startswith("rdma_hca_dra_bandwidth_")}

    held = "rdma_hca_dra_bandwidth_held"
    total = "rdma_hca_dra_bandwidth_capacity"
    try:
        await daemon.start()
        assert await kubelet.wait_registered(DRIVER)
        assert await wait_until(lambda: daemon.ready(), 10.0)
        before = await scrape()
        assert before[(held, "mlx5_0")] == 0 and before[(total, "mlx5_0")] == 4e11
        assert before[(total, "mlx5_bond_0")] == 2e11
        uid = api.add_claim("ns", "m", [share_result("hca", "mlx5-0", NODE,
                                                     bandwidth="100G")])
        resp = await kubelet.prepare(DRIVER, [("ns", uid, "m")])
        assert resp.claims[uid].error == ""
        during = await scrape()
        assert during[(held, "mlx5_0")] == 1e11 and during[(held, "mlx5_1")] == 0
        resp = await kubelet.unprepare(DRIVER, [("ns", uid, "m")])
        assert resp.claims[uid].error == ""
        assert (await scrape())[(held, "mlx5_0")] == 0
    finally:
        await daemon.stop()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
