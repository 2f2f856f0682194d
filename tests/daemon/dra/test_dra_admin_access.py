"""Admin access: a device allocated with ``adminAccess`` (a fabric monitor's, a debug
pod's) is prepared for its claim like any other but holds nothing: no bandwidth, no turn
on an exclusive device, not in the held metrics; its preparation is logged and counted."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.contract.checkpoint import (
    CheckpointError,
    PreparedClaim,
    PreparedDevice,
    checksum,
    decode,
    encode,
)
from rdma_hca.daemon.dra.claims import read_claim
from rdma_hca.devkit.dra.claiminfo import pod
from rdma_hca.devkit.dra.stage import DraStage, admin_result, share_result
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.settings.model import Mode

ADMIN_LABEL = {"resource.kubernetes.io/admin-access": "true"}
SHARE = "0b0a1c2d-0000-4000-8000-00000000000a"


def _spec(stage: DraStage, uid: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(
        (stage.cdi_dir / f"{DRIVER}-claim-{uid}.json").read_text())
    return spec


def _checkpoint(stage: DraStage) -> dict[str, Any]:
    assert stage.driver is not None
    claims: dict[str, Any] = json.loads(
        Path(stage.driver.config.checkpoint).read_text())["claims"]
    return claims


async def test_a_monitor_sees_an_hca_another_claim_holds_whole_and_holds_nothing(
        stage: DraStage, dra_node: SimNode, caplog: pytest.LogCaptureFixture) -> None:
    assert stage.kubelet is not None and stage.driver is not None
    job = stage.api.add_claim("team", "job", [
        share_result("hca", "mlx5-0", NODE, bandwidth="400G", share_id=SHARE)])
    assert (await stage.kubelet.prepare(DRIVER, [("team", job, "job")])).claims[job].error \
        == ""
    assert stage.driver.stats().bandwidth_held["mlx5_0"] == 400 * 10**9
    stage.api.add_namespace("fabric", ADMIN_LABEL)
    uid = stage.api.add_claim("fabric", "monitor-0", [admin_result("hca", "mlx5-0", NODE)])
    with caplog.at_level(logging.INFO, logger="rdma_hca.daemon.dra.prepare"):
        resp = await stage.kubelet.prepare(DRIVER, [("fabric", uid, "monitor-0")])
    assert resp.claims[uid].error == ""
    # Prepared for the monitor's containers: the HCA's device nodes and env.
    monitor = pod("fabric", "monitor", {"hcas": "monitor-0"}, {"counters": [("hcas", "hca")]})
    assert stage.kubelet.container_devices(monitor, "counters") == [
        f"{DRIVER}/claim={uid}-mlx5-0"]
    (device,) = _spec(stage, uid)["devices"]
    nodes = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    assert f"/dev/infiniband/{dra_node.uverbs_name('mlx5_0')}" in nodes
    assert "RDMA_HCA_DEVICES=mlx5_0" in device["containerEdits"]["env"]
    assert not any(e.startswith("RDMA_HCA_BANDWIDTH=") for e in device["containerEdits"]["env"])
    assert device["annotations"][f"{DRIVER}/admin-access"] == "true"
    # Holding nothing, and said so.
    stats = stage.driver.stats()
    assert stats.bandwidth_held["mlx5_0"] == 400 * 10**9
    assert stats.admin_access_claims == 1 and stats.prepared_claims == 2
    entry = _checkpoint(stage)[uid]["devices"][0]
    assert entry["admin_access"] is True and "shares" not in entry
    assert any("admin access to mlx5-0 (mlx5_0)" in r.getMessage()
               and "holding nothing" in r.getMessage() for r in caplog.records)
    # The same after a restart, and after the checkpoint is lost (rebuilt from the specs).
    driver = await stage.restart_driver()
    assert await stage.registered(2)
    assert driver.stats().admin_access_claims == 1
    assert driver.stats().bandwidth_held["mlx5_0"] == 400 * 10**9
    Path(driver.config.checkpoint).unlink()
    driver = await stage.restart_driver()
    assert await stage.registered(3)
    assert _checkpoint(stage)[uid]["devices"][0]["admin_access"] is True
    assert driver.stats().admin_access_claims == 1
    assert driver.stats().bandwidth_held["mlx5_0"] == 400 * 10**9
    # Unprepared: the holder's share is untouched.
    assert (await stage.kubelet.unprepare(DRIVER, [("fabric", uid, "monitor-0")])
            ).claims[uid].error == ""
    assert driver.stats().admin_access_claims == 0
    assert driver.stats().bandwidth_held["mlx5_0"] == 400 * 10**9


async def test_admin_access_in_exclusive_mode_is_prepared_beside_the_holder(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api, mode=Mode.EXCLUSIVE) as s:
        assert s.kubelet is not None and s.driver is not None and await s.registered()
        held = api.add_claim("team", "whole", [
            {"request": "hca", "driver": DRIVER, "pool": NODE, "device": "mlx5-1"}])
        api.add_namespace("debug", ADMIN_LABEL)
        watch = api.add_claim("debug", "look", [admin_result("hca", "mlx5-1", NODE)])
        resp = await s.kubelet.prepare(DRIVER, [("team", held, "whole"),
                                                ("debug", watch, "look")])
        assert resp.claims[held].error == "" and resp.claims[watch].error == ""
        assert s.driver.preparer.device_waits == 0
        assert s.driver.stats().admin_access_claims == 1


async def test_one_device_held_by_one_request_and_watched_by_another_is_held(
        stage: DraStage) -> None:
    """Two requests of one claim on one device, one of them with admin access: the
    device holds what the other consumed."""
    assert stage.kubelet is not None and stage.driver is not None
    stage.api.add_namespace("ops", ADMIN_LABEL)
    uid = stage.api.add_claim("ops", "mixed", [
        share_result("use", "mlx5-2", NODE, bandwidth="100G", share_id=SHARE),
        admin_result("watch", "mlx5-2", NODE)])
    resp = await stage.kubelet.prepare(DRIVER, [("ops", uid, "mixed")])
    (device,) = resp.claims[uid].devices
    assert list(device.request_names) == ["use", "watch"]
    assert stage.driver.stats().bandwidth_held["mlx5_2"] == 100 * 10**9
    assert stage.driver.stats().admin_access_claims == 0


def test_admin_access_is_read_from_the_result_only_when_true() -> None:
    claim = read_claim({"metadata": {"name": "c", "namespace": "n", "uid": "u"},
                        "status": {"allocation": {"devices": {"results": [
                            {**admin_result("a", "mlx5-0", NODE)},
                            {**admin_result("b", "mlx5-1", NODE), "adminAccess": "yes"},
                            {"request": "c", "driver": DRIVER, "pool": NODE,
                             "device": "mlx5-2"}]}}}})
    assert [d.admin_access for d in claim.devices] == [True, False, False]


def test_the_fake_api_server_refuses_admin_access_outside_an_admin_namespace(
        api: FakeApiServer) -> None:
    with pytest.raises(ValueError, match=r"spec.devices.requests\[0\].exactly.adminAccess: "
                                         r"Forbidden: .*resource.kubernetes.io/admin-access"):
        api.add_claim("team", "sneaky", [admin_result("hca", "mlx5-0", NODE)])
    api.add_namespace("team", {"resource.kubernetes.io/admin-access": "false"})
    with pytest.raises(ValueError, match="Forbidden"):
        api.add_claim("team", "sneaky", [admin_result("hca", "mlx5-0", NODE)])
    api.add_namespace("team", ADMIN_LABEL)
    assert api.add_claim("team", "allowed", [admin_result("hca", "mlx5-0", NODE)])


def test_the_fake_api_server_checks_a_claims_requests(api: FakeApiServer) -> None:
    def claim(requests: list[dict[str, Any]]) -> dict[str, Any]:
        return {"metadata": {"namespace": "ns", "name": "c"},
                "spec": {"devices": {"requests": requests}}}

    with pytest.raises(ValueError, match="exactly one of `exactly` or `firstAvailable`"):
        api.put("resourceclaims", claim([{"name": "hca", "exactly": {"deviceClassName": "c"},
                                          "firstAvailable": []}]))
    with pytest.raises(ValueError, match=r"requests\[0\].name: Invalid value: 'hca/any'"):
        api.put("resourceclaims", claim([{"name": "hca/any",
                                          "exactly": {"deviceClassName": "c"}}]))
    with pytest.raises(ValueError, match=r"requests\[1\].name: Duplicate value"):
        api.put("resourceclaims", claim([{"name": "a", "exactly": {"deviceClassName": "c"}},
                                         {"name": "a", "exactly": {"deviceClassName": "c"}}]))
    with pytest.raises(ValueError, match=r"firstAvailable\[0\].name: Invalid value"):
        api.put("resourceclaims", claim([{"name": "a", "firstAvailable": [
            {"name": "Fast", "deviceClassName": "c"}]}]))


def test_the_checkpoint_keeps_admin_access_and_reads_files_without_it() -> None:
    watched = PreparedDevice(("hca",), NODE, "mlx5-0", "mlx5_0", ("x",), admin_access=True)
    plain = PreparedDevice(("hca",), NODE, "mlx5-1", "mlx5_1", ("y",))
    text = encode({"u": PreparedClaim("n", "c", (watched, plain))})
    claims, version = decode(text, "f")
    assert claims["u"].devices == (watched, plain) and version == 2
    assert text.count("admin_access") == 1  # written only where true
    # An older driver's file (no key) reads as holding; a bad value is a malformed entry.
    older = encode({"u": PreparedClaim("n", "c", (plain,))})
    assert decode(older, "f")[0]["u"].devices[0].admin_access is False
    raw = json.loads(text)
    raw["claims"]["u"]["devices"][0]["admin_access"] = "yes"
    raw["checksum"] = checksum(raw["claims"])
    with pytest.raises(CheckpointError, match="admin_access must be true or false"):
        decode(json.dumps(raw), "f")
