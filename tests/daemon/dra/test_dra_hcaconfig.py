"""The parameters a claim passes (HcaConfig): checked in one place, merged per request as
the API orders them, and turned into the env and device nodes of the claim's containers;
a wrong one fails the claim's Prepare with the field named and an Event with the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.contract import hcaconfig
from rdma_hca.contract.checkpoint import PreparedClaim, PreparedDevice, decode, encode
from rdma_hca.contract.hcaconfig import ConfigEntry, GidFamily, HcaConfig, HcaConfigError
from rdma_hca.daemon.dra import files
from rdma_hca.daemon.dra.claims import ClaimError, read_claim
from rdma_hca.daemon.offer.env import EnvSettings, build
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import NcclEnv

Obj = dict[str, Any]


def params(**fields: Any) -> Obj:
    return {"apiVersion": "rdma-hca.io/v1", "kind": "HcaConfig", **fields}


def entry(parameters: Any, requests: list[str] | None = None, driver: str = DRIVER) -> Obj:
    out: Obj = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        out["requests"] = requests
    return out


def _result(device: str, request: str = "hca") -> dict[str, str]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device}


def _spec(stage: DraStage, uid: str) -> Obj:
    data: Obj = json.loads((stage.cdi_dir / f"{DRIVER}-claim-{uid}.json").read_text())
    return data


def _env(stage: DraStage, uid: str, device: int = 0) -> list[str]:
    env: list[str] = _spec(stage, uid)["devices"][device]["containerEdits"]["env"]
    return env


# --- the format, in one place -------------------------------------------------------------

def test_good_parameters_are_read_into_their_fields() -> None:
    got = hcaconfig.parse(params(gidFamily="ipv6", trafficClass=106, serviceLevel=3,
                                 managementDevices=False))
    assert got == HcaConfig(None, GidFamily.IPV6, 106, 3, False)
    assert hcaconfig.parse(params(gidIndex=0)) == HcaConfig(gid_index=0)
    assert hcaconfig.parse(params()).empty


@pytest.mark.parametrize(("parameters", "message"), [
    (params(trafficClass=300),
     'HcaConfig field "trafficClass": 300 is not accepted: an integer 0-255'),
    (params(serviceLevel=16),
     'HcaConfig field "serviceLevel": 16 is not accepted: an integer 0-15'),
    (params(serviceLevel="3"),
     'HcaConfig field "serviceLevel": "3" is not accepted: an integer 0-15'),
    (params(gidIndex=-1), 'HcaConfig field "gidIndex": -1 is not accepted: an integer 0-255'),
    (params(gidIndex=True),
     'HcaConfig field "gidIndex": true is not accepted: an integer 0-255'),
    (params(gidIndex=1.5),
     'HcaConfig field "gidIndex": a number is not accepted: an integer 0-255'),
    (params(gidFamily="inet6"),
     'HcaConfig field "gidFamily": "inet6" is not accepted: ipv4 or ipv6'),
    (params(gidFamily=["ipv4"]),
     'HcaConfig field "gidFamily": a list is not accepted: ipv4 or ipv6'),
    (params(managementDevices="yes"),
     'HcaConfig field "managementDevices": "yes" is not accepted: true or false'),
    (params(gidIndex=3, gidFamily="ipv4"),
     'HcaConfig fields "gidIndex" and "gidFamily" are both set: one of them, or neither'),
    (params(trafficclass=3),
     'HcaConfig field "trafficclass" is not known: the fields are apiVersion, kind, '
     "gidIndex, gidFamily, trafficClass, serviceLevel, managementDevices"),
    ({**params(), "apiVersion": "rdma-hca.io/v2"},
     'HcaConfig field "apiVersion": "rdma-hca.io/v2" is not accepted: rdma-hca.io/v1'),
    ({"kind": "HcaConfig"}, 'HcaConfig field "apiVersion" is missing: rdma-hca.io/v1'),
    ({**params(), "kind": "NicConfig"},
     'HcaConfig field "kind": "NicConfig" is not accepted: HcaConfig'),
])
def test_a_bad_parameter_is_one_line_naming_the_field_and_what_is_accepted(
        parameters: Obj, message: str) -> None:
    with pytest.raises(HcaConfigError) as caught:
        hcaconfig.parse(parameters)
    assert str(caught.value) == message


def _entries(*raw: Obj, source: str = "FromClaim") -> tuple[ConfigEntry, ...]:
    return hcaconfig.read_entries([{"source": source, **e} for e in raw])


def test_later_entries_win_field_by_field_and_the_class_comes_first() -> None:
    claim = _entries(entry(params(trafficClass=1)), entry(params(serviceLevel=2)))
    klass = _entries(entry(params(trafficClass=9, gidIndex=3, managementDevices=True)),
                     source="FromClass")
    # The claim's entries listed first still apply after the class's.
    got = hcaconfig.merged(claim + klass, DRIVER, "hca")
    assert got == HcaConfig(gid_index=3, traffic_class=1, service_level=2,
                            management_devices=True)
    # The GID is one choice: a family asked later replaces an index asked before.
    later = _entries(entry(params(gidIndex=3)), entry(params(gidFamily="ipv4")))
    assert hcaconfig.merged(later, DRIVER, "hca") == HcaConfig(gid_family=GidFamily.IPV4)


def test_an_entry_applies_to_the_requests_it_names_and_their_subrequests() -> None:
    entries = _entries(entry(params(trafficClass=1)),
                       entry(params(trafficClass=2), ["hca"]),
                       entry(params(serviceLevel=5), ["hca/fast"]),
                       entry({"anything": "goes"}, driver="gpu.example.com"))
    assert hcaconfig.merged(entries, DRIVER, "other") == HcaConfig(traffic_class=1)
    assert hcaconfig.merged(entries, DRIVER, "hca") == HcaConfig(traffic_class=2)
    assert hcaconfig.merged(entries, DRIVER, "hca/any") == HcaConfig(traffic_class=2)
    assert hcaconfig.merged(entries, DRIVER, "hca/fast") == HcaConfig(
        traffic_class=2, service_level=5)


def test_a_bad_entry_of_this_driver_fails_every_request_and_others_are_left_alone() -> None:
    entries = _entries(entry(params(trafficClass=300), ["b"]))
    with pytest.raises(HcaConfigError, match="trafficClass"):
        hcaconfig.merged(entries, DRIVER, "a")
    assert hcaconfig.merged(entries, "other.example.com", "a").empty


def test_the_allocations_config_is_read_into_the_typed_claim() -> None:
    raw = {"metadata": {"namespace": "ns", "name": "c", "uid": "u1"},
           "status": {"allocation": {"devices": {
               "results": [_result("mlx5-0", "hca/any")],
               "config": [{"source": "FromClass", "requests": ["hca"],
                           "opaque": {"driver": DRIVER, "parameters": params(gidIndex=3)}},
                          {"source": "FromClaim",
                           "opaque": {"driver": DRIVER,
                                      "parameters": params(managementDevices=False)}}]}}}}
    claim = read_claim(raw)
    assert claim.device_configs(DRIVER) == {
        "mlx5-0": HcaConfig(gid_index=3, management_devices=False)}
    bad = read_claim({**raw, "status": {"allocation": {"devices": {
        "results": [_result("mlx5-0")], "config": [entry(params(gidIndex=999))]}}}})
    with pytest.raises(ClaimError, match='"gidIndex": 999'):
        bad.device_configs(DRIVER)


def test_the_settings_survive_the_checkpoint_and_the_specs_notes() -> None:
    asked = HcaConfig(gid_family=GidFamily.IPV6, traffic_class=106)
    claim = PreparedClaim("ns", "c", (PreparedDevice(("hca",), NODE, "mlx5-0", "mlx5_0",
                                                     ("x",), (), asked),))
    assert decode(encode({"u1": claim}), "cp")[0]["u1"].devices[0].config == asked
    plain = PreparedClaim("ns", "c", (PreparedDevice(("hca",), NODE, "mlx5-0", "mlx5_0",
                                                     ("x",)),))
    assert '"config"' not in encode({"u1": plain})  # as an older driver writes it
    spec = files.claim_spec(DRIVER, "u1", claim, {"mlx5-0": ()}, None, {"mlx5-0": []})
    back = files.claim_from_spec(spec, DRIVER)
    assert back is not None and back[1].devices[0].config == asked


# --- at Prepare ---------------------------------------------------------------------------

async def test_a_claims_gid_traffic_class_and_service_level_reach_nccl_and_ucx(
        stage: DraStage) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim("ns", "c", [_result("mlx5-1"), _result("mlx5-bond-0", "b")],
                              config=[entry(params(gidFamily="ipv4", trafficClass=106,
                                                   serviceLevel=3))])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    assert resp.claims[uid].error == ""
    # ncclEnv is off on this stage: what the claim asked for is set all the same.
    want = ["RDMA_HCA_DEVICES=mlx5_1,mlx5_bond_0", "NCCL_IB_GID_INDEX=3",
            "UCX_IB_GID_INDEX=3", "NCCL_IB_TC=106", "UCX_IB_TRAFFIC_CLASS=106",
            "NCCL_IB_SL=3", "UCX_IB_SL=3"]
    assert _env(stage, uid, 0) == want and _env(stage, uid, 1) == want


async def test_requests_asking_for_different_settings_get_their_own_env(
        stage: DraStage) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim(
        "ns", "c", [_result("mlx5-0", "hca/any"), _result("mlx5-1", "spare")],
        config=[entry(params(trafficClass=1)), entry(params(gidIndex=1), ["hca"])],
        class_config=[entry(params(trafficClass=9, serviceLevel=2))])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    assert resp.claims[uid].error == ""
    first, second = _env(stage, uid, 0), _env(stage, uid, 1)
    assert "NCCL_IB_GID_INDEX=1" in first and "UCX_IB_GID_INDEX=1" in first
    assert not any(v.startswith("NCCL_IB_GID_INDEX") for v in second)
    for env in (first, second):
        assert "NCCL_IB_TC=1" in env and "NCCL_IB_SL=2" in env
        assert env[0] == "RDMA_HCA_DEVICES=mlx5_0,mlx5_1"


async def test_management_nodes_follow_the_claim_on_infiniband(
        tmp_path: Path, api: FakeApiServer) -> None:
    node = sim.infiniband_node(tmp_path / "ib")
    async with DraStage(node, tmp_path / "s", api=api) as s:
        assert s.kubelet is not None and await s.registered()
        assert await s.until(lambda: bool(s.devices()))
        device = next(iter(s.devices()))

        async def nodes_of(name: str, config: list[Obj] | None) -> list[str]:
            uid = api.add_claim("ns", name, [_result(device)], config=config)
            resp = await s.kubelet.prepare(DRIVER, [("ns", uid, name)])  # type: ignore[union-attr]
            assert resp.claims[uid].error == ""
            edits = _spec(s, uid)["devices"][0]["containerEdits"]
            return [n["path"].rsplit("/", 1)[1] for n in edits["deviceNodes"]]

        uverbs = node.uverbs_name("mlx5_0")
        # Today's default: what the device plugin gives, umad on InfiniBand ports.
        assert await nodes_of("plain", None) == [uverbs, "umad0", "umad1"]
        assert await nodes_of("all", [entry(params(managementDevices=True))]) == [
            uverbs, "umad0", "issm0", "umad1", "issm1"]
        assert await nodes_of("none", [entry(params(managementDevices=False))]) == [uverbs]
        # InfiniBand needs no GID family; asking for one is said, not ignored.
        uid = api.add_claim("ns", "fam", [_result(device)],
                            config=[entry(params(gidFamily="ipv4"))])
        resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "fam")])
        assert resp.claims[uid].error.startswith(
            'HcaConfig field "gidFamily": "ipv4" is not accepted here: it chooses a RoCE v2 '
            "GID, and mlx5_0 has no RoCE port")


def _reserve(api: FakeApiServer, name: str, pod: str) -> None:
    with api.store.lock:
        for claim in api.cluster.resource_claims:
            if claim["metadata"]["name"] == name:
                claim["status"]["reservedFor"] = [
                    {"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]


async def test_a_bad_parameter_fails_prepare_with_the_field_and_the_event_says_the_fix(
        stage: DraStage) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim(
        "ml", "trainer-hca", [_result("mlx5-1")],
        config=[entry(params(trafficClass=300)),
                entry({"whatever": ["the", "other", "driver", "takes"]},
                      driver="gpu.example.com")])
    _reserve(stage.api, "trainer-hca", "trainer-0")
    resp = await stage.kubelet.prepare(DRIVER, [("ml", uid, "trainer-hca")])
    assert resp.claims[uid].error == (
        'HcaConfig field "trafficClass": 300 is not accepted: an integer 0-255')
    assert not (stage.cdi_dir / f"{DRIVER}-claim-{uid}.json").exists()
    assert await stage.until(lambda: bool(stage.api.events(kind="Pod")))
    (event,) = stage.api.events(kind="Pod")
    assert event["reason"] == "ClaimPrepareFailed"
    assert '"trafficClass": 300' in event["note"]
    assert "To fix: correct the HcaConfig parameters" in event["note"]
    assert "Parameters a claim passes (HcaConfig)" in event["note"]


async def test_a_gid_the_hcas_do_not_have_fails_prepare_naming_the_port(
        stage: DraStage) -> None:
    assert stage.kubelet is not None
    missing = stage.api.add_claim("ns", "v6", [_result("mlx5-1")],
                                  config=[entry(params(gidFamily="ipv6"))])
    no_index = stage.api.add_claim("ns", "i", [_result("mlx5-1")],
                                   config=[entry(params(gidIndex=200))])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", missing, "v6"), ("ns", no_index, "i")])
    assert resp.claims[missing].error == (
        'HcaConfig field "gidFamily": "ipv6" is not accepted here: mlx5_1:1 has no RoCE v2 '
        "GID with an ipv6 address (give its netdev one, or ask for the other family)")
    assert resp.claims[no_index].error.startswith(
        'HcaConfig field "gidIndex": 200 is not accepted here: mlx5_1:1 has no GID at '
        "index 200 (its GIDs: 0, 1, ")


async def test_a_device_two_requests_share_must_be_asked_the_same(
        stage: DraStage) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim("ns", "c", [_result("mlx5-1", "a"), _result("mlx5-1", "b")],
                              config=[entry(params(trafficClass=1), ["a"])])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    assert resp.claims[uid].error.startswith(
        'requests "a" and "b" got the same device mlx5-1 and their HcaConfig settings differ')


async def test_a_spec_lost_in_a_reboot_comes_back_with_the_claims_settings(
        stage: DraStage) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim("ns", "c", [_result("mlx5-2")],
                              config=[entry(params(trafficClass=40))])
    await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    before = _spec(stage, uid)
    (stage.cdi_dir / f"{DRIVER}-claim-{uid}.json").unlink()
    await stage.restart_driver()
    assert await stage.registered(2)
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    assert resp.claims[uid].error == ""
    assert _spec(stage, uid) == before
    assert "NCCL_IB_TC=40" in _env(stage, uid)


def test_the_fake_api_server_refuses_config_the_real_one_refuses() -> None:
    with FakeApiServer() as api:
        for config, why in (
                ([entry(params(), ["nope"])], "must be the name of a request"),
                ([entry(["not", "an", "object"])], "must be a valid JSON object"),
                ([entry(params(), driver="Not_A_Driver")], "RFC 1123 subdomain")):
            with pytest.raises(ValueError, match=why):
                api.add_claim("ns", "c", [_result("mlx5-0")], config=config)
        api.add_claim("ns", "ok", [_result("mlx5-0", "hca/any")],
                      config=[entry(params(), ["hca/any"]), entry(params(), ["hca"])])


# --- the env builder, on records discovery read -------------------------------------------

def _roce(tmp_path: Path, *hcas: sim.RoceHca) -> tuple[Any, ...]:
    node = sim.roce_node(tmp_path / "node", hcas)
    return discover_node(node.sysfs_root, node.dev_root).hcas


def test_a_family_asked_for_at_different_indices_is_left_to_nccl_per_port(
        tmp_path: Path) -> None:
    hcas = _roce(tmp_path, sim.RoceHca("mlx5_0", ipv4="10.0.0.11", ipv6="2001:db8::11"),
                 sim.RoceHca("mlx5_1", ipv4="10.0.1.11", ipv6="2001:db8:1::11",
                             ipv6_first=True))
    auto = EnvSettings(nccl=NcclEnv.AUTO)
    got = build(hcas, auto, HcaConfig(gid_family=GidFamily.IPV6)).as_dict()
    assert (got["NCCL_IB_ADDR_FAMILY"], got["NCCL_IB_ROCE_VERSION_NUM"]) == ("AF_INET6", "2")
    assert "NCCL_IB_GID_INDEX" not in got and "UCX_IB_GID_INDEX" not in got
    # An index asked for replaces the family the daemon chose.
    got = build(hcas, auto, HcaConfig(gid_index=1)).as_dict()
    assert got["NCCL_IB_GID_INDEX"] == got["UCX_IB_GID_INDEX"] == "1"
    assert "NCCL_IB_ADDR_FAMILY" not in got and "NCCL_IB_ROCE_VERSION_NUM" not in got
    # Nothing asked: exactly the daemon's env.
    assert build(hcas, auto, HcaConfig()) == build(hcas, auto)
