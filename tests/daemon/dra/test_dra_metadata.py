"""Device metadata (KEP-5304): the files Prepare writes, the CDI mounts, Unprepare's cleanup."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.daemon.dra.metadata import device_attributes
from rdma_hca.daemon.offer.env import EnvSettings
from rdma_hca.devkit.dra.stage import DraStage, with_changes
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import DeviceMetadata, NcclEnv

INSIDE = "/var/run/kubernetes.io/dra-device-attributes"
# What the upstream types (api/metadata/v1beta1 and v1alpha1) allow, and nothing else.
TOP_KEYS = {"kind", "apiVersion", "metadata", "podClaimName", "requests"}
DEVICE_KEYS = {"driver", "pool", "name", "attributes", "networkData"}
VALUE_KINDS = {"int": int, "bool": bool, "string": str, "version": str,
               "ints": list, "bools": list, "strings": list, "versions": list}
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
QUALIFIED = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z_][A-Za-z0-9_]{0,31}")


def _result(device: str, request: str = "hca") -> dict[str, str]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device}


def _stream(path: Path) -> list[dict[str, Any]]:
    """A JSON stream, read the way the upstream decoder reads it: object after object."""
    text, objects, at = path.read_text(), [], 0
    decoder = json.JSONDecoder()
    while text[at:].strip():
        obj, end = decoder.raw_decode(text, at + (len(text[at:]) - len(text[at:].lstrip())))
        objects.append(obj)
        at = end
    return objects


def _check_schema(obj: dict[str, Any]) -> None:
    assert set(obj) <= TOP_KEYS and obj["kind"] == "DeviceMetadata"
    assert set(obj["metadata"]) == {"name", "namespace", "uid", "generation"}
    assert obj["metadata"]["generation"] == 1
    for request in obj["requests"]:
        assert set(request) == {"name", "devices"}
        for device in request["devices"]:
            assert set(device) <= DEVICE_KEYS
            assert device["driver"] == DRIVER and DNS_LABEL.fullmatch(device["name"])
            attrs = device["attributes"]
            assert len(attrs) <= 32  # the API's limit on a device's attributes
            for key, value in attrs.items():
                assert QUALIFIED.fullmatch(key), key
                (kind, inner), = value.items()  # exactly one typed value
                assert isinstance(inner, VALUE_KINDS[kind]), (key, value)


def _spec(stage: DraStage, uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((stage.cdi_dir / f"{DRIVER}-claim-{uid}.json").read_text())
    return data


def _root(stage: DraStage) -> Path:
    assert stage.driver is not None
    return Path(stage.driver.config.plugin_dir) / "dra-device-metadata"


@pytest.fixture
async def meta_stage(dra_node: SimNode, tmp_path: Path,
                     api: FakeApiServer) -> AsyncIterator[DraStage]:
    async with DraStage(dra_node, tmp_path / "m", api=api, env=EnvSettings(nccl=NcclEnv.AUTO),
                        config=with_changes(device_metadata=DeviceMetadata.V1BETA1)) as s:
        assert await s.registered() and await s.until(lambda: bool(s.devices()))
        yield s


async def test_each_request_gets_its_file_in_the_upstream_format(
        meta_stage: DraStage, dra_node: SimNode) -> None:
    s = meta_stage
    assert s.kubelet is not None
    uid = s.api.add_claim("team", "two", [_result("mlx5-0", "a"), _result("mlx5-1", "b")])
    resp = await s.kubelet.prepare(DRIVER, [("team", uid, "two")])
    assert resp.claims[uid].error == ""
    assert sorted(os.listdir(_root(s))) == ["team_two"]
    assert sorted(os.listdir(_root(s) / "team_two")) == ["a", "b"]
    spec = _spec(s, uid)
    published = s.devices()
    hcas = {h.name: h for h in discover_node(dra_node.sysfs_root, dra_node.dev_root).hcas}
    for request, device, hca in (("a", "mlx5-0", "mlx5_0"), ("b", "mlx5-1", "mlx5_1")):
        objects = _stream(_root(s) / "team_two" / request / "metadata.json")
        # Newest first, the same content once per version.
        assert [o["apiVersion"] for o in objects] == [
            "metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]
        assert {json.dumps({**o, "apiVersion": ""}, sort_keys=True) for o in objects} == {
            json.dumps({**objects[0], "apiVersion": ""}, sort_keys=True)}
        for o in objects:
            _check_schema(o)
        first = objects[0]
        assert first["metadata"] == {"name": "two", "namespace": "team", "uid": uid,
                                     "generation": 1}
        assert "podClaimName" not in first
        (req,) = first["requests"]
        assert req["name"] == request
        (dev,) = req["devices"]
        assert (dev["driver"], dev["pool"], dev["name"]) == (DRIVER, NODE, device)
        attrs = dev["attributes"]
        # Every attribute the slice publishes for the device, with the same value.
        for key, value in published[device]["attributes"].items():
            assert attrs[key] == value, key
        assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": hcas[hca].pcie_root}
        assert attrs["resource.kubernetes.io/pciBusID"] == {"string": hcas[hca].pci_bus_id}
        assert attrs[f"{DRIVER}/netdev"] == {"string": hcas[hca].netdevs[0]}
        assert attrs[f"{DRIVER}/linkLayer"] == {"string": "Ethernet"}
        # The RoCE v2 GIDs as sysfs has them, each with its address family.
        want = sorted((p.number, g.index, g.address, g.kind.value) for p in hcas[hca].ports
                      for g in p.gids if g.is_roce_v2 and g.kind.value != "other")
        got = []
        for entry in attrs[f"{DRIVER}/roceV2GIDs"]["strings"]:
            port, index, family, gid = entry.split(":", 3)
            got.append((int(port), int(index), gid, family))
        assert want and len(got) == len(want)
        for (p, i, gid, kind), (gp, gi, ggid, family) in zip(want, sorted(got), strict=True):
            assert (p, i, gid) == (gp, gi, ggid)
            assert family == ("inet" if kind == "ipv4-mapped" else "inet6")
        # The env is the one the claim's containers get from its CDI spec.
        cdi_device = next(d for d in spec["devices"]
                          if d["annotations"][f"{DRIVER}/device"] == device)
        assert attrs[f"{DRIVER}/containerEnv"] == {"strings": cdi_device["containerEdits"]["env"]}
        assert any(v.startswith("NCCL_IB_HCA==") for v in cdi_device["containerEdits"]["env"])
        # The CDI device of the request's HCA binds the file read-only at the known path.
        assert cdi_device["containerEdits"]["mounts"] == [{
            "hostPath": str(_root(s) / "team_two" / request / "metadata.json"),
            "containerPath": f"{INSIDE}/resourceclaims/two/{request}/{DRIVER}-metadata.json",
            "options": ["ro", "bind"]}]


def test_the_added_attributes_fit_the_api_with_the_published_ones(
        dra_node: SimNode) -> None:
    for hca in discover_node(dra_node.sysfs_root, dra_node.dev_root).hcas:
        attrs = device_attributes(hca, DRIVER, ["A=1"])
        _check_schema({"kind": "DeviceMetadata", "metadata": {
            "name": "c", "namespace": "n", "uid": "u", "generation": 1},
            "requests": [{"name": "r", "devices": [
                {"driver": DRIVER, "pool": NODE, "name": "d", "attributes": attrs}]}]})


async def test_a_template_claim_and_a_subrequest_use_the_pod_claim_name_and_the_request(
        meta_stage: DraStage) -> None:
    s = meta_stage
    assert s.kubelet is not None
    claim = s.api.put("resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "ns", "name": "pod-0-rdma-x7k2q",
                     "annotations": {"resource.kubernetes.io/pod-claim-name": "rdma"}},
        "spec": {"devices": {"requests": [{"name": "hca", "firstAvailable": [
            {"name": "fast", "deviceClassName": "rdma-hca.io"}]}]}},
        "status": {"allocation": {"devices": {"results": [
            _result("mlx5-2", "hca/fast"), _result("mlx5-3", "hca/fast")]}}}})
    uid = claim["metadata"]["uid"]
    resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "pod-0-rdma-x7k2q")])
    assert resp.claims[uid].error == ""
    host = _root(s) / "ns_pod-0-rdma-x7k2q" / "hca" / "metadata.json"
    objects = _stream(host)
    assert objects[0]["podClaimName"] == "rdma"
    (req,) = objects[0]["requests"]
    # Named as the claim's spec names the request (as upstream's writer does), inside and
    # in the path: the name a container gives.
    assert req["name"] == "hca"
    assert [d["name"] for d in req["devices"]] == ["mlx5-2", "mlx5-3"]
    mount = {"hostPath": str(host), "options": ["ro", "bind"],
             "containerPath": f"{INSIDE}/resourceclaimtemplates/rdma/hca/{DRIVER}-metadata.json"}
    assert [d["containerEdits"]["mounts"] for d in _spec(s, uid)["devices"]] == [[mount]] * 2
    # After a reboot the spec is rebuilt from the checkpoint, the mount with it.
    spec_path = s.cdi_dir / f"{DRIVER}-claim-{uid}.json"
    before = spec_path.read_text()
    spec_path.unlink()
    await s.restart_driver()
    assert await s.registered(2)
    assert (await s.kubelet.prepare(DRIVER, [("ns", uid, "pod-0-rdma-x7k2q")])).claims[uid] \
        .error == ""
    assert spec_path.read_text() == before


async def test_unprepare_removes_the_claims_files_and_no_other(meta_stage: DraStage) -> None:
    s = meta_stage
    assert s.kubelet is not None
    gone = s.api.add_claim("ns", "gone", [_result("mlx5-0"), _result("mlx5-1", "other")])
    kept = s.api.add_claim("ns", "kept", [_result("mlx5-1")])
    await s.kubelet.prepare(DRIVER, [("ns", gone, "gone"), ("ns", kept, "kept")])
    assert sorted(os.listdir(_root(s))) == ["ns_gone", "ns_kept"]
    for _ in range(2):  # idempotent
        resp = await s.kubelet.unprepare(DRIVER, [("ns", gone, "gone")])
        assert resp.claims[gone].error == ""
    assert sorted(os.listdir(_root(s))) == ["ns_kept"]
    # A claim of the same name made since keeps its files when the old one is unprepared.
    resp = await s.kubelet.unprepare(DRIVER, [("ns", "an-older-uid", "kept")])
    assert resp.claims["an-older-uid"].error == ""
    assert (_root(s) / "ns_kept" / "hca" / "metadata.json").is_file()
    await s.kubelet.unprepare(DRIVER, [("ns", kept, "kept")])
    assert os.listdir(_root(s)) == []


@pytest.mark.parametrize("fails", ["metadata", "spec"])
async def test_a_prepare_that_fails_leaves_no_metadata(meta_stage: DraStage, fails: str) -> None:
    s = meta_stage
    assert s.kubelet is not None and s.driver is not None
    blocked = _root(s) if fails == "metadata" else s.cdi_dir
    if blocked.is_dir():
        shutil.rmtree(blocked)
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("a file where a directory belongs\n")
    uid = s.api.add_claim("ns", "c", [_result("mlx5-0", "a"), _result("mlx5-1", "b")])
    resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    assert "cannot write the CDI spec or the checkpoint" in resp.claims[uid].error
    assert uid not in s.driver.prepared
    if fails == "spec":
        # No metadata file left: gone again, or (the spec failing first) never written.
        assert not _root(s).exists() or os.listdir(_root(s)) == []
    else:
        assert not (s.cdi_dir / f"{DRIVER}-claim-{uid}.json").exists()


async def test_v1alpha1_alone_is_one_object(dra_node: SimNode, tmp_path: Path,
                                            api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "a", api=api,
                        config=with_changes(device_metadata=DeviceMetadata.V1ALPHA1)) as s:
        assert s.kubelet is not None and await s.registered()
        await s.until(lambda: bool(s.devices()))
        uid = api.add_claim("ns", "c", [_result("mlx5-0")])
        assert (await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])).claims[uid].error == ""
        objects = _stream(_root(s) / "ns_c" / "hca" / "metadata.json")
        assert [o["apiVersion"] for o in objects] == ["metadata.resource.k8s.io/v1alpha1"]
        _check_schema(objects[0])


async def test_off_by_default_writes_no_metadata_and_mounts_nothing(stage: DraStage) -> None:
    assert stage.kubelet is not None and stage.driver is not None
    assert stage.driver.config.device_metadata is DeviceMetadata.OFF
    uid = stage.api.add_claim("ns", "c", [_result("mlx5-0")])
    assert (await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])).claims[uid].error == ""
    assert not _root(stage).exists()
    assert all("mounts" not in d["containerEdits"] for d in _spec(stage, uid)["devices"])
