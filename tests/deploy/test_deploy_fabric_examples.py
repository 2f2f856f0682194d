"""The fabric examples: the Kueue topology (whose CRDs the Kubernetes schema validator does
not know, so their structure is checked here against Kueue's documented v1beta2 shape),
and the DRA claim for HCAs on one of the given switches, allocated by the scheduler's rules
over HCAs carrying the switch attribute."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_support import REPO, RenderFn
from dra_allocator import Published, allocate

from rdma_hca.contract.fabric import FABRIC_BLOCK_LABEL, SWITCH, SWITCH_PORT
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import Mode

DRIVER = "rdma-hca.io"
KUEUE = "kueue.x-k8s.io/v1beta2"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / "examples" / name).read_text()) if d]


def test_the_kueue_example_has_the_fabric_block_above_the_host() -> None:
    docs = {d["kind"]: d for d in _docs("fabric-kueue-topology.yaml")}
    assert sorted(docs) == ["ClusterQueue", "Job", "LocalQueue", "ResourceFlavor", "Topology"]
    for kind in ("Topology", "ResourceFlavor", "ClusterQueue", "LocalQueue"):
        assert docs[kind]["apiVersion"] == KUEUE
    topology = docs["Topology"]
    # Kueue's rules: 1-16 levels, each nodeLabel once, the hostname only as the last one.
    assert topology["spec"] == {"levels": [{"nodeLabel": FABRIC_BLOCK_LABEL},
                                           {"nodeLabel": "kubernetes.io/hostname"}]}
    flavor = docs["ResourceFlavor"]
    assert flavor["spec"]["topologyName"] == topology["metadata"]["name"]
    queue = docs["ClusterQueue"]
    (group,) = queue["spec"]["resourceGroups"]
    assert [f["name"] for f in group["flavors"]] == [flavor["metadata"]["name"]]
    assert [r["name"] for r in group["flavors"][0]["resources"]] == group["coveredResources"]
    local = docs["LocalQueue"]
    assert local["spec"]["clusterQueue"] == queue["metadata"]["name"]


def test_the_kueue_job_requires_one_block_and_is_valid_kubernetes() -> None:
    (job,) = [d for d in _docs("fabric-kueue-topology.yaml") if d["kind"] == "Job"]
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    (local,) = [d for d in _docs("fabric-kueue-topology.yaml") if d["kind"] == "LocalQueue"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == local["metadata"]["name"]
    assert job["metadata"]["namespace"] == local["metadata"]["namespace"]
    assert job["spec"]["suspend"] is True
    template = job["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-required-topology": FABRIC_BLOCK_LABEL}
    pod = template["spec"]
    assert pod["hostNetwork"] is True
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["rdma/hca"] == 1
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]


# --- the DRA claim -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classes(render: RenderFn) -> dict[str, Any]:
    objs = render({"dra.enabled": "true", "devicePlugin.enabled": "false"})
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == "DeviceClass"}


def _claim() -> dict[str, Any]:
    (template,) = _docs("dra-same-switch.yaml")
    assert template["kind"] == "ResourceClaimTemplate"
    spec: dict[str, Any] = template["spec"]["spec"]
    return spec


def _hcas(tmp_path: Any, switches: list[str | None]) -> list[Published]:
    """The driver's HCA devices of a node, HCA i cabled to ``switches[i]`` (None: no
    neighbour heard, so no switch attribute)."""
    node = gpu_node(tmp_path / "n", hcas=len(switches), bond=False, gid_table_size=8)
    inventory = discover_node(node.sysfs_root, node.dev_root)
    offer = DeviceOffer.build(inventory.hcas, DRIVER, Mode.SHARED, True, inventory.rdma_cm)
    out = []
    for device in offer.devices:
        if device["name"].startswith("mlx5-"):
            switch = switches[int(device["name"].split("-")[1])]
            if switch is not None:
                device = {**device, "attributes": {
                    **device["attributes"], f"{DRIVER}/{SWITCH}": {"string": switch},
                    f"{DRIVER}/{SWITCH_PORT}": {"string": "Ethernet1/1"}}}
        out.append(Published(DRIVER, device))
    return out


def test_two_hcas_on_the_same_given_switch_are_allocated(
        tmp_path: Any, classes: dict[str, Any]) -> None:
    devices = _hcas(tmp_path, ["su1-leaf-9", "su1-leaf-2", "su1-leaf-1", "su1-leaf-2"])
    got = allocate(_claim(), classes, devices)
    assert got is not None, "the pod would stay Pending"
    assert sorted(d.name for d in got["hcas"]) == ["mlx5-1", "mlx5-3"]


def test_hcas_on_different_or_unnamed_switches_are_not_enough(
        tmp_path: Any, classes: dict[str, Any]) -> None:
    devices = _hcas(tmp_path, ["su1-leaf-1", "su1-leaf-2", "su1-leaf-9", None])
    assert allocate(_claim(), classes, devices) is None
