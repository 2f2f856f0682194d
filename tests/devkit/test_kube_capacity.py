"""The fake API server checks consumable capacities and their request policies as
upstream's validateDevice / validateRequestPolicy* do, naming the field it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from rdma_hca.devkit.kube import validation
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.kube.client import ApiClient
from rdma_hca.kube.credentials import load_credentials
from rdma_hca.kube.errors import ApiError

DRIVER = "rdma-hca.io"
CAP = f"{DRIVER}/bandwidth"
WHERE = f"spec.devices[0].capacity[{CAP}]"


def _slice(capacity: dict[str, Any], *, shared: bool = True, attrs: int = 1
           ) -> dict[str, Any]:
    device: dict[str, Any] = {"name": "mlx5-0", "capacity": {CAP: capacity},
                              "attributes": {f"a{i}": {"int": i} for i in range(attrs)}}
    if shared:
        device["allowMultipleAllocations"] = True
    return {"metadata": {"name": "s"},
            "spec": {"driver": DRIVER, "nodeName": "n", "devices": [device],
                     "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1}}}


def _range(**bounds: str) -> dict[str, Any]:
    return {"value": "400G", "requestPolicy": {"default": bounds.pop("default", "0"),
                                               "validRange": bounds}}


@pytest.mark.parametrize("capacity", [
    {"value": "400G"},
    {"value": "146484375Ki"},
    _range(min="0", step="1G"),
    _range(min="0", max="400G", step="1G"),
    _range(default="10G", min="10G", step="5G"),
    _range(min="0"),
    {"value": "400G", "requestPolicy": {"default": "100G",
                                        "validValues": ["100G", "200G", "400G"]}},
    {"value": "400G", "requestPolicy": {"default": "0"}},
])
def test_policies_upstream_takes_are_taken(capacity: dict[str, Any]) -> None:
    validation.check_slice(_slice(capacity), taints_allowed=True)


@pytest.mark.parametrize(("capacity", "shared", "field", "why"), [
    ({"value": "lots"}, True, f"{WHERE}.value", "quantities must match"),
    ({}, True, f"{WHERE}.value", "Required value"),
    (_range(min="0", step="1G"), False, f"{WHERE}.requestPolicy",
     "Forbidden: allowMultipleAllocations must be true"),
    ({"value": "400G", "requestPolicy": {"default": "0", "validValues": ["0"],
                                         "validRange": {"min": "0"}}}, True,
     f"{WHERE}.requestPolicy", "exactly one policy can be specified"),
    ({"value": "400G", "requestPolicy": {"validRange": {"min": "0"}}}, True,
     f"{WHERE}.requestPolicy.default", "required when validRange is defined"),
    ({"value": "400G", "requestPolicy": {"validValues": ["0"]}}, True,
     f"{WHERE}.requestPolicy.default", "required when validValues is defined"),
    ({"value": "400G", "requestPolicy": {"default": "0", "validValues": [
        str(i) for i in range(11)]}}, True, f"{WHERE}.requestPolicy.validValues",
     "Too many: 11: must have at most 10"),
    ({"value": "400G", "requestPolicy": {"default": "0", "validValues": ["0", "2G", "1G"]}},
     True, f"{WHERE}.requestPolicy.validValues[2]", "sorted in ascending order"),
    ({"value": "400G", "requestPolicy": {"default": "0", "validValues": ["0", "800G"]}},
     True, f"{WHERE}.requestPolicy.validValues[1]", "larger than capacity value: 400G"),
    ({"value": "400G", "requestPolicy": {"default": "5G", "validValues": ["0", "1G"]}},
     True, f"{WHERE}.requestPolicy.validValues", "default value is not valid"),
    ({"value": "400G", "requestPolicy": {"default": "1G", "validValues": ["1G", "1G"]}},
     True, f"{WHERE}.requestPolicy.validValues[1]", "Duplicate value"),
    (_range(step="1G"), True, f"{WHERE}.requestPolicy.validRange.min", "Required value"),
    (_range(min="500G"), True, f"{WHERE}.requestPolicy.validRange.min",
     "min is larger than capacity value"),
    (_range(default="0", min="1G"), True, f"{WHERE}.requestPolicy.validRange.min",
     "default is less than min"),
    (_range(default="10G", min="10G", max="5G"), True, f"{WHERE}.requestPolicy.validRange.max",
     "min is larger than max"),
    (_range(min="0", max="800G"), True, f"{WHERE}.requestPolicy.validRange.max",
     "max is larger than capacity value"),
    (_range(default="10G", min="0", max="5G"), True, f"{WHERE}.requestPolicy.validRange.max",
     "default is more than max"),
    (_range(min="0", step="0"), True, f"{WHERE}.requestPolicy.validRange.step",
     "must be greater than zero"),
    (_range(min="0", step="500G"), True, f"{WHERE}.requestPolicy.validRange.step",
     "one step 500G is larger than capacity value"),
    (_range(default="1500M", min="0", step="1G"), True,
     f"{WHERE}.requestPolicy.validRange.step", "not a multiple of a given step (1G)"),
    (_range(min="0", max="399500M", step="1G"), True,
     f"{WHERE}.requestPolicy.validRange.step", "not a multiple of a given step"),
    (_range(min="0", step="1x"), True, f"{WHERE}.requestPolicy.validRange.step",
     "quantities must match"),
])
def test_bad_capacities_are_refused_naming_the_field(
        capacity: dict[str, Any], shared: bool, field: str, why: str) -> None:
    with pytest.raises(validation.Invalid) as err:
        validation.check_slice(_slice(capacity, shared=shared), taints_allowed=True)
    assert str(err.value).startswith(field + ":"), err.value
    assert why in str(err.value)


def test_capacities_count_toward_the_32_per_device() -> None:
    validation.check_slice(_slice({"value": "1"}, attrs=31), taints_allowed=True)
    with pytest.raises(validation.Invalid, match="must not exceed 32"):
        validation.check_slice(_slice({"value": "1"}, attrs=32), taints_allowed=True)
    with pytest.raises(validation.Invalid, match=r"capacity\[rdma-hca.io/Band-width\]"):
        validation.check_slice({**_slice({"value": "1"}), "spec": {
            **_slice({})["spec"], "devices": [{"name": "d", "capacity": {
                f"{DRIVER}/Band-width": {"value": "1"}}}]}}, taints_allowed=True)


async def test_over_http_the_answer_is_422_naming_the_field(
        api: FakeApiServer, tmp_path: Any) -> None:
    creds = load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")),
                             context=None, env={}, home=tmp_path)
    client = ApiClient(creds)
    try:
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                **_slice(_range(min="0", step="1G"), shared=False)}
        with pytest.raises(ApiError, match=r"requestPolicy: Forbidden") as err:
            await client.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body=body)
        assert err.value.status == 422
    finally:
        await client.close()
