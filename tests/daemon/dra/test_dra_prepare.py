"""NodePrepareResources / NodeUnprepareResources: CDI specs, checkpoint, errors per claim."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.daemon.dra.driver import DraDriver
from rdma_hca.daemon.offer.env import EnvSettings
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kit.offloop import Stalled
from rdma_hca.settings.model import NcclEnv


def _result(device: str, request: str = "hca", pool: str = NODE,
            driver: str = DRIVER) -> dict[str, str]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


def _spec(stage: DraStage, uid: str) -> dict[str, Any]:
    path = stage.cdi_dir / f"{DRIVER}-claim-{uid}.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _cdi_files(stage: DraStage) -> list[str]:
    return sorted(os.listdir(stage.cdi_dir)) if stage.cdi_dir.exists() else []


def _claim_gets(api: FakeApiServer) -> int:
    return sum(1 for r in api.requests if r.method == "GET" and "/resourceclaims/" in r.path)


async def test_prepare_answers_cdi_ids_after_writing_the_spec(
        stage: DraStage, dra_node: SimNode) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim("team", "two", [_result("mlx5-0", "a"), _result("mlx5-1", "b")])
    resp = await stage.kubelet.prepare(DRIVER, [("team", uid, "two")])
    entry = resp.claims[uid]
    assert entry.error == ""
    assert [(list(d.request_names), d.pool_name, d.device_name) for d in entry.devices] == [
        (["a"], NODE, "mlx5-0"), (["b"], NODE, "mlx5-1")]
    ids = [i for d in entry.devices for i in d.cdi_device_ids]
    assert ids == [f"{DRIVER}/claim={uid}-mlx5-0", f"{DRIVER}/claim={uid}-mlx5-1"]
    spec = _spec(stage, uid)
    assert spec["kind"] == f"{DRIVER}/claim"
    assert [f"{spec['kind']}={d['name']}" for d in spec["devices"]] == ids
    dev0 = spec["devices"][0]["containerEdits"]
    assert dev0["deviceNodes"] == [{
        "path": f"/dev/infiniband/{dra_node.uverbs_name('mlx5_0')}",
        "hostPath": f"/dev/infiniband/{dra_node.uverbs_name('mlx5_0')}", "permissions": "rw"}]
    assert dev0["env"] == ["RDMA_HCA_DEVICES=mlx5_0,mlx5_1"]
    assert spec["containerEdits"]["deviceNodes"][0]["path"] == "/dev/infiniband/rdma_cm"
    # Written through a temp file in the same directory, none left behind.
    assert _cdi_files(stage) == [f"{DRIVER}-claim-{uid}.json"]
    assert stage.driver is not None
    checkpoint = json.loads(Path(stage.driver.config.checkpoint).read_text())
    assert checkpoint["claims"][uid]["name"] == "two"


async def test_nccl_env_is_set_like_allocate(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api,
                        env=EnvSettings(nccl=NcclEnv.AUTO)) as s:
        assert s.kubelet is not None and await s.registered()
        uid = api.add_claim("ns", "c", [_result("mlx5-1"), _result("mlx5-bond-0")])
        resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])
        assert resp.claims[uid].error == ""
        env = _spec(s, uid)["devices"][1]["containerEdits"]["env"]
        # Both ports carry their IPv4 RoCE v2 GID at index 3: one index fits every NCCL.
        assert env == ["RDMA_HCA_DEVICES=mlx5_1,mlx5_bond_0",
                       "NCCL_IB_HCA==mlx5_1:1,mlx5_bond_0:1", "NCCL_IB_GID_INDEX=3",
                       "UCX_NET_DEVICES=mlx5_1:1,mlx5_bond_0:1",
                       "NCCL_SOCKET_IFNAME==eth1,bond0"]
        # A claim for the one HCA beside a GPU gets exactly that HCA in its env.
        one = api.add_claim("ns", "one", [_result("mlx5-2")])
        resp = await s.kubelet.prepare(DRIVER, [("ns", one, "one")])
        assert resp.claims[one].error == ""
        env = _spec(s, one)["devices"][0]["containerEdits"]["env"]
        assert "NCCL_IB_HCA==mlx5_2:1" in env and "UCX_NET_DEVICES=mlx5_2:1" in env
        assert "RDMA_HCA_DEVICES=mlx5_2" in env


async def test_off_the_host_network_a_mixed_node_leaves_the_bond_out(
        tmp_path: Path, api: FakeApiServer) -> None:
    """The DRA path builds the same env: the bond without an IPv6 GID is left out."""
    mixed = sim.gpu_node(tmp_path / "mixed", ipv6=True, bond_ipv6=False, hcas=4,
                         gid_table_size=8)
    async with DraStage(mixed, tmp_path / "s", api=api,
                        env=EnvSettings(nccl=NcclEnv.AUTO, non_host_network=True)) as s:
        assert s.kubelet is not None and await s.registered()
        uid = api.add_claim("ns", "c", [_result("mlx5-1"), _result("mlx5-bond-0")])
        resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])
        assert resp.claims[uid].error == ""
        env = _spec(s, uid)["devices"][1]["containerEdits"]["env"]
        assert env == ["RDMA_HCA_DEVICES=mlx5_1,mlx5_bond_0", "NCCL_IB_HCA==mlx5_1:1",
                       "NCCL_IB_GID_INDEX=5", "UCX_NET_DEVICES=mlx5_1:1"]


async def test_prepare_and_unprepare_are_idempotent(stage: DraStage) -> None:
    assert stage.kubelet is not None
    uid = stage.api.add_claim("ns", "c", [_result("mlx5-2")])
    first = await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    gets = _claim_gets(stage.api)
    again = await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    assert again == first
    assert _claim_gets(stage.api) == gets  # answered from what was prepared
    for _ in range(2):
        resp = await stage.kubelet.unprepare(DRIVER, [("ns", uid, "c")])
        assert resp.claims[uid].error == ""
    assert _cdi_files(stage) == []
    # A claim this driver never saw unprepares cleanly too.
    resp = await stage.kubelet.unprepare(DRIVER, [("ns", "never-seen", "x")])
    assert resp.claims["never-seen"].error == ""


async def test_prepared_claims_survive_a_driver_restart(stage: DraStage) -> None:
    assert stage.kubelet is not None
    keep = stage.api.add_claim("ns", "keep", [_result("mlx5-0")])
    drop = stage.api.add_claim("ns", "drop", [_result("mlx5-3")])
    prepared = await stage.kubelet.prepare(DRIVER, [("ns", keep, "keep"), ("ns", drop, "drop")])
    stage.api.delete("resourceclaims", "ns", "keep")  # gone from the API: only the checkpoint
    await stage.restart_driver()
    assert await stage.registered(2)
    again = await stage.kubelet.prepare(DRIVER, [("ns", keep, "keep")])
    assert again.claims[keep] == prepared.claims[keep]
    resp = await stage.kubelet.unprepare(DRIVER, [("ns", drop, "drop")])
    assert resp.claims[drop].error == ""
    assert _cdi_files(stage) == [f"{DRIVER}-claim-{keep}.json"]
    assert stage.driver is not None and set(stage.driver.prepared) == {keep}


async def test_a_lost_cdi_spec_is_written_again(stage: DraStage) -> None:
    """/var/run is a tmpfs: after a reboot the kubelet prepares its claims again."""
    assert stage.kubelet is not None
    uid = stage.api.add_claim("ns", "c", [_result("mlx5-1")])
    await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    path = stage.cdi_dir / f"{DRIVER}-claim-{uid}.json"
    before = path.read_text()
    path.unlink()  # the reboot: the spec is gone, the checkpoint is not
    await stage.restart_driver()
    assert await stage.registered(2)
    # The status write the last instance left (a read of its own) goes first.
    await stage.statuses_written()
    gets = _claim_gets(stage.api)
    resp = await stage.kubelet.prepare(DRIVER, [("ns", uid, "c")])
    assert resp.claims[uid].error == ""
    assert path.read_text() == before
    assert _claim_gets(stage.api) == gets  # from the checkpoint, not the API server


async def test_a_claim_for_a_gone_hca_fails_alone(stage: DraStage, dra_node: SimNode) -> None:
    assert stage.kubelet is not None
    gone = stage.api.add_claim("ns", "gone", [_result("mlx5-1")])
    fine = stage.api.add_claim("ns", "fine", [_result("mlx5-0")])
    dra_node.remove_hca("mlx5_1")
    assert await stage.until(lambda: "mlx5-1" not in stage.devices())
    resp = await stage.kubelet.prepare(DRIVER, [("ns", gone, "gone"), ("ns", fine, "fine")])
    assert "mlx5-1" in resp.claims[gone].error and "no longer on this node" in \
        resp.claims[gone].error
    assert not resp.claims[gone].devices
    assert resp.claims[fine].error == ""
    assert not (stage.cdi_dir / f"{DRIVER}-claim-{gone}.json").exists()
    assert stage.driver is not None and gone not in stage.driver.prepared


async def test_claims_that_cannot_be_prepared_get_their_own_error(stage: DraStage) -> None:
    assert stage.kubelet is not None
    api = stage.api
    other_pool = api.add_claim("ns", "elsewhere", [_result("mlx5-0", pool="node-b")])
    other_driver = api.add_claim("ns", "gpu", [_result("gpu-0", driver="gpu.nvidia.com")])
    unknown_device = api.add_claim("ns", "ghost", [_result("mlx5-99")])
    replaced = api.add_claim("ns", "replaced", [_result("mlx5-0")])
    resp = await stage.kubelet.prepare(DRIVER, [
        ("ns", other_pool, "elsewhere"), ("ns", other_driver, "gpu"),
        ("ns", unknown_device, "ghost"), ("ns", "old-uid", "replaced"),
        ("ns", "no-such-uid", "missing")])
    errors = {uid: c.error for uid, c in resp.claims.items()}
    assert "pool node-b" in errors[other_pool]
    assert "no device of driver" in errors[other_driver]
    assert "mlx5-99" in errors[unknown_device]
    assert "deleted and created again" in errors["old-uid"]
    assert "not found" in errors["no-such-uid"]
    assert replaced not in errors
    assert _cdi_files(stage) == []


async def test_a_corrupt_checkpoint_is_moved_aside(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    work = tmp_path / "s"
    work.mkdir()
    (work / "checkpoint.json").write_text("{not json")
    async with DraStage(dra_node, work, api=api) as s:
        assert s.kubelet is not None and await s.registered()
        assert (work / "checkpoint.json.corrupt").read_text() == "{not json"
        uid = api.add_claim("ns", "c", [_result("mlx5-0")])
        resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])
        assert resp.claims[uid].error == ""
        assert uid in json.loads((work / "checkpoint.json").read_text())["claims"]


async def test_a_checkpoint_that_never_answers_stalls_the_start_on_a_thread_exit_ignores(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    work = tmp_path / "s"
    work.mkdir()
    fifo = work / "checkpoint.json"
    os.mkfifo(fifo)  # a read of it blocks in open(), as one on a hung filesystem does
    stage = DraStage(dra_node, work, api=api,
                     config=lambda c: dataclasses.replace(c, read_deadline=0.3))
    driver = DraDriver(stage.config())
    try:
        with pytest.raises(Stalled, match=r"checkpoint\.json"):
            await asyncio.wait_for(driver.start(), 10)
        assert driver.stats().file_stalls == 1  # counted with the daemon's other stalls

        def reading_the_checkpoint(frame: FrameType | None) -> bool:
            while frame is not None:
                if frame.f_code.co_name == "load_checkpoint":
                    return True
                frame = frame.f_back
            return False

        frames = sys._current_frames()
        stuck = [t for t in threading.enumerate()
                 if t.ident is not None and reading_the_checkpoint(frames.get(t.ident))]
        # Still hung, on a daemon thread: interpreter exit (and so SIGTERM) does not wait
        # for it, as it would for a thread of the loop's default executor.
        assert len(stuck) == 1 and stuck[0].daemon
    finally:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the read return
        await driver.stop()
