"""Server-side apply of a claim's status.devices on the fake API server, as the real one
does it: entries kept per field manager, a manager's omitted entries removed, conflicts
between managers, the status subresource alone, UIDs, the feature gate, validation."""

from __future__ import annotations

from typing import Any

import pytest

from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.kube.client import AGENT, ApiClient
from rdma_hca.kube.errors import ApiError, ConflictError, NotFoundError

DRA = "resource.k8s.io/v1"
OURS = "rdma-hca.io"
GPU = "gpu.example.com"
PATH = f"/apis/{DRA}/namespaces/ns/resourceclaims/c/status"


def add_claim(api: FakeApiServer, name: str = "c") -> str:
    return api.add_claim("ns", name, [
        {"request": "gpu", "driver": GPU, "pool": "n1", "device": "gpu-0"},
        {"request": "hca", "driver": OURS, "pool": "n1", "device": "dev-0"},
        {"request": "hca2", "driver": OURS, "pool": "n1", "device": "dev-1",
         "shareID": "3a4b7c1e-0000-4000-8000-000000000001"},
    ])


def entry(driver: str, device: str, **more: Any) -> dict[str, Any]:
    return {"driver": driver, "pool": "n1", "device": device, **more}


def body(*entries: dict[str, Any], uid: str | None = None, **more: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "c", "namespace": "ns", **({"uid": uid} if uid else {})}
    return {"apiVersion": DRA, "kind": "ResourceClaim", "metadata": meta,
            "status": {"devices": list(entries)}, **more}


SHARED = entry(OURS, "dev-1", shareID="3a4b7c1e-0000-4000-8000-000000000001")


async def test_each_manager_keeps_its_entries_and_loses_only_what_it_leaves_out(
        api: FakeApiServer, client: ApiClient) -> None:
    add_claim(api)
    await client.apply(PATH, body(entry(GPU, "gpu-0")), field_manager=GPU)
    await client.apply(PATH, body(entry(OURS, "dev-0"), SHARED), field_manager=OURS)
    devices = api.claim("ns", "c")["status"]["devices"]
    assert [d["device"] for d in devices] == ["gpu-0", "dev-0", "dev-1"]
    await client.apply(PATH, body(SHARED), field_manager=OURS)
    assert [d["device"] for d in api.claim("ns", "c")["status"]["devices"]] == [
        "gpu-0", "dev-1"]
    await client.apply(PATH, body(), field_manager=OURS)  # an Unprepare: none of ours
    assert api.claim("ns", "c")["status"]["devices"] == [entry(GPU, "gpu-0")]
    managers = {m["manager"]: m for m in api.claim("ns", "c")["metadata"]["managedFields"]}
    assert set(managers) == {GPU}
    assert managers[GPU]["operation"] == "Apply" and managers[GPU]["subresource"] == "status"


async def test_a_changed_entry_replaces_ours_in_place(
        api: FakeApiServer, client: ApiClient) -> None:
    add_claim(api)
    await client.apply(PATH, body(entry(OURS, "dev-0"), SHARED), field_manager=OURS)
    ready = {"type": "Ready", "status": "True", "reason": "Prepared", "message": "m",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}
    await client.apply(PATH, body(entry(OURS, "dev-0", conditions=[ready]), SHARED),
                       field_manager=OURS)
    devices = api.claim("ns", "c")["status"]["devices"]
    assert devices[0] == entry(OURS, "dev-0", conditions=[ready]) and devices[1] == SHARED


async def test_another_managers_entry_is_a_conflict_unless_forced(
        api: FakeApiServer, client: ApiClient) -> None:
    add_claim(api)
    await client.apply(PATH, body(entry(OURS, "dev-0")), field_manager="old-owner")
    changed = entry(OURS, "dev-0", networkData={"interfaceName": "eth1"})
    with pytest.raises(ConflictError, match='conflict with "old-owner"'):
        await client.apply(PATH, body(changed), field_manager=OURS, force=False)
    # The same value is no conflict: both own it.
    await client.apply(PATH, body(entry(OURS, "dev-0")), field_manager=OURS, force=False)
    await client.apply(PATH, body(changed), field_manager=OURS)  # forced: ours now
    await client.apply(PATH, body(), field_manager=OURS)
    assert "devices" not in api.claim("ns", "c")["status"]


async def test_only_status_devices_change_and_the_version_only_when_they_do(
        api: FakeApiServer, client: ApiClient) -> None:
    add_claim(api)
    before = api.claim("ns", "c")
    spec = {"devices": {"requests": []}}
    stored = await client.apply(PATH, body(entry(OURS, "dev-0"), spec=spec),
                                field_manager=OURS)
    assert stored["spec"] == before["spec"]
    assert stored["status"]["allocation"] == before["status"]["allocation"]
    rv = stored["metadata"]["resourceVersion"]
    assert rv != before["metadata"]["resourceVersion"]
    again = await client.apply(PATH, body(entry(OURS, "dev-0")), field_manager=OURS)
    assert again["metadata"]["resourceVersion"] == rv


async def test_uids_refuse_a_claim_gone_or_made_again(
        api: FakeApiServer, client: ApiClient) -> None:
    uid = add_claim(api)
    api.delete("resourceclaims", "ns", "c")
    with pytest.raises(ConflictError, match="uid mismatch"):
        await client.apply(PATH, body(entry(OURS, "dev-0"), uid=uid), field_manager=OURS)
    with pytest.raises(NotFoundError):  # the status subresource never creates
        await client.apply(PATH, body(entry(OURS, "dev-0")), field_manager=OURS)
    add_claim(api)  # made again under the name
    with pytest.raises(ApiError, match=r"metadata\.uid") as err:
        await client.apply(PATH, body(entry(OURS, "dev-0"), uid=uid), field_manager=OURS)
    assert err.value.status == 422
    assert "devices" not in api.claim("ns", "c")["status"]


@pytest.mark.parametrize(("applied", "message"), [
    ([entry(OURS, "dev-9")], "must be an allocated device"),
    ([entry(OURS, "dev-0"), entry(OURS, "dev-0")], "Duplicate value"),
    ([entry(OURS, "dev-0", networkData={"ips": [f"10.0.0.{i}/24" for i in range(17)]})],
     "must have at most 16"),
    ([entry(OURS, "dev-0", networkData={"interfaceName": "x" * 257})], "Too long"),
    ([entry(OURS, "dev-0", networkData={"ips": ["10.0.0.1"]})], "CIDR"),
])
async def test_what_put_refuses_apply_refuses(
        api: FakeApiServer, client: ApiClient, applied: list[dict[str, Any]],
        message: str) -> None:
    add_claim(api)
    with pytest.raises(ApiError, match=message) as err:
        await client.apply(PATH, body(*applied), field_manager=OURS)
    assert err.value.status == 422


async def test_an_apply_needs_a_manager_a_kind_and_its_content_type(
        api: FakeApiServer, client: ApiClient) -> None:
    add_claim(api)
    with pytest.raises(ApiError, match="fieldManager: Required") as err:
        await client.request("PATCH", PATH, body=body(), content_type="application/"
                             "apply-patch+yaml")
    assert err.value.status == 422
    with pytest.raises(ApiError, match="Kind"):
        await client.apply(PATH, {"metadata": {"name": "c"}}, field_manager=OURS)
    with pytest.raises(ApiError, match="does not match the name"):
        await client.apply(PATH, {**body(), "metadata": {"name": "d"}}, field_manager=OURS)
    with pytest.raises(ApiError, match="only application/apply-patch"):
        await client.request("PATCH", PATH, body=body())  # a merge patch


async def test_with_the_feature_gate_off_the_entries_are_dropped(
        api: FakeApiServer, client: ApiClient) -> None:
    api.cluster.claim_device_status = False
    add_claim(api)
    stored = await client.apply(PATH, body(entry(OURS, "dev-0")), field_manager=OURS)
    assert "devices" not in stored["status"]


async def test_an_update_that_removes_an_entry_takes_it_from_its_manager(
        api: FakeApiServer, client: ApiClient) -> None:
    add_claim(api)
    await client.apply(PATH, body(entry(OURS, "dev-0")), field_manager=OURS)
    claim = api.claim("ns", "c")
    claim["status"]["devices"] = [entry(GPU, "gpu-0")]
    await client.request("PUT", PATH, body=claim)
    # Our manager owns nothing now: applying nothing leaves the update's entry alone.
    await client.apply(PATH, body(), field_manager=OURS)
    assert api.claim("ns", "c")["status"]["devices"] == [entry(GPU, "gpu-0")]
    # What is left is the update's own record: its writer, named as the client names it.
    (update,) = api.claim("ns", "c")["metadata"]["managedFields"]
    assert (update["manager"], update["operation"], update["subresource"]) == (
        AGENT, "Update", "status")


async def test_apply_is_counted_as_its_own_verb(
        api: FakeApiServer, client: ApiClient) -> None:
    add_claim(api)
    await client.apply(PATH, body(entry(OURS, "dev-0")), field_manager=OURS)
    assert client.tally.requests[("resourceclaims/status", "apply", "200")] == 1
    (sent,) = [r for r in api.requests if r.method == "PATCH"]
    assert sent.query == {"fieldManager": [OURS], "force": ["true"]}
