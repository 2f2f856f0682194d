"""The fake API server refuses what the real one refuses, and serves the claim status
subresource as the real one does."""

from __future__ import annotations

from typing import Any

import pytest

from rdma_hca import __version__
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.kube.apply import with_manager
from rdma_hca.kube.client import AGENT, ApiClient
from rdma_hca.kube.errors import ApiError, ConflictError

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DRIVER = "rdma-hca.io"


def device(i: int, *, attrs: int = 2, taint: bool = False) -> dict[str, Any]:
    d: dict[str, Any] = {"name": f"dev-{i}",
                         "attributes": {f"a{j}": {"int": j} for j in range(attrs)}}
    if taint:
        d["taints"] = [{"key": f"{DRIVER}/link-down", "value": "down", "effect": "NoSchedule"}]
    return d


def slice_of(devices: list[dict[str, Any]], node: str = "n1", name: str = "s1"
             ) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}


@pytest.mark.parametrize(("devices", "message"), [
    ([device(i) for i in range(129)], "Too many: 129: must have at most 128"),
    ([device(i, taint=i == 0) for i in range(65)], "Too many: 65: must have at most 64"),
    ([device(0, attrs=33)], "must not exceed 32"),
    ([device(0), device(0)], "Duplicate value"),
    ([{"name": "Dev_0"}], "lowercase RFC 1123 label"),
    ([{"name": "d", "attributes": {"x" * 33: {"int": 1}}}], "C identifier of at most 32"),
    ([{"name": "d", "attributes": {"s": {"string": "x" * 65}}}], "more than 64 bytes"),
])
async def test_slices_over_the_limits_are_refused(
        client: ApiClient, devices: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ApiError, match=message) as err:
        await client.request("POST", SLICES, body=slice_of(devices))
    assert err.value.status == 422


async def test_slices_at_the_limits_are_taken(client: ApiClient) -> None:
    full = await client.request("POST", SLICES, body=slice_of([device(i) for i in range(128)]))
    tainted = await client.request("POST", SLICES, body=slice_of(
        [device(i, attrs=32, taint=i == 0) for i in range(64)], name="s2"))
    assert len(full["spec"]["devices"]) == 128
    assert len(tainted["spec"]["devices"]) == 64
    assert tainted["metadata"]["resourceVersion"]


async def test_immutable_fields_and_resource_version_conflicts(client: ApiClient) -> None:
    created = await client.request("POST", SLICES, body=slice_of([device(0)]))
    moved = slice_of([device(0)], node="n2")
    moved["metadata"] = created["metadata"]
    with pytest.raises(ApiError, match=r"spec.nodeName: .*immutable"):
        await client.request("PUT", f"{SLICES}/s1", body=moved)
    changed = {**created, "spec": {**created["spec"], "devices": [device(1)]}}
    updated = await client.request("PUT", f"{SLICES}/s1", body=changed)
    assert updated["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    with pytest.raises(ConflictError, match="has been modified"):
        await client.request("PUT", f"{SLICES}/s1", body=changed)  # the old version


async def test_owner_references_are_kept_and_checked(client: ApiClient) -> None:
    owned = slice_of([device(0)])
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u-1"}]
    created = await client.request("POST", SLICES, body=owned)
    assert created["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    owned["metadata"] = {"name": "s2", "ownerReferences": [{"kind": "Node", "name": "n1"}]}
    with pytest.raises(ApiError, match=r"ownerReferences\[0\]\.apiVersion: Required"):
        await client.request("POST", SLICES, body=owned)


async def test_claim_status_is_written_only_through_its_subresource(
        api: FakeApiServer, client: ApiClient) -> None:
    api.add_claim("ns", "c", [{"request": "r", "driver": DRIVER, "pool": "n1",
                               "device": "dev-0"}])
    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    claim = await client.get(path)
    entry = {"driver": DRIVER, "pool": "n1", "device": "dev-0",
             "networkData": {"interfaceName": "eth1", "ips": ["10.0.0.1/24"]}}
    claim["status"]["devices"] = [entry]
    await client.request("PUT", path, body=claim)  # the main resource ignores status
    assert "devices" not in api.claim("ns", "c")["status"]
    claim = await client.get(path)
    claim["status"]["devices"] = [entry]
    written = await client.request("PUT", path + "/status", body=claim)
    assert written["status"]["devices"] == [entry]
    with pytest.raises(ConflictError):
        await client.request("PUT", path + "/status", body=claim)  # stale resourceVersion
    claim = await client.get(path)
    claim["status"]["devices"] = [{**entry, "device": "dev-9"}]
    with pytest.raises(ApiError, match="must be an allocated device"):
        await client.request("PUT", path + "/status", body=claim)


async def test_with_the_feature_gate_off_device_status_is_dropped(
        api: FakeApiServer, client: ApiClient) -> None:
    api.cluster.claim_device_status = False
    api.add_claim("ns", "c", [{"request": "r", "driver": DRIVER, "pool": "n1",
                               "device": "dev-0"}])
    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    claim = await client.get(path)
    claim["status"]["devices"] = [{"driver": DRIVER, "pool": "n1", "device": "dev-0"}]
    written = await client.request("PUT", path + "/status", body=claim)
    assert "devices" not in written["status"]


async def test_requests_are_counted_by_verb_and_path(
        api: FakeApiServer, client: ApiClient) -> None:
    await client.request("POST", SLICES, body=slice_of([device(0)]))
    await client.get(SLICES)
    await client.get(SLICES)
    assert api.counts()[("GET", SLICES)] == 2 and api.count("POST") == 1


async def test_v1beta2_serves_the_same_slices_and_v1beta1_is_not_served(
        client: ApiClient) -> None:
    await client.request("POST", SLICES, body=slice_of([device(0)]))
    beta = await client.get("/apis/resource.k8s.io/v1beta2/resourceslices")
    assert [(s["apiVersion"], s["metadata"]["name"]) for s in beta["items"]] == [
        ("resource.k8s.io/v1beta2", "s1")]
    with pytest.raises(ApiError, match="HTTP 404"):
        await client.get("/apis/resource.k8s.io/v1beta1/resourceslices")


async def test_a_write_is_recorded_under_its_field_manager_or_user_agent(
        api: FakeApiServer, client: ApiClient) -> None:
    # The client names itself: User-Agent and fieldManager, both ours.
    created = await client.request("POST", SLICES, body=slice_of([device(0)]))
    (entry,) = created["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"]) == (AGENT, "Update")
    assert f"rdma-hca/{__version__}" == AGENT
    (sent,) = [r for r in api.requests if r.method == "POST"]
    assert sent.user_agent == AGENT and sent.query["fieldManager"] == [AGENT]
    # Without a fieldManager the server takes the User-Agent's product, as upstream does;
    # a second writer adds its own entry, and a write that changes nothing adds none.
    changed = {**created, "spec": {**created["spec"], "devices": [device(1)]}}
    api.handle("PUT", f"{SLICES}/s1", with_manager("PUT", {}, "application/json",
                                                    "python-httpx2/0.1 (extra)"), changed)
    assert api.cluster.resource_slices is not None
    stored = api.cluster.resource_slices[0]
    assert [(m["manager"], m["operation"]) for m in stored["metadata"]["managedFields"]] == [
        (AGENT, "Update"), ("python-httpx2", "Update")]
    again = {**stored, "spec": {**stored["spec"]}}
    await client.request("PUT", f"{SLICES}/s1", body=again)
    assert len(api.cluster.resource_slices[0]["metadata"]["managedFields"]) == 2
    # A field manager the server refuses.
    with pytest.raises(ApiError, match="fieldManager: Too long") as err:
        await client.request("POST", SLICES, body=slice_of([device(0)], name="s2"),
                             params={"fieldManager": "m" * 129})
    assert err.value.status == 422
