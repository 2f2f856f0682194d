"""examples/: valid Kubernetes objects, and the guide's Job as the guide gives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_support import REPO, RenderFn
from dra_allocator import Published, allocate

from rdma_hca.contract.dra import BANDWIDTH
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.kit.quantity import parse_quantity
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import Mode
from rdma_hca.tools.check import MIN_SHM_BYTES

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# resource.k8s.io/v1 (DRA) exists from Kubernetes 1.34 on.
DRA_VERSIONS = ("1.34.0", kubernetes_validate.latest_version())


def load(name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((REPO / "examples" / name).read_text()) if d]
    assert len(docs) == 1
    doc: dict[str, Any] = docs[0]
    return doc


def test_the_three_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "hps-benchmark-job.yaml", "hps-benchmark-job-non-hostnetwork.yaml",
        "rdma-check-job.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_valid_kubernetes(path: Any) -> None:
    for doc in (d for d in yaml.safe_load_all(path.read_text()) if d):
        if doc["apiVersion"].startswith("kueue.x-k8s.io/"):
            continue  # not Kubernetes' own: checked in test_deploy_fabric_examples.py
        for version in DRA_VERSIONS if path.name.startswith("dra-") else VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_hps_benchmark_is_the_guides_job() -> None:
    job = load("hps-benchmark-job.yaml")
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == (
        "batch/v1", "Job", "hps-benchmark")
    assert job["spec"]["parallelism"] == 1
    pod = job["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["restartPolicy"] == "Never"
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["volumes"] == [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]
    (c,) = pod["containers"]
    assert c["name"] == "hps-benchmark"
    assert c["command"] == ["sh", "-c", "python /workspace/wdl_8gpu_outbrain.py\n"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 8, "rdma/hca": 1}}
    assert c["workingDir"] == "/root"
    assert c["volumeMounts"] == [{"name": "shm", "mountPath": "/dev/shm"}]
    assert c["securityContext"] == {"capabilities": {"add": ["SYS_RESOURCE", "IPC_LOCK"]}}
    assert c["image"] and c["image"] != "****"


def test_non_hostnetwork_twin_differs_only_in_network_and_name() -> None:
    host = load("hps-benchmark-job.yaml")
    other = load("hps-benchmark-job-non-hostnetwork.yaml")
    assert "hostNetwork" not in other["spec"]["template"]["spec"]
    del host["spec"]["template"]["spec"]["hostNetwork"]
    assert other["spec"] == host["spec"]
    assert other["metadata"]["name"] != host["metadata"]["name"]


def test_check_job_runs_our_check_on_the_host_network() -> None:
    job = load("rdma-check-job.yaml")
    pod = job["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    (c,) = pod["containers"]
    assert c["command"] == ["rdma-hca", "check", "--nccl"]
    assert c["resources"]["limits"]["rdma/hca"] == 1
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
    chart = yaml.safe_load(
        (REPO / "deploy/helm/ack-rdma-device-plugin/values.yaml").read_text())
    app_version = yaml.safe_load(
        (REPO / "deploy/helm/ack-rdma-device-plugin/Chart.yaml").read_text())["appVersion"]
    assert c["image"] == f"{chart['image']['repository']}:{app_version}"


JOBS = ("hps-benchmark-job.yaml", "hps-benchmark-job-non-hostnetwork.yaml",
        "dra-hps-benchmark-job.yaml", "dra-gpu-and-hca-job.yaml",
        "dra-bandwidth-gpu-job.yaml", "dra-firstavailable.yaml")


def _job(name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((REPO / "examples" / name).read_text()) if d]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    return job


@pytest.mark.parametrize("name", JOBS)
def test_example_jobs_run_the_nccl_check_first(name: str) -> None:
    """An init container checks, with the pod's HCA, that NCCL would use RDMA before the
    training starts: same HCA (resource or the claim's HCA request), IPC_LOCK, /dev/shm."""
    pod = _job(name)["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"] == ["rdma-hca", "check", "--nccl"]
    assert "IPC_LOCK" in init["securityContext"]["capabilities"]["add"]
    (main,) = pod["containers"]
    if "claims" in main["resources"]:
        (claim,) = main["resources"]["claims"]
        (template,) = [d for d in yaml.safe_load_all((REPO / "examples" / name).read_text())
                       if d and d["kind"] == "ResourceClaimTemplate"]
        requests = {r["name"]: r for r in template["spec"]["spec"]["devices"]["requests"]}
        (own,) = init["resources"]["claims"]
        assert own["name"] == claim["name"]
        request = requests[own["request"]]
        # A prioritized list's subrequests are all HCAs: the check sees whichever came.
        assert {r["deviceClassName"] for r in request.get("firstAvailable")
                or [request["exactly"]]} == {"rdma-hca.io"}
    else:
        assert init["resources"]["limits"] == {"rdma/hca": main["resources"]["limits"][
            "rdma/hca"]}
    assert [m for m in init.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"] == [
        m for m in main.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]


def test_check_job_gets_the_shm_the_check_asks_for() -> None:
    # The kubelet sizes a memory-backed emptyDir's tmpfs to the smaller of its sizeLimit and
    # the pod's memory limit; `rdma-hca check` fails /dev/shm below MIN_SHM_BYTES.
    pod = load("rdma-check-job.yaml")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    size = parse_quantity(volume["emptyDir"]["sizeLimit"]).value
    limit = parse_quantity(c["resources"]["limits"]["memory"]).value
    assert min(size, limit) >= MIN_SHM_BYTES


def test_install_doc_points_at_the_chart_readme_for_values() -> None:
    # The chart's README holds the table of every value (tested against values.yaml).
    doc = (REPO / "docs" / "install.md").read_text()
    assert "deploy/helm/ack-rdma-device-plugin/README.md" in doc


def _templates(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / "examples" / name).read_text())
            if d and d["kind"] == "ResourceClaimTemplate"]


def _bandwidth_asked(request: dict[str, Any]) -> int:
    from rdma_hca.contract.dra import BANDWIDTH
    from rdma_hca.daemon.dra.devices import BANDWIDTH_STEP

    asked = request["exactly"]["capacity"]["requests"]
    assert set(asked) == {f"rdma-hca.io/{BANDWIDTH}"}  # the name the driver publishes
    bits = int(parse_quantity(asked[f"rdma-hca.io/{BANDWIDTH}"]))
    assert bits > 0 and bits % BANDWIDTH_STEP == 0  # what the policy would round it to
    return bits


def test_the_bandwidth_template_asks_100g_of_one_hca() -> None:
    (template,) = _templates("dra-bandwidth-claimtemplate.yaml")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "rdma-hca.io"
    assert _bandwidth_asked(request) == 100 * 10**9


def test_the_bandwidth_job_puts_two_shares_under_the_gpus_root() -> None:
    (template,) = _templates("dra-bandwidth-gpu-job.yaml")
    devices = template["spec"]["spec"]["devices"]
    shares = [r for r in devices["requests"]
              if r["exactly"]["deviceClassName"] == "rdma-hca.io"]
    assert len(shares) == 2 and all(_bandwidth_asked(r) for r in shares)
    (gpu,) = [r["name"] for r in devices["requests"]
              if r["exactly"]["deviceClassName"] == "gpu.nvidia.com"]
    (root,) = [c for c in devices["constraints"]
               if c.get("matchAttribute") == "resource.kubernetes.io/pcieRoot"]
    assert set(root["requests"]) == {gpu, *(r["name"] for r in shares)}


def test_the_hcaconfig_example_passes_parameters_the_driver_takes() -> None:
    from rdma_hca.contract import hcaconfig

    (template,) = _templates("dra-hcaconfig.yaml")
    devices = template["spec"]["spec"]["devices"]
    (config,) = devices["config"]
    assert config["opaque"]["driver"] == "rdma-hca.io" and "requests" not in config
    asked = hcaconfig.parse(config["opaque"]["parameters"])
    assert asked == hcaconfig.HcaConfig(gid_family=hcaconfig.GidFamily.IPV4,
                                        traffic_class=106, management_devices=False)
    (job,) = [d for d in yaml.safe_load_all((REPO / "examples" / "dra-hcaconfig.yaml")
                                            .read_text()) if d and d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    (claim,) = pod["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    (c,) = pod["containers"]
    assert c["resources"]["claims"] == [{"name": claim["name"], "request": "hca"}]
    assert {r["name"] for r in devices["requests"]} == {"hca"}
# --- Kubernetes 1.36's DRA: prioritized lists and admin access, allocated as the scheduler
# would over what the driver publishes (dra_allocator), then prepared by the driver.

DRIVER = "rdma-hca.io"
HELD = f"{DRIVER}/{BANDWIDTH}"


@pytest.fixture(scope="module")
def classes(render: RenderFn) -> dict[str, Any]:
    objs = render({"dra.enabled": "true", "devicePlugin.enabled": "false"})
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == "DeviceClass"}


def _published(tmp_path: Path, mode: Mode = Mode.SHARED) -> list[Published]:
    node = gpu_node(tmp_path / "node", hcas=4)
    inventory = discover_node(node.sysfs_root, node.dev_root)
    offer = DeviceOffer.build(inventory.hcas, DRIVER, mode, True, inventory.rdma_cm)
    return [Published(DRIVER, d) for d in offer.devices]


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / "examples" / name).read_text()) if d]


def test_the_first_available_claim_takes_a_free_400g_port_else_any(
        classes: dict[str, Any], tmp_path: Path) -> None:
    (template,) = _templates("dra-firstavailable.yaml")
    claim = template["spec"]["spec"]
    devices = _published(tmp_path)
    got = allocate(claim, classes, devices)
    assert got is not None and list(got) == ["hca/free-400g"]
    assert got["hca/free-400g"][0].name == "mlx5-0"
    # 1G held of each HCA but the third: that one.
    some = {d.name: {HELD: 10**9} for d in devices if d.name != "mlx5-2"}
    got = allocate(claim, classes, devices, in_use=some)
    assert got is not None and [d.name for d in got["hca/free-400g"]] == ["mlx5-2"]
    # Some held of every HCA: any of them, holding nothing.
    every = {d.name: {HELD: 10**9} for d in devices}
    got = allocate(claim, classes, devices, in_use=every)
    assert got is not None and list(got) == ["hca/any"]


async def test_the_first_available_jobs_containers_get_the_hca_whichever_came(
        tmp_path: Path) -> None:
    """The Job's containers name ``request: hca``; the claim's device is hca/any."""
    (job,) = [d for d in _docs("dra-firstavailable.yaml") if d["kind"] == "Job"]
    spec = job["spec"]["template"]["spec"]
    node = gpu_node(tmp_path / "node", hcas=4, gid_table_size=8)
    async with DraStage(node, tmp_path / "stage") as stage:
        assert stage.kubelet is not None and await stage.registered()
        uid = stage.api.add_claim("team", "job-rdma-x1", [
            {"request": "hca/any", "driver": DRIVER, "pool": stage.node_name,
             "device": "mlx5-3"}])
        resp = await stage.kubelet.prepare(DRIVER, [("team", uid, "job-rdma-x1")])
        assert resp.claims[uid].error == ""
        pod = {"metadata": {"namespace": "team"}, "spec": spec, "status": {
            "resourceClaimStatuses": [{"name": "rdma", "resourceClaimName": "job-rdma-x1"}]}}
        for container in ("rdma-check", "train"):
            assert stage.kubelet.container_devices(pod, container) == [
                f"{DRIVER}/claim={uid}-mlx5-3"], container


@pytest.mark.parametrize("mode", [Mode.SHARED, Mode.EXCLUSIVE])
def test_the_fabric_monitor_is_given_every_hca_even_one_held_whole(
        classes: dict[str, Any], tmp_path: Path, mode: Mode) -> None:
    namespace, template, daemonset = _docs("dra-fabric-monitor.yaml")
    assert namespace["metadata"]["labels"] == {"resource.kubernetes.io/admin-access": "true"}
    assert template["metadata"]["namespace"] == daemonset["metadata"]["namespace"] \
        == namespace["metadata"]["name"]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["adminAccess"] is True
    devices = _published(tmp_path, mode)
    hcas = sorted(d.name for d in devices if d.attribute(f"{DRIVER}/kind") == ("string", "hca"))
    # Another claim holds mlx5-0 whole: all its bandwidth, or the exclusive device.
    held: dict[str, dict[str, int]] = {
        "mlx5-0": {HELD: 400 * 10**9} if mode is Mode.SHARED else {}}
    got = allocate(template["spec"]["spec"], classes, devices, in_use=held)
    assert got is not None and sorted(d.name for d in got["hcas"]) == hcas
    # Its container names the request, and so gets every one of them.
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": "hcas", "request": "hcas"}]
    # Without admin access: an exclusive HCA held whole is no one else's, so "every HCA"
    # cannot be had (a shared one is, with a share of 0, holding nothing either).
    plain = {"devices": {"requests": [{**request, "exactly": {
        k: v for k, v in request["exactly"].items() if k != "adminAccess"}}]}}
    if mode is Mode.EXCLUSIVE:
        assert allocate(plain, classes, devices, in_use=held) is None
