"""Registration through the plugin watcher, kubelet restarts, and stopping cleanly."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
from dra_support import DRIVER, NODE

from rdma_hca.daemon._proto.dra import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode


def _lists(api: FakeApiServer) -> int:
    return sum(1 for r in api.requests if r.method == "GET" and r.path.endswith("resourceslices"))


async def test_get_info_names_the_dra_services_and_the_endpoint(stage: DraStage) -> None:
    assert stage.driver is not None
    reg = os.path.join(stage.root, "plugins_registry", f"{DRIVER}-reg.sock")
    async with grpc.aio.insecure_channel("unix://" + reg) as channel:
        info = await pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
            pluginregistration_v1_pb2.InfoRequest(), timeout=5)
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == os.path.join(stage.root, "plugins", DRIVER, "dra.sock")
    assert os.path.exists(info.endpoint)
    assert list(info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert "v1.DRAResourceHealth" in info.supported_versions
    # A GetInfo alone (the kubelet's connection monitor) is not a registration.
    assert stage.driver.stats().registrations == 1


async def test_emulator_uses_v1_and_a_v1beta1_kubelet_works_too(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api) as s:
        assert s.kubelet is not None
        assert await s.registered()
        assert s.kubelet.plugins[DRIVER].service == "v1.DRAPlugin"
        s.kubelet.services = ("v1beta1.DRAPlugin",)
        await s.kubelet.restart()
        assert await s.registered(2)
        assert s.kubelet.plugins[DRIVER].service == "v1beta1.DRAPlugin"
        uid = api.add_claim("ns", "c", [{"request": "r", "driver": DRIVER, "pool": NODE,
                                         "device": "mlx5-0"}])
        resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])
        assert resp.claims[uid].error == ""
        assert [d.device_name for d in resp.claims[uid].devices] == ["mlx5-0"]


async def test_kubelet_restart_wipes_slices_and_the_driver_publishes_again(
        stage: DraStage) -> None:
    assert stage.kubelet is not None and stage.driver is not None
    before = stage.devices()
    await stage.kubelet.restart()  # removes the registration socket, deletes the slices
    assert await stage.registered(2)
    assert await stage.until(lambda: stage.devices() == before)
    assert stage.driver.stats().registrations == 2


async def test_registration_with_unchanged_slice_writes_nothing(stage: DraStage) -> None:
    """A kubelet restart that did not wipe the slice (it is still there) costs one list."""
    assert stage.kubelet is not None and stage.driver is not None
    driver = stage.driver
    stage.kubelet.api_url = None  # this kubelet deletes nothing at start
    assert await stage.until(lambda: driver.stats().idle)
    writes, lists = len(stage.api.writes()), _lists(stage.api)
    await stage.kubelet.restart()
    assert await stage.registered(2)
    assert await stage.until(lambda: _lists(stage.api) > lists)  # it looked at the server
    assert await stage.until(lambda: driver.stats().idle)
    assert len(stage.api.writes()) == writes


async def test_stop_removes_both_sockets_and_keeps_the_slice(stage: DraStage) -> None:
    assert stage.driver is not None and stage.kubelet is not None
    endpoint = stage.driver.config.endpoint
    reg = stage.driver.config.registration_socket
    await stage.stop_driver()
    assert not os.path.exists(endpoint) and not os.path.exists(reg)
    assert await stage.until(lambda: stage.kubelet is not None and DRIVER not in
                             stage.kubelet.plugins)
    assert stage.devices()  # the kubelet wipes it later, not the driver


async def test_driver_restart_registers_again_with_the_same_slice(stage: DraStage) -> None:
    before = stage.slices()
    await stage.restart_driver()
    assert await stage.registered(2)
    assert stage.driver is not None
    assert await stage.until(stage.driver.helper.publisher.published.is_set)
    assert stage.slices() == before  # same name, same generation, nothing rewritten
