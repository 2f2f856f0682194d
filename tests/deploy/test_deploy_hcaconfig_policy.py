"""The chart's HcaConfig admission policy, from `helm template`, evaluated with celpy: a
claim, template or DeviceClass whose parameters for this driver the driver would refuse is
refused at apply, with the driver's own line; everything else passes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from deploy_support import REPO, RenderFn
from vap_emulator import admit, failures

from rdma_hca.contract import hcaconfig
from rdma_hca.contract.hcaconfig import HcaConfigError

Obj = dict[str, Any]
DRIVER = "rdma-hca.io"
DRA = {"dra.enabled": "true", "devicePlugin.enabled": "false"}


def params(**fields: Any) -> Obj:
    return {"apiVersion": "rdma-hca.io/v1", "kind": "HcaConfig", **fields}


def entry(parameters: Any, driver: str = DRIVER, requests: list[str] | None = None) -> Obj:
    out: Obj = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        out["requests"] = requests
    return out


def claim(*config: Obj) -> Obj:
    devices: Obj = {"requests": [{"name": "hca", "exactly": {"deviceClassName": DRIVER}}]}
    if config:
        devices["config"] = list(config)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ml"}, "spec": {"devices": devices}}


def template(*config: Obj) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": "ml"}, "spec": {"spec": claim(*config)["spec"]}}


def device_class(*config: Obj) -> Obj:
    spec: Obj = {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}
    if config:
        spec["config"] = list(config)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "rdma-tuned"}, "spec": spec}


MAKERS = {"claim": claim, "template": template, "class": device_class}

BAD: list[Any] = [
    params(trafficClass=300), params(trafficClass=-1), params(trafficClass="106"),
    params(serviceLevel=16), params(serviceLevel=2.5), params(gidIndex=256),
    params(gidIndex=True), params(gidIndex=None), params(gidFamily="inet"),
    params(gidFamily=4), params(gidFamily={"v": 4}), params(managementDevices="true"),
    params(managementDevices=1), params(gidIndex=3, gidFamily="ipv6"),
    params(trafficclass=1), params(gid_index=1),
    {"kind": "HcaConfig"}, {"apiVersion": "rdma-hca.io/v1"},
    {**params(), "apiVersion": "rdma-hca.io/v1beta1"}, {**params(), "apiVersion": 1},
    {**params(), "kind": "GpuConfig"}, {**params(), "kind": ["HcaConfig"]},
]
GOOD: list[Obj] = [
    params(), params(gidIndex=0), params(gidIndex=255, trafficClass=0, serviceLevel=15),
    params(gidFamily="ipv4", trafficClass=106, serviceLevel=0, managementDevices=True),
    params(gidFamily="ipv6", managementDevices=False),
]


def _daemon_says(parameters: Any) -> str:
    with pytest.raises(HcaConfigError) as caught:
        hcaconfig.parse(parameters)
    return str(caught.value)


@pytest.fixture(scope="module")
def policies(render: RenderFn) -> list[Obj]:
    return [o for o in render(DRA)
            if o["kind"].startswith("ValidatingAdmissionPolicy")]


@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("parameters", BAD, ids=[str(i) for i in range(len(BAD))])
def test_a_bad_hcaconfig_is_refused_with_the_drivers_own_line(
        policies: list[Obj], kind: str, parameters: Any) -> None:
    outcome = admit(policies, MAKERS[kind](entry(parameters)))
    assert outcome.denied == [_daemon_says(parameters)]


@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("parameters", GOOD, ids=[str(i) for i in range(len(GOOD))])
def test_a_good_hcaconfig_is_admitted(policies: list[Obj], kind: str, parameters: Obj) -> None:
    hcaconfig.parse(parameters)  # the driver takes it too
    outcome = admit(policies, MAKERS[kind](entry(parameters, requests=["hca"])))
    assert outcome.admitted and not outcome.warnings


def test_the_first_bad_entry_of_this_driver_is_named_and_other_drivers_are_left_alone(
        policies: list[Obj]) -> None:
    obj = claim(entry({"anything": ["goes"]}, driver="gpu.example.com"),
                entry(params(trafficClass=1)), entry(params(serviceLevel=99)),
                entry(params(gidFamily="x")))
    assert admit(policies, obj).denied == [
        'HcaConfig field "serviceLevel": 99 is not accepted: an integer 0-15']
    assert admit(policies, claim(entry({"x": 1}, driver="gpu.example.com"))).admitted
    assert admit(policies, claim()).admitted and admit(policies, template()).admitted
    assert admit(policies, device_class()).admitted


def test_an_update_is_judged_only_when_the_spec_changes(policies: list[Obj]) -> None:
    old = claim(entry(params(trafficClass=300)))  # made before the chart was installed
    finalized = copy.deepcopy(old)
    finalized["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    assert admit(policies, finalized, "UPDATE", old).admitted
    fixed = device_class(entry(params(trafficClass=300)))
    broken = device_class(entry(params(trafficClass=30)))
    assert admit(policies, fixed, "UPDATE", broken).denied == [
        'HcaConfig field "trafficClass": 300 is not accepted: an integer 0-255']
    assert admit(policies, broken, "UPDATE", fixed).admitted


def test_the_policy_uses_the_charts_driver_name(render: RenderFn) -> None:
    objects = [o for o in render({**DRA, "dra.driverName": "hca.example.com"})
               if o["kind"].startswith("ValidatingAdmissionPolicy")]
    assert admit(objects, claim(entry(params(trafficClass=300)))).admitted
    assert not admit(objects, claim(entry(params(trafficClass=300),
                                          driver="hca.example.com"))).admitted


def test_the_policy_is_rendered_with_dra_only(render: RenderFn, policies: list[Obj]) -> None:
    names = {o["metadata"]["name"] for o in policies}
    assert "ack-rdma-dp-dra-hcaconfig" in names
    assert not any(o["metadata"]["name"] == "ack-rdma-dp-dra-hcaconfig"
                   for o in render() if o["kind"].startswith("ValidatingAdmissionPolicy"))
    (policy,) = [o for o in policies if o["metadata"]["name"] == "ack-rdma-dp-dra-hcaconfig"
                 and o["kind"] == "ValidatingAdmissionPolicy"]
    assert all(v.get("message") for v in policy["spec"]["validations"])
    # Pods and slices are not this policy's.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}
    assert failures(policy, pod) is None


def test_the_example_is_admitted(policies: list[Obj]) -> None:
    docs = [d for d in yaml.safe_load_all(
        (REPO / "examples" / "dra-hcaconfig.yaml").read_text()) if d]
    judged = [d for d in docs if d["kind"] in MAKERS_KINDS]
    assert judged
    for doc in judged:
        assert admit(policies, doc).admitted, doc["metadata"]["name"]


MAKERS_KINDS = ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass")
