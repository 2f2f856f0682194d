"""The DRA sockets: 0600 at any umask, served again through the watch, health resent,
and two instances side by side as in a DaemonSet rolling update."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import stat
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from dra_support import DRIVER, NODE

from rdma_hca.daemon._proto.dra import (
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    health_v1beta1_pb2,
    health_v1beta1_pb2_grpc,
)
from rdma_hca.daemon.dra.claims import ClaimRef
from rdma_hca.daemon.dra.driver import DraDriver
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.kube.cluster import Recorded
from rdma_hca.devkit.sim.tree import SimNode


def _result(device: str) -> dict[str, str]:
    return {"request": "hca", "driver": DRIVER, "pool": NODE, "device": device}


def _claim_gets(api: FakeApiServer) -> int:
    return sum(1 for r in api.requests if r.method == "GET" and "/resourceclaims/" in r.path)


async def test_both_sockets_are_0600_at_umask_000(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    old = os.umask(0)
    try:
        async with DraStage(dra_node, tmp_path / "s", api=api) as s:
            assert s.driver is not None and await s.registered()
            for path in (s.driver.config.endpoint, s.driver.config.registration_socket):
                mode = os.stat(path).st_mode
                assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, path
    finally:
        os.umask(old)


async def test_a_removed_dra_socket_is_served_again_through_the_watch(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    # No backstop within the test: only the inotify watch can notice.
    tune = lambda c: dataclasses.replace(c, socket_check_seconds=3600.0)  # noqa: E731
    async with DraStage(dra_node, tmp_path / "s", api=api, config=tune) as s:
        assert s.driver is not None and s.kubelet is not None and await s.registered()
        serves = s.driver.helper.sockets.serves
        os.unlink(s.driver.config.endpoint)
        assert await s.registered(2)  # registration socket re-created: the kubelet re-dials
        assert s.driver.helper.sockets.serves == serves + 2
        assert os.path.exists(s.driver.config.endpoint)
        uid = api.add_claim("ns", "c", [_result("mlx5-0")])
        assert (await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])).claims[uid].error == ""


async def test_health_is_resent_within_the_kubelets_timeout_and_names_it(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    tune = lambda c: dataclasses.replace(c, health_resend_seconds=0.05)  # noqa: E731
    async with DraStage(dra_node, tmp_path / "s", api=api, config=tune) as s:
        assert s.driver is not None and await s.registered()
        board = s.driver.board
        version = board.version
        async with grpc.aio.insecure_channel("unix://" + s.driver.config.endpoint) as ch:
            stream = health_v1_pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
                health_v1_pb2.NodeWatchResourcesRequest())
            messages = []
            async for resp in stream:
                messages.append(resp)
                if len(messages) == 3:
                    break
            stream.cancel()
        assert board.version == version  # nothing changed: the two after the first are resends
        assert board.resends >= 2
        assert all(d.health_check_timeout_seconds == 30
                   for m in messages for d in m.devices) and messages[2].devices
        assert [d.device.device_name for d in messages[2].devices] == \
            [d.device.device_name for d in messages[0].devices]


async def _second_instance(stage: DraStage, pod_uid: str) -> DraDriver:
    assert stage.watcher is not None and stage.watcher.inventory is not None
    config = dataclasses.replace(stage.config(), pod_uid=pod_uid)
    driver = DraDriver(config)
    await driver.start(stage.watcher.inventory)
    return driver


async def test_two_instances_run_side_by_side_through_a_rolling_update(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rdma_hca.daemon.dra.kubeletplugin.sockets")
    async with DraStage(dra_node, tmp_path / "s", api=api, pod_uid="pod-old") as s:
        assert s.kubelet is not None and s.driver is not None and await s.registered()
        old = s.driver
        kept = api.add_claim("ns", "kept", [_result("mlx5-0")])
        assert (await s.kubelet.prepare(DRIVER, [("ns", kept, "kept")])).claims[kept].error == ""
        new = await _second_instance(s, "pod-new")
        try:
            assert await s.registered(2)
            assert s.kubelet.plugins[DRIVER].endpoint == new.config.endpoint
            # Neither took the other's sockets.
            assert old.helper.sockets.registered and old.config.endpoint != new.config.endpoint
            for path in (old.config.endpoint, old.config.registration_socket,
                         new.config.endpoint, new.config.registration_socket):
                assert os.path.exists(path), path
            added = api.add_claim("ns", "added", [_result("mlx5-1")])
            resp = await s.kubelet.prepare(DRIVER, [("ns", added, "added")])  # to the new one
            assert resp.claims[added].error == ""
            on_disk = json.loads(Path(new.config.checkpoint).read_text())["claims"]
            assert set(on_disk) == {kept, added}  # the old instance's claim is still there
            # The old pod goes: only its own sockets go with it.
            await s.stop_driver()
            assert not os.path.exists(old.config.endpoint)
            assert not os.path.exists(old.config.registration_socket)
            assert os.path.exists(new.config.endpoint)
            assert os.path.exists(new.config.registration_socket)
            assert s.kubelet.plugins[DRIVER].endpoint == new.config.endpoint
            gets = _claim_gets(api)
            again = await s.kubelet.prepare(DRIVER, [("ns", kept, "kept")])
            assert again.claims[kept].error == "" and _claim_gets(api) == gets
            assert (await s.kubelet.unprepare(DRIVER, [("ns", kept, "kept")])).claims[kept] \
                .error == ""
            on_disk = json.loads(Path(new.config.checkpoint).read_text())["claims"]
            assert set(on_disk) == {added}
        finally:
            await new.stop()
    churn = [r for r in caplog.records if "registering again" in r.getMessage()]
    assert churn == []


async def test_one_claim_is_prepared_by_one_instance_at_a_time(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    hold = threading.Event()
    reads = []

    def on_request(record: Recorded) -> None:
        if record.method == "GET" and "/resourceclaims/" in record.path:
            reads.append(record)
            hold.wait(30)

    async with DraStage(dra_node, tmp_path / "s", api=api, pod_uid="pod-a") as s:
        assert s.driver is not None and await s.registered()
        a = s.driver
        b = await _second_instance(s, "pod-b")
        try:
            uid = api.add_claim("ns", "c", [_result("mlx5-2")])
            ref = ClaimRef("ns", uid, "c")
            api.on_request = on_request
            first = asyncio.create_task(a.helper.prepare([ref]))
            assert await s.until(lambda: len(reads) == 1)
            second = asyncio.create_task(b.helper.prepare([ref]))
            assert await s.until(lambda: b.helper.locks.lock_waits > 0)  # on the claim's file lock
            hold.set()
            ra, rb = await first, await second
            assert ra[uid] == rb[uid] and ra[uid].error == ""
            assert len(reads) == 1  # the second instance found it in the shared checkpoint
        finally:
            hold.set()
            api.on_request = None
            await b.stop()


async def test_a_request_that_does_not_decode_or_is_too_big_is_refused_in_a_line(
        stage: DraStage, caplog: pytest.LogCaptureFixture) -> None:
    assert stage.driver is not None
    method = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
    with caplog.at_level(logging.DEBUG):
        async with grpc.aio.insecure_channel("unix://" + stage.driver.config.endpoint) as ch:
            call = ch.unary_unary(method)
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await call(b"\x0a\xff\xff\xff\xff", timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as big:
                await call(b"\x0a" + b"\x80\x80\x80\x01" + b"x" * (2 * 1024 * 1024), timeout=5)
    assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "is not a valid k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesRequest" in \
        str(bad.value.details())
    assert big.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    lines = [r for r in caplog.records if "NodePrepareResources refused" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert not [r for r in caplog.records if r.exc_info]  # no traceback from gRPC


async def test_when_the_new_instance_goes_first_the_kubelet_goes_back_to_the_old(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    """A rollout that fails: the new pod goes, the old one still serves, nothing is lost."""
    async with DraStage(dra_node, tmp_path / "s", api=api, pod_uid="pod-old") as s:
        assert s.kubelet is not None and s.driver is not None and await s.registered()
        new = await _second_instance(s, "pod-new")
        try:
            assert await s.registered(2)
            uid = api.add_claim("ns", "c", [_result("mlx5-3")])
            assert (await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])).claims[uid].error == ""
        finally:
            await new.stop()
        assert await s.until(lambda: s.kubelet is not None and s.kubelet.events.fallbacks
                             == [DRIVER])
        assert s.kubelet.plugins[DRIVER].endpoint == s.driver.config.endpoint
        assert os.path.exists(s.driver.config.endpoint)
        gets = _claim_gets(api)
        # The old instance reads the claim the new one prepared from the shared checkpoint.
        again = await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])
        assert again.claims[uid].error == "" and _claim_gets(api) == gets
        assert s.devices()  # the kubelet wiped nothing


async def test_a_claim_the_other_instance_unprepared_is_not_answered_from_memory(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api, pod_uid="pod-old") as s:
        assert s.kubelet is not None and s.driver is not None and await s.registered()
        old = s.driver
        uid = api.add_claim("ns", "c", [_result("mlx5-1")])
        assert (await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])).claims[uid].error == ""
        spec = s.cdi_dir / f"{DRIVER}-claim-{uid}.json"
        new = await _second_instance(s, "pod-new")
        try:
            assert await s.registered(2)
            seen = old.prepared.foreign_writes
            assert (await s.kubelet.unprepare(DRIVER, [("ns", uid, "c")])).claims[uid].error \
                == ""  # by the new instance
            assert not spec.exists()
            assert await s.until(lambda: old.prepared.foreign_writes > seen)
        finally:
            await new.stop()
        assert await s.until(lambda: s.kubelet is not None and s.kubelet.events.fallbacks
                             == [DRIVER])
        resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])  # the old one, again
        assert resp.claims[uid].error == ""
        assert spec.exists()  # prepared anew, not answered from what it once knew


@pytest.mark.parametrize("pb2, pb2_grpc", [
    (health_v1_pb2, health_v1_pb2_grpc), (health_v1beta1_pb2, health_v1beta1_pb2_grpc),
    (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc)], ids=["v1", "v1beta1", "v1alpha1"])
async def test_every_health_version_a_supported_kubelet_calls_is_served(
        stage: DraStage, pb2: Any, pb2_grpc: Any) -> None:
    assert stage.driver is not None
    async with grpc.aio.insecure_channel("unix://" + stage.driver.config.endpoint) as ch:
        stream = pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            pb2.NodeWatchResourcesRequest())
        first = await stream.read()
        stream.cancel()
    names = {d.device.device_name for d in first.devices}
    assert names == set(stage.devices())
    assert all(d.device.pool_name == NODE and d.health == pb2.HEALTHY for d in first.devices)
