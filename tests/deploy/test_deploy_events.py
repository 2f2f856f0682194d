"""The chart's Events: the DRA driver's role may create and patch events (both APIs) and
nothing more of them; the device plugin gets a token only with events.enabled, whose one
role is exactly that; off by default, no token and no role."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from deploy_support import RenderFn
from test_deploy_chart import container, pod_spec

EVENTS_RULE = {"apiGroups": ["events.k8s.io", ""], "resources": ["events"],
               "verbs": ["create", "patch"]}
DRA_ALONE = {"dra.enabled": "true", "devicePlugin.enabled": "false"}


def roles(objs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {o["metadata"]["name"]: o["rules"] for o in objs if o["kind"] == "ClusterRole"}


def event_rules(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for rules in roles(objs).values() for r in rules if "events" in r["resources"]]


def env_of(objs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(objs)["env"] if "value" in e}


def test_the_dra_role_creates_and_patches_events_only(render: RenderFn) -> None:
    objs = render(DRA_ALONE)
    assert event_rules(objs) == [EVENTS_RULE]
    assert EVENTS_RULE in roles(objs)["ack-rdma-dp-dra"]
    assert "ack-rdma-dp-events" not in roles(objs)  # the DRA role has it already
    assert pod_spec(objs)["automountServiceAccountToken"] is True


def test_by_default_the_device_plugin_has_no_token_and_no_role(render: RenderFn) -> None:
    objs = render()
    assert roles(objs) == {}
    assert pod_spec(objs)["automountServiceAccountToken"] is False
    assert "RDMA_HCA_EVENTS_ENABLED" not in env_of(objs)


def test_events_enabled_mounts_a_token_whose_one_role_is_writing_events(
        render: RenderFn) -> None:
    objs = render({"events.enabled": "true"})
    assert roles(objs) == {"ack-rdma-dp-events": [EVENTS_RULE]}
    (binding,) = [o for o in objs if o["kind"] == "ClusterRoleBinding"]
    (sa,) = [o for o in objs if o["kind"] == "ServiceAccount"]
    assert binding["roleRef"]["name"] == "ack-rdma-dp-events"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    # The pod asks for the token; the account keeps it off for any other pod using it.
    assert pod_spec(objs)["automountServiceAccountToken"] is True
    assert sa["automountServiceAccountToken"] is False
    assert env_of(objs)["RDMA_HCA_EVENTS_ENABLED"] == "true"
    for obj in objs:
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            kubernetes_validate.validate(obj, kubernetes_validate.latest_version(),
                                         strict=True)
