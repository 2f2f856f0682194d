"""examples/dra-8gpu-paired-job.yaml: the guide's 8-GPU Job with each GPU paired with an HCA
under its PCIe root and no HCA twice, allocated by the scheduler's rules (dra_allocator)
over what this driver publishes for a simulated GPU node, the chart's DeviceClass and a GPU
slice as NVIDIA's DRA driver publishes it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import REPO, RenderFn
from dra_allocator import Allocation, Published, allocate

from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import Mode

EXAMPLE = REPO / "examples" / "dra-8gpu-paired-job.yaml"
DRIVER = "rdma-hca.io"
ROOT = "resource.kubernetes.io/pcieRoot"
BUS = "resource.kubernetes.io/pciBusID"
GPUS = [f"gpu-{i}" for i in range(8)]
HCAS = [f"hca-{i}" for i in range(8)]
# NVIDIA's DRA driver's class for whole GPUs.
GPU_CLASS = {"spec": {"selectors": [{"cel": {"expression":
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}


def _docs() -> tuple[dict[str, Any], dict[str, Any]]:
    template, job = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    assert (template["kind"], job["kind"]) == ("ResourceClaimTemplate", "Job")
    return template, job


def _claim() -> dict[str, Any]:
    spec: dict[str, Any] = _docs()[0]["spec"]["spec"]
    return spec


@pytest.fixture(scope="module")
def classes(render: RenderFn) -> dict[str, Any]:
    objs = render({"dra.enabled": "true", "devicePlugin.enabled": "false"})
    found = {o["metadata"]["name"]: o for o in objs if o["kind"] == "DeviceClass"}
    return {**found, "gpu.nvidia.com": GPU_CLASS}


def _hcas(node: SimNode) -> list[Published]:
    inventory = discover_node(node.sysfs_root, node.dev_root)
    offer = DeviceOffer.build(inventory.hcas, DRIVER, Mode.SHARED, True, inventory.rdma_cm)
    return [Published(DRIVER, d) for d in offer.devices]


def _gpus(node: SimNode, roots: int | None = None) -> list[Published]:
    """One GPU device per simulated GPU (of the first ``roots`` root complexes)."""
    by_root = sorted(node.gpus_by_root().items())[:roots]
    addresses = [(root, a) for root, found in by_root for a in found]
    return [Published("gpu.nvidia.com", {"name": f"gpu-{i}", "attributes": {
        "gpu.nvidia.com/type": {"string": "gpu"}, "gpu.nvidia.com/index": {"int": i},
        ROOT: {"string": root}, BUS: {"string": address}}})
        for i, (root, address) in enumerate(addresses)]


def _assert_paired(got: Allocation | None) -> None:
    assert got is not None, "the pod would stay Pending"
    for gpu, hca in zip(GPUS, HCAS, strict=True):
        (g,) = got[gpu]
        (h,) = got[hca]
        assert g.attribute(ROOT) == h.attribute(ROOT), (gpu, g.name, hca, h.name)
        assert h.attribute(f"{DRIVER}/kind") == ("string", "hca")
    assert len({got[h][0].name for h in HCAS}) == 8


def test_the_claim_is_16_requests_and_10_constraints() -> None:
    claim = _claim()["devices"]
    classes = {r["name"]: r["exactly"]["deviceClassName"] for r in claim["requests"]}
    assert classes == {**dict.fromkeys(GPUS, "gpu.nvidia.com"), **dict.fromkeys(HCAS, DRIVER)}
    assert all(r["exactly"].get("count", 1) == 1 for r in claim["requests"])
    constraints = claim["constraints"]
    assert len(constraints) == 10
    pairs = [c for c in constraints if c.get("matchAttribute") == ROOT]
    assert sorted(c["requests"] for c in pairs) == [[g, h] for g, h in zip(GPUS, HCAS, strict=True)]
    (distinct,) = [c for c in constraints if "distinctAttribute" in c]
    assert distinct == {"requests": HCAS, "distinctAttribute": BUS}
    (fabric,) = [c for c in constraints if c.get("matchAttribute") == f"{DRIVER}/linkLayer"]
    assert fabric["requests"] == HCAS


def test_the_job_checks_the_claims_hcas_and_trains_with_the_whole_claim() -> None:
    template, job = _docs()
    pod = job["spec"]["template"]["spec"]
    (ref,) = pod["resourceClaims"]
    assert ref["resourceClaimTemplateName"] == template["metadata"]["name"]
    (init,) = pod["initContainers"]
    assert init["command"] == ["rdma-hca", "check", "--nccl"]
    assert init["resources"]["claims"] == [{"name": ref["name"], "request": h} for h in HCAS]
    assert "IPC_LOCK" in init["securityContext"]["capabilities"]["add"]
    (main,) = pod["containers"]
    assert main["resources"] == {"claims": [{"name": ref["name"]}]}
    assert main["command"] == ["sh", "-c", "python /workspace/wdl_8gpu_outbrain.py\n"]
    assert {"SYS_RESOURCE", "IPC_LOCK"} <= set(main["securityContext"]["capabilities"]["add"])
    assert init["volumeMounts"] == main["volumeMounts"] == [
        {"name": "shm", "mountPath": "/dev/shm"}]
    assert pod["hostNetwork"] is True


def test_on_a_gpu_node_each_gpu_gets_its_own_hca_under_its_root(
        classes: dict[str, Any], tmp_path: Path) -> None:
    node = gpu_node(tmp_path / "n", hcas=8, gid_table_size=8)  # 2 GPUs, 2 HCAs per root
    _assert_paired(allocate(_claim(), classes, _hcas(node) + _gpus(node)))


def test_on_a_13_hca_node_the_pairs_stay_under_the_gpus_roots(
        classes: dict[str, Any], tmp_path: Path) -> None:
    """13 HCAs (12 and a bond) and the 8 GPUs on 4 of their root complexes."""
    node = gpu_node(tmp_path / "n", hcas=12, gid_table_size=8)
    hcas = _hcas(node)
    assert len([d for d in hcas if d.name != "all-hcas"]) == 13
    got = allocate(_claim(), classes, hcas + _gpus(node, roots=4))
    _assert_paired(got)
    assert got is not None
    gpu_roots = {got[g][0].attribute(ROOT) for g in GPUS}
    assert len(gpu_roots) == 4 and {got[h][0].attribute(ROOT) for h in HCAS} == gpu_roots


def test_without_the_distinct_constraint_two_gpus_would_share_an_hca(
        classes: dict[str, Any], tmp_path: Path) -> None:
    """Shared HCAs allow several allocations: only distinctAttribute keeps them apart."""
    node = gpu_node(tmp_path / "n", hcas=8, gid_table_size=8)
    claim = copy.deepcopy(_claim())
    claim["devices"]["constraints"] = [c for c in claim["devices"]["constraints"]
                                       if "distinctAttribute" not in c]
    got = allocate(claim, classes, _hcas(node) + _gpus(node))
    assert got is not None
    assert len({got[h][0].name for h in HCAS}) < 8


def test_two_gpus_under_a_root_with_one_hca_cannot_be_paired(
        classes: dict[str, Any], tmp_path: Path) -> None:
    """The example's first two pairs on a node whose two free GPUs share a root that has
    one HCA left: the pod stays Pending rather than sharing the HCA or leaving the root."""
    node = gpu_node(tmp_path / "n", hcas=8, gid_table_size=8)
    node.remove_hca("mlx5_1")
    keep = {"gpu-0", "gpu-1", "hca-0", "hca-1"}
    claim = copy.deepcopy(_claim())
    devices = claim["devices"]
    devices["requests"] = [r for r in devices["requests"] if r["name"] in keep]
    devices["constraints"] = [{**c, "requests": [r for r in c["requests"] if r in keep]}
                              for c in devices["constraints"] if set(c["requests"]) & keep]
    gpus = _gpus(node, roots=1)
    assert len(gpus) == 2
    assert allocate(claim, classes, _hcas(node) + gpus) is None
    node.add_hca(node.specs["mlx5_1"])
    got = allocate(claim, classes, _hcas(node) + gpus)
    assert got is not None and {got["hca-0"][0].name, got["hca-1"][0].name} == {
        "mlx5-0", "mlx5-1"}
