"""fabric.lldp in the chart: exactly NET_RAW more for the daemon, a token that may get and
patch nodes, and an admission policy (evaluated with the emulator, on the rendered CEL)
that keeps each node's daemon to the fabric label and annotation of its own Node; off,
nothing of it renders."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest
from deploy_support import RenderFn
from vap_emulator import admit

from rdma_hca.contract.fabric import FABRIC_BLOCK_LABEL, NEIGHBOURS_ANNOTATION

ON = {"fabric.lldp": "true"}
SA = "system:serviceaccount:kube-system:ack-rdma-dp"
NODE_KEY = "authentication.kubernetes.io/node-name"
Obj = dict[str, Any]


def _key(o: Obj) -> tuple[str, str]:
    return o["kind"], o["metadata"]["name"]


def _by_key(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {_key(o): o for o in objs}


def _container(objs: list[Obj]) -> Obj:
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    container: Obj = ds["spec"]["template"]["spec"]["containers"][0]
    return container


def _without_fabric(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    """The objects with what fabric.lldp adds taken out again."""
    out = _by_key(copy.deepcopy(objs))
    for key in [k for k in out if "fabric" in k[1]]:
        del out[key]
    for obj in out.values():
        if obj["kind"] == "ConfigMap":
            # The daemon is told to listen: the one line of the config that changes.
            for name, text in obj["data"].items():
                assert "fabric:\n  lldp: true\n" in text, name
                obj["data"][name] = text.replace("fabric:\n  lldp: true\n", "")
        if obj["kind"] != "DaemonSet":
            continue
        pod = obj["spec"]["template"]["spec"]
        caps = pod["containers"][0]["securityContext"]["capabilities"]
        assert caps.pop("add") == ["NET_RAW"]
        pod["automountServiceAccountToken"] = "whatever the other switches say"
        obj["spec"]["template"]["metadata"]["annotations"].pop("checksum/config")
    return out


def _comparable(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    out = _by_key(copy.deepcopy(objs))
    for obj in out.values():
        if obj["kind"] == "DaemonSet":
            obj["spec"]["template"]["spec"]["automountServiceAccountToken"] = \
                "whatever the other switches say"
            obj["spec"]["template"]["metadata"]["annotations"].pop("checksum/config")
    return out


@pytest.mark.parametrize("others", [{}, {"dra.enabled": "true", "devicePlugin.enabled": "false"},
                                    {"events.enabled": "true"},
                                    {"mode": "exclusive", "metrics.enabled": "false"}])
def test_turning_it_on_adds_only_net_raw_the_token_and_the_fabric_objects(
        render: RenderFn, others: Mapping[str, str]) -> None:
    off = render({**others})
    on = render({**others, **ON})
    assert _without_fabric(on) == _comparable(off)
    assert _container(on)["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                                 "add": ["NET_RAW"]}
    (ds,) = [o for o in on if o["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert sorted(k for k in _by_key(on) if "fabric" in k[1]) == [
        ("ClusterRole", "ack-rdma-dp-fabric"), ("ClusterRoleBinding", "ack-rdma-dp-fabric"),
        ("ValidatingAdmissionPolicy", "ack-rdma-dp-fabric-own-node-label"),
        ("ValidatingAdmissionPolicyBinding", "ack-rdma-dp-fabric-own-node-label")]


def test_off_by_default_nothing_of_it_renders(render: RenderFn) -> None:
    default = render()
    assert default == render({"fabric.lldp": "false"})
    text = json.dumps(default)
    assert "NET_RAW" not in text and "fabric" not in text.replace("fabric trouble", "")
    assert not any(r.get("resources") == ["nodes"] and "patch" in r.get("verbs", [])
                   for o in default if o["kind"] == "ClusterRole" for r in o["rules"])
    (ds,) = [o for o in default if o["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert _container(default)["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_role_is_get_and_patch_nodes_only(render: RenderFn) -> None:
    objs = _by_key(render(ON))
    role = objs[("ClusterRole", "ack-rdma-dp-fabric")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                              "verbs": ["get", "patch"]}]
    binding = objs[("ClusterRoleBinding", "ack-rdma-dp-fabric")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ack-rdma-dp",
                                    "namespace": "kube-system"}]


def test_without_admission_policies_the_install_fails_and_says_why(render: RenderFn) -> None:
    with pytest.raises(AssertionError, match=r"fabric\.lldp needs ValidatingAdmissionPolicy"):
        render(ON, api_versions=())


# --- the admission policy ------------------------------------------------------------------


def node(name: str = "gpu-a1", labels: Mapping[str, str] | None = None,
         annotations: Mapping[str, str] | None = None, **extra: Any) -> Obj:
    meta: Obj = {"name": name, "uid": "u-" + name, "resourceVersion": "7",
                 "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                 "annotations": {"node.alpha.kubernetes.io/ttl": "0", **(annotations or {})}}
    meta.update(extra.pop("meta", {}))
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta,
            "spec": extra.pop("spec", {"podCIDR": "10.0.1.0/24"}),
            "status": {"capacity": {"cpu": "8"}}}


def daemon(on: str | None = "gpu-a1") -> Obj:
    return {"username": SA, **({"extra": {NODE_KEY: [on]}} if on else {})}


@pytest.fixture(scope="module")
def fabric_policies(render: RenderFn) -> list[Obj]:
    return [o for o in render(ON) if "fabric" in o["metadata"]["name"]]


BLOCK = {FABRIC_BLOCK_LABEL: "fb-0a1b2c3d4e"}
NEIGHBOURS = {NEIGHBOURS_ANNOTATION: '{"mlx5_0/1":{"chassisID":"b8:ce:f6:00:00:01"}}'}


@pytest.mark.parametrize(("old", "new"), [
    (node(), node(labels=BLOCK, annotations=NEIGHBOURS)),  # first write
    (node(labels=BLOCK, annotations=NEIGHBOURS),
     node(labels={FABRIC_BLOCK_LABEL: "fb-ffffffffff"}, annotations=NEIGHBOURS)),
    (node(labels=BLOCK, annotations=NEIGHBOURS), node()),  # both removed
    (node(labels=BLOCK), node(labels=BLOCK)),  # nothing changed
])
def test_the_daemon_may_write_its_label_and_annotation_on_its_own_node(
        fabric_policies: list[Obj], old: Obj, new: Obj) -> None:
    new["metadata"]["resourceVersion"] = "8"  # the server's fields change: not looked at
    new["metadata"]["managedFields"] = [{"manager": "rdma-hca", "operation": "Update"}]
    outcome = admit(fabric_policies, new, "UPDATE", old, user=daemon())
    assert outcome.admitted, outcome.denied


def test_another_nodes_label_is_refused(fabric_policies: list[Obj]) -> None:
    outcome = admit(fabric_policies, node("gpu-b7", labels=BLOCK), "UPDATE", node("gpu-b7"),
                    user=daemon("gpu-a1"))
    assert outcome.denied == ["the rdma-hca daemon on node gpu-a1 may only update Node "
                              "gpu-a1, not UPDATE Node gpu-b7"]


@pytest.mark.parametrize(("new", "says"), [
    (node(labels={**BLOCK, "node-role.kubernetes.io/control-plane": ""}),
     "not the label node-role.kubernetes.io/control-plane"),
    (node(labels={**BLOCK, "kubernetes.io/hostname": "evil"}),
     "not the label kubernetes.io/hostname"),
    (node(annotations={**NEIGHBOURS, "node.alpha.kubernetes.io/ttl": "60"}),
     "not the annotation node.alpha.kubernetes.io/ttl"),
    (node(annotations={"rdma-hca.io/other": "x"}), "not the annotation rdma-hca.io/other"),
])
def test_other_labels_and_annotations_of_its_node_are_refused(
        fabric_policies: list[Obj], new: Obj, says: str) -> None:
    outcome = admit(fabric_policies, new, "UPDATE", node(), user=daemon())
    assert len(outcome.denied) == 1 and says in outcome.denied[0]


def test_a_removed_label_is_refused_too(fabric_policies: list[Obj]) -> None:
    new = node()
    del new["metadata"]["labels"]["kubernetes.io/hostname"]
    outcome = admit(fabric_policies, new, "UPDATE", node(), user=daemon())
    assert outcome.denied and "not the label kubernetes.io/hostname" in outcome.denied[0]


@pytest.mark.parametrize(("new", "field"), [
    (node(labels=BLOCK, spec={"podCIDR": "10.0.1.0/24", "unschedulable": True}), "spec"),
    (node(spec={"podCIDR": "10.0.1.0/24", "taints": [
        {"key": "k", "effect": "NoSchedule"}]}), "spec"),
    (node(spec={}), "spec"),
    (node(meta={"finalizers": ["x.io/hold"]}), "metadata.finalizers"),
    (node(meta={"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p",
                                     "uid": "1"}]}), "metadata.ownerReferences"),
])
def test_no_other_field_of_its_node_may_change(fabric_policies: list[Obj], new: Obj,
                                               field: str) -> None:
    outcome = admit(fabric_policies, new, "UPDATE", node(), user=daemon())
    assert outcome.denied == ["the rdma-hca daemon may change no field of its Node but its "
                              f"fabric label and annotation, not {field}"]


def test_creating_a_node_is_refused(fabric_policies: list[Obj]) -> None:
    outcome = admit(fabric_policies, node(), "CREATE", user=daemon())
    assert outcome.denied and "may only update Node gpu-a1, not CREATE" in outcome.denied[0]


def test_a_token_without_a_node_is_refused(fabric_policies: list[Obj]) -> None:
    outcome = admit(fabric_policies, node(labels=BLOCK), "UPDATE", node(), user=daemon(None))
    assert outcome.denied and "names no node" in outcome.denied[0]


def test_others_are_not_looked_at(fabric_policies: list[Obj]) -> None:
    for user in ({"username": "system:node:gpu-a1"}, {"username": "kubernetes-admin"}):
        outcome = admit(fabric_policies, node("gpu-b7", labels={"x.io/y": "1"}), "UPDATE",
                        node("gpu-b7"), user=user)
        assert outcome.admitted and not outcome.warnings


def test_every_validation_has_a_static_message(fabric_policies: list[Obj]) -> None:
    (policy,) = [o for o in fabric_policies if o["kind"] == "ValidatingAdmissionPolicy"]
    assert all(v.get("message") and v.get("reason") == "Forbidden"
               for v in policy["spec"]["validations"])
