"""The DevicePlugin service answered directly over its socket, as any kubelet would call it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.daemon.deviceplugin.registration import socket_name
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.settings.model import Settings

R = "rdma/hca"


@pytest.fixture
async def stub(tmp_path: Path) -> AsyncIterator[api_pb2_grpc.DevicePluginStub]:
    node = gpu_node(tmp_path / "node", gid_table_size=8)
    plugin_dir = tmp_path / "dp"
    plugin_dir.mkdir()
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    d = Daemon(Settings(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                        kubelet_dir=str(plugin_dir), metrics_address="",
                        health_poll_seconds=0.05, resend_seconds=1), netlink=False)
    await d.start()
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
    channel = grpc.aio.insecure_channel("unix://" + str(plugin_dir / socket_name(R)))
    try:
        yield api_pb2_grpc.DevicePluginStub(channel)
    finally:
        await channel.close()
        await d.stop()
        await kubelet.stop()


async def test_pre_start_container_is_answered(stub: api_pb2_grpc.DevicePluginStub) -> None:
    resp = await stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["hca-0001"]))
    assert resp == api_pb2.PreStartContainerResponse()


async def test_preferred_allocation_in_shared_mode(stub: api_pb2_grpc.DevicePluginStub) -> None:
    req = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=["hca-0009", "hca-0002", "hca-0005"],
            must_include_deviceIDs=["hca-0005"], allocation_size=2)])
    resp = await stub.GetPreferredAllocation(req)
    assert list(resp.container_responses[0].deviceIDs) == ["hca-0005", "hca-0002"]


async def test_negative_allocation_size_is_refused(stub: api_pb2_grpc.DevicePluginStub) -> None:
    req = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["hca-0001"],
                                                    allocation_size=-1)])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetPreferredAllocation(req)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "allocation_size" in (err.value.details() or "")


async def test_container_request_without_ids_is_refused(
        stub: api_pb2_grpc.DevicePluginStub) -> None:
    req = api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=["hca-0001"]),
        api_pb2.ContainerAllocateRequest()])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(req)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "container request 1 names no device IDs" in (err.value.details() or "")


async def test_one_response_per_container(stub: api_pb2_grpc.DevicePluginStub) -> None:
    req = api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=[f"hca-{i:04d}"]) for i in range(3)])
    resp = await stub.Allocate(req)
    assert len(resp.container_responses) == 3
    assert len({tuple(c.envs.items()) for c in resp.container_responses}) == 1


async def test_list_is_sent_again_at_the_resend_interval(
        stub: api_pb2_grpc.DevicePluginStub) -> None:
    stream = stub.ListAndWatch(api_pb2.Empty())
    first = await stream.read()
    # Nothing changes on the node; the list comes again after resendSeconds (1 s here),
    # so a kubelet that missed an update catches up.
    again = await asyncio.wait_for(stream.read(), 10)
    assert again == first
    stream.cancel()


def test_an_allocation_record_becomes_its_message() -> None:
    from rdma_hca.daemon.deviceplugin.plugin import allocation_proto
    from rdma_hca.daemon.deviceplugin.pool import Allocation, DeviceSpec, Mount

    record = Allocation(
        hcas=("mlx5_0",), envs=(("RDMA_HCA_DEVICES", "mlx5_0"),),
        devices=(DeviceSpec("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0", "rw"),),
        mounts=(Mount("/etc/x", "/host/x", True),),
        cdi_devices=("rdma-hca.io/hca=mlx5_0",), numa_nodes=(1,))
    message = allocation_proto(record)
    assert dict(message.envs) == {"RDMA_HCA_DEVICES": "mlx5_0"}
    assert [(d.container_path, d.host_path, d.permissions) for d in message.devices] == [
        ("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0", "rw")]
    assert [(m.container_path, m.host_path, m.read_only) for m in message.mounts] == [
        ("/etc/x", "/host/x", True)]
    assert [c.name for c in message.cdi_devices] == ["rdma-hca.io/hca=mlx5_0"]
