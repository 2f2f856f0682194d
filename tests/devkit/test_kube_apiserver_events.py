"""The fake API server's Events: both versions over one store, refused as the real server
refuses them (the field named), merge patches only, and discovery that can say 404."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.kube.cluster import TOKEN

V1 = "/apis/events.k8s.io/v1/namespaces/ml/events"
CORE = "/api/v1/namespaces/ml/events"


def call(api: FakeApiServer, method: str, path: str, body: Any = None,
         content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(api.url + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {TOKEN}",
                                          "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def v1_event(**changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "trainer-0.17f0", "namespace": "ml"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "rdma-hca.io/node-daemon", "reportingInstance": "n1",
        "action": "Prepare", "reason": "ClaimPrepareFailed", "type": "Warning",
        "regarding": {"kind": "Pod", "name": "trainer-0", "namespace": "ml"},
        "note": "device gone"}
    for key, value in changes.items():
        if value is None:
            event.pop(key, None)
        else:
            event[key] = value
    return event


@pytest.mark.parametrize(("changes", "field"), [
    ({"eventTime": None}, "eventTime: Required value"),
    ({"reportingController": None}, "reportingController: Required value"),
    ({"reportingInstance": "i" * 129}, "reportingInstance: Invalid value"),
    ({"reportingInstance": None}, "reportingInstance: Required value"),
    ({"action": None}, "action: Required value"),
    ({"action": "a" * 129}, "action: Invalid value"),
    ({"reason": "R" * 129}, "reason: Invalid value"),
    ({"reason": None}, "reason: Required value"),
    ({"type": "Error"}, "type: Invalid value"),
    ({"note": "n" * 1025}, "message: Invalid value"),
    ({"series": {"count": 1, "lastObservedTime": "2026-01-01T00:00:01.000000Z"}},
     "series.count"),
    ({"series": {"count": 2}}, "series.lastObservedTime: Required value"),
    ({"deprecatedCount": 3}, "count: Invalid value"),
    ({"regarding": {"kind": "Node", "name": "n1"}}, "involvedObject.namespace"),
    ({"metadata": {"name": "Not_A_Name", "namespace": "ml"}}, "metadata.name"),
])
def test_a_bad_v1_event_is_refused_with_the_field_named(
        api: FakeApiServer, changes: dict[str, Any], field: str) -> None:
    code, answer = call(api, "POST", V1, v1_event(**changes))
    assert code == 422, answer
    assert field in answer["message"]
    assert api.events() == []


def test_a_good_event_is_stored_and_seen_through_both_versions(api: FakeApiServer) -> None:
    code, made = call(api, "POST", V1, v1_event())
    assert code == 201, made
    code, core = call(api, "GET", CORE + "/trainer-0.17f0")
    assert code == 200
    assert core["involvedObject"]["name"] == "trainer-0" and core["message"] == "device gone"
    code, listed = call(api, "GET", "/apis/events.k8s.io/v1/events")
    assert [e["metadata"]["name"] for e in listed["items"]] == ["trainer-0.17f0"]


def test_a_series_is_merge_patched_and_the_rest_is_immutable(api: FakeApiServer) -> None:
    call(api, "POST", V1, v1_event())
    path = V1 + "/trainer-0.17f0"
    series = {"series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:05.000000Z"}}
    code, answer = call(api, "PATCH", path, series)
    assert code == 415, answer  # plain JSON is no patch
    code, answer = call(api, "PATCH", path, series, "application/merge-patch+json")
    assert code == 200 and answer["series"]["count"] == 2
    code, answer = call(api, "PATCH", path, {"note": "other"}, "application/merge-patch+json")
    assert code == 422 and "message: Invalid value" in answer["message"]
    assert "immutable" in answer["message"]


def test_core_v1_checks_the_namespace_only(api: FakeApiServer) -> None:
    node = {"metadata": {"name": "n1.17f0", "namespace": "ml"},
            "involvedObject": {"kind": "Node", "name": "n1"}, "reason": "HcaPortDown",
            "message": "down", "type": "Warning", "count": 1}
    code, answer = call(api, "POST", CORE, node)
    assert code == 422 and "involvedObject.namespace" in answer["message"]
    code, answer = call(api, "POST", "/api/v1/namespaces/default/events", node | {
        "metadata": {"name": "n1.17f0", "namespace": "default"}})
    assert code == 201, answer
    code, answer = call(api, "PATCH", "/api/v1/namespaces/default/events/n1.17f0",
                        {"count": 2}, "application/strategic-merge-patch+json")
    assert code == 200 and answer["count"] == 2


def test_discovery_says_404_when_events_k8s_io_is_not_served(api: FakeApiServer) -> None:
    code, answer = call(api, "GET", "/apis/events.k8s.io/v1")
    assert code == 200 and answer["resources"][0]["name"] == "events"
    api.cluster.events_v1 = False
    code, _ = call(api, "GET", "/apis/events.k8s.io/v1")
    assert code == 404
    code, _ = call(api, "POST", V1, v1_event())
    assert code == 404
