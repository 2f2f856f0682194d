"""The fake API server's Node patches: merge patches only, labels and annotations refused
as the real server refuses them, a resourceVersion in the patch a precondition, the
status left alone."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.kube.cluster import TOKEN

MERGE = "application/merge-patch+json"


def patch(api: FakeApiServer, body: Any, content_type: str = MERGE,
          node: str = "n1") -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(api.url + f"/api/v1/nodes/{node}", method="PATCH",
                                 data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {TOKEN}",
                                          "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def node(api: FakeApiServer) -> dict[str, Any]:
    api.add_node("n1")
    with api.store.lock:
        meta = api.cluster.nodes[0]["metadata"]
        meta["labels"] = {"kubernetes.io/hostname": "n1"}
        api.cluster.nodes[0]["status"] = {"capacity": {"cpu": "8"}}
    return api.node("n1")


def test_a_merge_patch_adds_and_removes_keys_and_keeps_the_rest(
        api: FakeApiServer, node: dict[str, Any]) -> None:
    code, got = patch(api, {"metadata": {"labels": {"rdma-hca.io/fabric-block": "fb-0a1b2c"},
                                         "annotations": {"a.io/x": "1"}}})
    assert code == 200
    assert got["metadata"]["labels"] == {"kubernetes.io/hostname": "n1",
                                         "rdma-hca.io/fabric-block": "fb-0a1b2c"}
    assert got["metadata"]["resourceVersion"] != node["metadata"]["resourceVersion"]
    code, got = patch(api, {"metadata": {"labels": {"rdma-hca.io/fabric-block": None},
                                         "annotations": {"a.io/x": None}}})
    assert code == 200
    assert got["metadata"]["labels"] == {"kubernetes.io/hostname": "n1"}
    assert "annotations" not in got["metadata"]
    assert api.node("n1") == got


def test_a_patch_that_changes_nothing_keeps_the_resource_version(
        api: FakeApiServer, node: dict[str, Any]) -> None:
    code, got = patch(api, {"metadata": {"labels": {"kubernetes.io/hostname": "n1"}}})
    assert code == 200 and got["metadata"]["resourceVersion"] == \
        node["metadata"]["resourceVersion"]


def test_the_status_is_not_written_through_the_object(
        api: FakeApiServer, node: dict[str, Any]) -> None:
    code, got = patch(api, {"status": {"capacity": {"cpu": "1"}}})
    assert code == 200 and got["status"] == {"capacity": {"cpu": "8"}}


@pytest.mark.parametrize(("labels", "says"), [
    ({"rdma-hca.io/fabric-block": "x" * 64}, "must be no more than 63 characters"),
    ({"rdma-hca.io/fabric-block": "-fb"}, "must start and end with an alphanumeric"),
    ({"rdma-hca.io/fabric-block": "fb/1"}, "a valid label must be an empty string"),
    ({"Bad_Prefix/x": "1"}, "prefix part a lowercase RFC 1123 subdomain"),
    ({"rdma-hca.io/" + "n" * 64: "1"}, "name part must be no more than 63"),
])
def test_bad_labels_are_refused_with_the_field(
        api: FakeApiServer, node: dict[str, Any], labels: dict[str, str], says: str) -> None:
    code, got = patch(api, {"metadata": {"labels": labels}})
    assert code == 422 and got["reason"] == "Invalid"
    assert "metadata.labels: Invalid value" in got["message"] and says in got["message"]
    assert api.node("n1") == node


def test_annotations_over_256_kib_are_refused(api: FakeApiServer,
                                             node: dict[str, Any]) -> None:
    code, got = patch(api, {"metadata": {"annotations": {"a.io/big": "x" * (256 * 1024)}}})
    assert code == 422 and "metadata.annotations: Too long" in got["message"]
    code, _ = patch(api, {"metadata": {"annotations": {"a.io/big": "x" * (255 * 1024)}}})
    assert code == 200


def test_a_stale_resource_version_is_a_conflict(api: FakeApiServer,
                                                node: dict[str, Any]) -> None:
    rv = node["metadata"]["resourceVersion"]
    api.touch("nodes", "", "n1")
    code, got = patch(api, {"metadata": {"resourceVersion": rv, "labels": {"a.io/x": "1"}}})
    assert code == 409 and got["reason"] == "Conflict"
    fresh = api.node("n1")["metadata"]["resourceVersion"]
    code, _ = patch(api, {"metadata": {"resourceVersion": fresh, "labels": {"a.io/x": "1"}}})
    assert code == 200


@pytest.mark.parametrize("field", ["name", "uid"])
def test_identity_is_immutable(api: FakeApiServer, node: dict[str, Any], field: str) -> None:
    code, got = patch(api, {"metadata": {field: "other"}})
    assert code == 422 and f"metadata.{field}" in got["message"]


def test_only_merge_patches_are_taken(api: FakeApiServer, node: dict[str, Any]) -> None:
    code, got = patch(api, {"metadata": {"labels": {"a.io/x": "1"}}}, "application/json")
    assert code == 415 and "application/merge-patch+json" in got["message"]


def test_a_missing_node_and_a_forbidden_patch(api: FakeApiServer,
                                              node: dict[str, Any]) -> None:
    code, _ = patch(api, {"metadata": {}}, node="n9")
    assert code == 404
    api.cluster.forbidden.add("nodes")
    code, got = patch(api, {"metadata": {}})
    assert code == 403 and 'cannot patch resource "nodes"' in got["message"]
