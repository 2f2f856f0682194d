"""The chart's DRA objects, rendered by the real helm: classes, RBAC, the own-node policy."""

from __future__ import annotations

from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from celpy.adapter import json_to_cel
from deploy_support import CHART, RenderFn, ensure_helm, run_helm

SA = "system:serviceaccount:kube-system:ack-rdma-dp"
NODE_KEY = "authentication.kubernetes.io/node-name"
# DRA alone: beside the device plugin the two must select different HCAs.
ON = {"dra.enabled": "true", "devicePlugin.enabled": "false"}


def _dra_objects(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in {"DeviceClass", "ClusterRole", "ClusterRoleBinding"}
            or "dra" in o["metadata"]["name"]]


def test_nothing_of_dra_renders_unless_enabled(dra_render: RenderFn) -> None:
    assert _dra_objects(dra_render()) == []


def test_enabled_objects_are_valid_kubernetes(dra_render: RenderFn) -> None:
    objs = _dra_objects(dra_render(ON))
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objs) == [
        ("ClusterRole", "ack-rdma-dp-dra"),
        ("ClusterRoleBinding", "ack-rdma-dp-dra"),
        ("DeviceClass", "rdma-hca.io"),
        ("DeviceClass", "rdma-hca.io-extended"),
        ("ValidatingAdmissionPolicy", "ack-rdma-dp-dra-hcaconfig"),
        ("ValidatingAdmissionPolicy", "ack-rdma-dp-dra-own-node-slices"),
        ("ValidatingAdmissionPolicyBinding", "ack-rdma-dp-dra-hcaconfig"),
        ("ValidatingAdmissionPolicyBinding", "ack-rdma-dp-dra-own-node-slices"),
    ]
    for obj in objs:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def test_device_classes_select_the_driver(dra_render: RenderFn) -> None:
    objs = dra_render({**ON, "dra.driverName": "hca.example.com"})
    classes = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "DeviceClass"}
    # What each selects of the published devices: tests/deploy/test_deploy_dra.py.
    for spec in classes.values():
        (selector,) = spec["selectors"]
        assert selector["cel"]["expression"].startswith('device.driver == "hca.example.com" && ')
        assert 'device.attributes["hca.example.com"]' in selector["cel"]["expression"]
    assert classes["hca.example.com-extended"]["extendedResourceName"] == "rdma/hca"
    none = dra_render({**ON, "dra.extendedResourceName": ""})
    assert [o["metadata"]["name"] for o in none if o["kind"] == "DeviceClass"] == ["rdma-hca.io"]


def test_rbac_is_slices_its_node_its_claims_status_and_events_only(dra_render: RenderFn) -> None:
    objs = dra_render({**ON, "dra.driverName": "hca.example.com"})
    (role,) = [o for o in objs if o["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["list", "create", "update", "delete"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
         "verbs": ["get", "update", "patch"]},
        # 1.36: status.devices is authorized per driver, for the node the caller runs on
        # (patch: the driver applies it server-side; update: a pod of an older release).
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
         "verbs": ["associated-node:update", "associated-node:patch"],
         "resourceNames": ["hca.example.com"]},
        # Events on the Pod of a failed Prepare and on the Node: written, never read.
        {"apiGroups": ["events.k8s.io", ""], "resources": ["events"],
         "verbs": ["create", "patch"]},
    ]
    (binding,) = [o for o in objs if o["kind"] == "ClusterRoleBinding"]
    (sa,) = [o for o in objs if o["kind"] == "ServiceAccount"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "kube-system"}]


def test_a_bad_driver_name_is_refused_by_the_schema() -> None:
    result = run_helm(ensure_helm(), "template", "x", str(CHART),
                      "--set", "dra.enabled=true", "--set", "dra.driverName=Not_A_Name")
    assert result.returncode != 0
    assert "driverName" in result.stderr


# --- the admission policy, evaluated with a CEL engine ----------------------------------


def _admit(policy: dict[str, Any], operation: str, user: str, node: str | None,
           new: str | None, old: str | None) -> list[str] | None:
    """The policy's failed messages, or None when it does not apply (as the API server)."""
    env = celpy.Environment()

    def run(expr: str, act: dict[str, Any]) -> Any:
        return env.program(env.compile(expr)).evaluate(act)

    def slice_on(n: str | None) -> dict[str, Any] | None:
        return None if n is None else {"kind": "ResourceSlice",
                                       "spec": {"driver": "rdma-hca.io", "nodeName": n}}

    user_info: dict[str, Any] = {"username": user}
    if node is not None:
        user_info["extra"] = {NODE_KEY: [node]}
    spec = policy["spec"]
    act: dict[str, Any] = {
        "request": json_to_cel({"operation": operation, "userInfo": user_info}),
        "object": json_to_cel(slice_on(new)), "oldObject": json_to_cel(slice_on(old)),
    }
    if not all(run(c["expression"], act) for c in spec["matchConditions"]):
        return None
    variables: dict[Any, Any] = {}
    for v in spec["variables"]:
        act["variables"] = celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(v["name"])] = run(v["expression"], act)
    act["variables"] = celpy.celtypes.MapType(variables)
    return [str(run(v["messageExpression"], act)) if "messageExpression" in v else v["message"]
            for v in spec["validations"] if not run(v["expression"], act)]


@pytest.fixture(scope="module")
def policy(dra_render: RenderFn) -> dict[str, Any]:
    (found,) = [o for o in dra_render(ON) if o["kind"] == "ValidatingAdmissionPolicy"
                and o["metadata"]["name"].endswith("-dra-own-node-slices")]
    assert found["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == \
        ["resourceslices"]
    return found


@pytest.mark.parametrize(("operation", "new", "old"), [
    ("CREATE", "node-a", None), ("UPDATE", "node-a", "node-a"), ("DELETE", None, "node-a")])
def test_the_driver_may_write_its_own_nodes_slices(
        policy: dict[str, Any], operation: str, new: str | None, old: str | None) -> None:
    assert _admit(policy, operation, SA, "node-a", new, old) == []


@pytest.mark.parametrize(("operation", "new", "old"), [
    ("CREATE", "node-b", None), ("UPDATE", "node-b", "node-b"), ("UPDATE", "node-a", "node-b"),
    ("UPDATE", "node-b", "node-a"), ("DELETE", None, "node-b")])
def test_the_driver_may_not_write_another_nodes_slices(
        policy: dict[str, Any], operation: str, new: str | None, old: str | None) -> None:
    denied = _admit(policy, operation, SA, "node-a", new, old)
    assert denied and "the DRA driver on node node-a may write only" in denied[0]
    assert "node-b" in denied[0]


def test_a_token_without_a_node_is_refused(policy: dict[str, Any]) -> None:
    denied = _admit(policy, "CREATE", SA, None, "node-a", None)
    assert denied and "names no node" in denied[0]


def test_other_users_are_not_looked_at(policy: dict[str, Any]) -> None:
    assert _admit(policy, "DELETE", "system:node:node-a", None, None, "node-b") is None


# --- the examples speak of what the chart and the driver publish ------------------------


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((CHART.parents[2] / "examples" / name).read_text())
            if d]


def _cel_device(device: dict[str, Any], driver: str) -> Any:
    """A published device as DRA CEL sees it: attributes grouped by domain."""
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in device["attributes"].items():
        domain, _, name = key.rpartition("/")
        grouped.setdefault(domain or driver, {})[name] = next(iter(value.values()))
    return json_to_cel({"driver": driver, "attributes": grouped})


def test_claim_template_selector_matches_only_devices_with_a_port_up(
        dra_render: RenderFn) -> None:
    from rdma_hca.daemon.dra.devices import device
    from rdma_hca.node.model import Hca, LinkLayer, Port
    from rdma_hca.settings.model import Mode

    (tmpl,) = _docs("dra-resourceclaimtemplate.yaml")
    (request,) = tmpl["spec"]["spec"]["devices"]["requests"]
    (cls,) = [o for o in dra_render(ON) if o["kind"] == "DeviceClass"
              and o["metadata"]["name"] == request["exactly"]["deviceClassName"]]
    env = celpy.Environment()

    def selected(hca: Hca) -> bool:
        dev = _cel_device(device(hca, "d", "rdma-hca.io", Mode.SHARED, True), "rdma-hca.io")
        exprs = [s["cel"]["expression"] for s in cls["spec"]["selectors"]
                 + request["exactly"]["selectors"]]
        return all(bool(env.program(env.compile(e)).evaluate({"device": dev})) for e in exprs)

    def hca(state: str) -> Hca:
        port = Port(1, state, "LinkUp", LinkLayer.ETHERNET, "400 Gb/sec", 400.0, ("eth0",), ())
        return Hca("mlx5_0", "mlx5_core", None, None, None, None, "0000:0c:00.0", "0x15b3",
                   "0x1021", 0, (port,), None, pci_bus_id="0000:0c:00.0",
                   pcie_root="pci0000:08")

    assert selected(hca("ACTIVE")) is True
    assert selected(hca("DOWN")) is False


def test_gpu_and_hca_example_aligns_on_the_attribute_the_driver_publishes() -> None:
    template, job = _docs("dra-gpu-and-hca-job.yaml")
    devices = template["spec"]["spec"]["devices"]
    classes = {r["name"]: r["exactly"]["deviceClassName"] for r in devices["requests"]}
    assert classes == {"gpu": "gpu.nvidia.com", "hca": "rdma-hca.io"}
    assert devices["constraints"] == [{"requests": ["gpu", "hca"],
                                       "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    pod = job["spec"]["template"]["spec"]
    assert pod["resourceClaims"][0]["resourceClaimTemplateName"] == \
        template["metadata"]["name"]
    (seed_dra,) = [d for d in _docs("dra-hps-benchmark-job.yaml") if d["kind"] == "Job"]
    (c,) = seed_dra["spec"]["template"]["spec"]["containers"]
    assert c["resources"] == {"claims": [{"name": "devices"}]}
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]


def test_the_charts_classes_are_none_the_doctor_calls_a_trap(dra_render: RenderFn) -> None:
    from rdma_hca.tools.doctor.classes import trapping
    from rdma_hca.tools.doctor.draobjects import parse_device_class

    for values in (ON, {**ON, "dra.mode": "exclusive"}):
        classes = [parse_device_class(o) for o in dra_render(values) if o["kind"] == "DeviceClass"]
        assert len(classes) == 2
        assert trapping(classes, "rdma-hca.io") == []
