"""Our name on our writes: every request carries the driver's User-Agent, every create and
update its field manager ``rdma-hca/<version>``; a claim's status is applied under the
driver's name, which outlasts a version change."""

from __future__ import annotations

from dra_support import DRIVER, NODE

from rdma_hca import __version__
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.kube.client import AGENT


async def test_slices_and_claim_status_carry_our_name(stage: DraStage) -> None:
    assert stage.kubelet is not None and f"rdma-hca/{__version__}" == AGENT
    uid = stage.api.add_claim("ns", "c", [
        {"request": "hca", "driver": DRIVER, "pool": NODE, "device": "mlx5-0"}])
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    assert resp.claims[uid].error == ""
    await stage.statuses_written()
    # What kubectl get --show-managed-fields shows: the slices are ours, by version.
    assert stage.api.cluster.resource_slices
    for s in stage.api.cluster.resource_slices:
        assert {m["manager"] for m in s["metadata"]["managedFields"]} == {AGENT}
    (applied,) = stage.api.claim("ns", "c")["metadata"]["managedFields"]
    assert (applied["manager"], applied["operation"]) == (DRIVER, "Apply")
    # And every request said who sent it; every write named its manager.
    writes = [r for r in stage.api.requests if r.method in ("POST", "PUT", "PATCH")]
    assert writes and all(r.user_agent == AGENT for r in stage.api.requests
                          if r.method != "DELETE")  # the kubelet's wipes are not ours
    assert {r.query["fieldManager"][0] for r in writes} == {AGENT, DRIVER}
    assert all(r.query["fieldManager"] == [DRIVER] for r in writes if r.path.endswith(
        "/status"))
