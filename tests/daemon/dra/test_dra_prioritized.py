"""Prioritized lists (``firstAvailable``): the scheduler names the chosen subrequest
``<request>/<subrequest>``; the driver answers under ``<request>``, the name the 1.36
kubelet matches a container's ``resources.claims[].request`` against."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.contract.checkpoint import PreparedClaim, PreparedDevice, decode, encode
from rdma_hca.daemon._proto.dra import dra_v1_pb2
from rdma_hca.daemon.dra import files
from rdma_hca.daemon.dra.claims import read_claim
from rdma_hca.devkit.dra.claiminfo import ClaimInfoCache, pod
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import claim_requests


def _result(device: str, request: str) -> dict[str, str]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device}


def _cdi(uid: str, device: str) -> str:
    return f"{DRIVER}/claim={uid}-{device}"


def _env(stage: DraStage, uid: str, index: int = 0) -> list[str]:
    spec: dict[str, Any] = json.loads(
        (stage.cdi_dir / f"{DRIVER}-claim-{uid}.json").read_text())
    env: list[str] = spec["devices"][index]["containerEdits"]["env"]
    return env


async def test_a_container_naming_the_request_of_a_prioritized_list_gets_its_hca(
        stage: DraStage) -> None:
    assert stage.kubelet is not None
    # "An HCA with 400G free if one is, else any": the scheduler took the second.
    uid = stage.api.add_claim("ns", "job-0-rdma-4kq2x", [_result("mlx5-1", "hca/any")])
    (request,) = stage.api.claim("ns", "job-0-rdma-4kq2x")["spec"]["devices"]["requests"]
    assert request == {"name": "hca", "firstAvailable": [
        {"name": "any", "deviceClassName": "rdma-hca.io"}]}
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "job-0-rdma-4kq2x")])
    job = pod("ns", "job-0", {"rdma": "job-0-rdma-4kq2x"},
              {"worker": [("rdma", "hca")], "sidecar": [("rdma", "")],
               "other": [("rdma", "nic")]})
    assert stage.kubelet.container_devices(job, "worker") == [_cdi(uid, "mlx5-1")]
    assert stage.kubelet.container_devices(job, "sidecar") == [_cdi(uid, "mlx5-1")]
    assert stage.kubelet.container_devices(job, "other") == []
    (device,) = resp.claims[uid].devices
    assert list(device.request_names) == ["hca"]
    assert "RDMA_HCA_DEVICES=mlx5_1" in _env(stage, uid)
    # Kept so in the checkpoint and the CDI spec: after a restart the answer is the same.
    assert stage.driver is not None
    checkpoint = json.loads(Path(stage.driver.config.checkpoint).read_text())
    assert checkpoint["claims"][uid]["devices"][0]["request_names"] == ["hca"]
    await stage.restart_driver()
    assert await stage.registered(2)
    again = await stage.kubelet.prepare(DRIVER, [("ns", uid, "job-0-rdma-4kq2x")])
    assert again.claims[uid] == resp.claims[uid]


async def test_each_container_gets_the_devices_of_its_own_request(stage: DraStage) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim("ns", "pair", [
        _result("mlx5-0", "gpu-side/near"), _result("mlx5-2", "gpu-side/near"),
        _result("mlx5-3", "storage")])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "pair")])
    assert [(d.device_name, list(d.request_names)) for d in resp.claims[uid].devices] == [
        ("mlx5-0", ["gpu-side"]), ("mlx5-2", ["gpu-side"]), ("mlx5-3", ["storage"])]
    p = pod("ns", "p", {"net": "pair"},
            {"train": [("net", "gpu-side")], "io": [("net", "storage")]})
    assert stage.kubelet.container_devices(p, "train") == [_cdi(uid, "mlx5-0"),
                                                           _cdi(uid, "mlx5-2")]
    assert stage.kubelet.container_devices(p, "io") == [_cdi(uid, "mlx5-3")]


async def test_one_device_got_by_a_subrequest_and_a_request_answers_each_once(
        stage: DraStage) -> None:
    """A shared device in two requests of one claim: one CDI device, each name once (an
    entry per share, the CDI device on the first only)."""
    assert stage.kubelet is not None
    results = [{**_result("mlx5-0", "a/x"), "shareID": "0b0a1c2d-0000-4000-8000-00000000000a"},
               {**_result("mlx5-0", "b"), "shareID": "0b0a1c2d-0000-4000-8000-00000000000b"}]
    uid = stage.api.add_claim("ns", "both", results)
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "both")])
    devices = resp.claims[uid].devices
    assert [list(d.request_names) for d in devices] == [["a", "b"], ["a", "b"]]
    assert [d.share_id for d in devices] == [r["shareID"] for r in results]
    assert [list(d.cdi_device_ids) for d in devices] == [[_cdi(uid, "mlx5-0")], []]


def test_the_claims_record_keeps_the_full_name_and_gives_the_kubelets() -> None:
    claim = read_claim({"metadata": {"name": "c", "namespace": "n", "uid": "u"},
                        "status": {"allocation": {"devices": {"results": [
                            _result("mlx5-0", "hca/any"), _result("mlx5-1", "plain")]}}}})
    assert [(d.request, d.request_name) for d in claim.devices] == [
        ("hca/any", "hca"), ("plain", "plain")]


# --- the kubelet emulator, as strict as the 1.36 kubelet ---------------------------------


def _answer(*devices: tuple[list[str], str]) -> Any:
    return dra_v1_pb2.NodePrepareResourceResponse(devices=[
        dra_v1_pb2.Device(request_names=names, pool_name=NODE, device_name=name,
                          cdi_device_ids=[f"{DRIVER}/claim=u-{name}"])
        for names, name in devices])


def test_the_emulator_gives_nothing_to_a_container_when_the_driver_answers_the_subrequest(
        ) -> None:
    """What was seen on a real cluster: answering ``hca/any`` starts a container naming
    ``hca`` without its HCA, and one naming the whole claim with it."""
    cache = ClaimInfoCache()
    cache.prepared(DRIVER, ("ns", "u", "c"), _answer((["hca/any"], "mlx5-0")))
    p = pod("ns", "p", {"rdma": "c"}, {"named": [("rdma", "hca")], "whole": [("rdma", "")]})
    assert cache.container_devices(p, "named") == []
    assert cache.container_devices(p, "whole") == [f"{DRIVER}/claim=u-mlx5-0"]
    # A device answered with no request names is every container's of the claim.
    cache.prepared(DRIVER, ("ns", "u", "c"), _answer(([], "mlx5-1")))
    assert cache.container_devices(p, "named") == [f"{DRIVER}/claim=u-mlx5-1"]


def test_the_emulator_refuses_a_container_whose_claim_was_never_prepared() -> None:
    cache = ClaimInfoCache()
    p = pod("ns", "p", {"rdma": "c"}, {"main": [("rdma", "hca")]})
    with pytest.raises(LookupError, match="claim info for ResourceClaim c"):
        cache.container_devices(p, "main")
    # An answer with an error is not kept (the kubelet calls again); Unprepare forgets.
    cache.prepared(DRIVER, ("ns", "u", "c"), dra_v1_pb2.NodePrepareResourceResponse(
        error="not yet"))
    assert cache.claims == {}
    cache.prepared(DRIVER, ("ns", "u", "c"), _answer((["hca"], "mlx5-0")))
    cache.unprepared(DRIVER, ("ns", "u", "c"))
    assert cache.claims == {}


def test_the_emulator_matches_an_extended_resource_by_its_request_mapping() -> None:
    cache = ClaimInfoCache()
    cache.prepared(DRIVER, ("ns", "u", "p-extended-resources-x"),
                   _answer((["container-0-request-0"], "mlx5-0"),
                           (["container-1-request-0"], "mlx5-1")))
    p: dict[str, Any] = {"metadata": {"namespace": "ns"}, "spec": {"containers": [
        {"name": "a"}, {"name": "b"}]}, "status": {"extendedResourceClaimStatus": {
            "resourceClaimName": "p-extended-resources-x", "requestMappings": [
                {"containerName": "a", "resourceName": "rdma/hca",
                 "requestName": "container-0-request-0"},
                {"containerName": "b", "resourceName": "rdma/hca",
                 "requestName": "container-1-request-0"}]}}}
    assert cache.container_devices(p, "a") == [f"{DRIVER}/claim=u-mlx5-0"]
    assert cache.container_devices(p, "b") == [f"{DRIVER}/claim=u-mlx5-1"]


def test_the_requests_a_claim_had_follow_its_results() -> None:
    assert claim_requests([_result("d0", "hca/fast"), _result("d1", "hca/fast"),
                           _result("d2", "x"), _result("d3", "x"),
                           {**_result("d4", "watch"), "adminAccess": True}]) == [
        {"name": "hca", "firstAvailable": [
            {"name": "fast", "deviceClassName": "rdma-hca.io", "count": 2}]},
        {"name": "x", "exactly": {"deviceClassName": "rdma-hca.io", "count": 2}},
        {"name": "watch", "exactly": {"deviceClassName": "rdma-hca.io",
                                      "adminAccess": True}}]


def test_what_an_older_driver_recorded_in_full_is_read_as_the_request() -> None:
    """Claims prepared before the upgrade answer the kubelet under the request too."""
    older = PreparedDevice(("hca/any",), NODE, "mlx5-0", "mlx5_0", ("x",))
    claims, _ = decode(encode({"u": PreparedClaim("n", "c", (older,))}), "f")
    assert claims["u"].devices[0].request_names == ("hca",)
    spec = files.claim_spec(DRIVER, "u", PreparedClaim("n", "c", (
        PreparedDevice(("a/x", "a/y", "b"), NODE, "mlx5-0", "mlx5_0", ("x",)),)),
        {"mlx5-0": ()}, None, {"mlx5-0": []})
    assert spec["devices"][0]["annotations"][f"{DRIVER}/requests"] == "a/x,a/y,b"
    found = files.claim_from_spec(spec, DRIVER)
    assert found is not None and found[1].devices[0].request_names == ("a", "b")
