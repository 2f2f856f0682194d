"""Clients that are not the kubelet: oversized, malformed and huge-but-valid requests.

Each attack is bounded in count and runs over the plugin's unix socket; the daemon must
refuse cheaply, say so in one short line, and keep serving the kubelet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from lifecycle_support import R, plugin_stub, running, settings_for

from rdma_hca.daemon._proto import api_pb2
from rdma_hca.daemon.deviceplugin.bounds import MAX_RECEIVE_BYTES
from rdma_hca.daemon.deviceplugin.plugin import MAX_CONTAINERS, MAX_OTHER_STREAMS
from rdma_hca.daemon.deviceplugin.pool import exclusive_ids
from rdma_hca.daemon.deviceplugin.registration import socket_name
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.settings.model import Mode, PoolConfig


@pytest.fixture
async def daemon(node: SimNode, plugin_dir: Path,
                 kubelet: KubeletEmulator) -> AsyncIterator[Daemon]:
    async with running(settings_for(node, plugin_dir)) as d:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        yield d


def allocate_request(ids: list[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])


async def still_serves(kubelet: KubeletEmulator) -> None:
    resp = await kubelet.allocate(R, [["hca-0001"]])
    assert resp.container_responses[0].envs["RDMA_HCA_DEVICES"]
    assert kubelet.allocatable(R) == 1000


@pytest.mark.usefixtures("daemon")
async def test_an_oversized_request_is_refused_before_decoding(
        plugin_dir: Path, kubelet: KubeletEmulator, caplog: pytest.LogCaptureFixture) -> None:
    ids = [f"{i:063d}" for i in range(MAX_RECEIVE_BYTES // 60)]
    request = allocate_request(ids)
    assert request.ByteSize() > MAX_RECEIVE_BYTES
    async with plugin_stub(plugin_dir) as stub:
        for _ in range(3):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Allocate(request)
            assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert all(len(r.getMessage()) < 1000 for r in caplog.records)
    await still_serves(kubelet)


@pytest.mark.usefixtures("daemon")
async def test_the_biggest_real_request_fits(plugin_dir: Path) -> None:
    # GetPreferredAllocation with every ID of a 100,000-slot pool in both lists.
    ids = [f"hca-{i:05d}" for i in range(100_000)]
    request = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=ids, must_include_deviceIDs=ids[:100_000],
            allocation_size=100_000)])
    assert request.ByteSize() < MAX_RECEIVE_BYTES * 0.8
    async with plugin_stub(plugin_dir) as stub:
        resp = await stub.GetPreferredAllocation(request)
    assert len(resp.container_responses[0].deviceIDs) == 100_000


@pytest.mark.usefixtures("daemon")
async def test_malformed_requests_are_one_warning_not_tracebacks(
        plugin_dir: Path, kubelet: KubeletEmulator, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    target = "unix://" + str(plugin_dir / socket_name(R))
    async with grpc.aio.insecure_channel(target) as channel:
        for method in ("Allocate", "GetPreferredAllocation", "ListAndWatch"):
            path = f"/v1beta1.DevicePlugin/{method}"
            for _ in range(20):
                if method == "ListAndWatch":
                    call = channel.unary_stream(path)(b"\xff\xff\xff\xff")
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await call.read()
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await channel.unary_unary(path)(b"\x0a\xff\xff\xff\xff")
                assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "is not a valid v1beta1." in (err.value.details() or "")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "not a valid" in r.getMessage()]
    # One line per method and interval, however many arrive.
    assert len(warnings) == 3, [r.getMessage() for r in warnings]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    await still_serves(kubelet)


@pytest.mark.usefixtures("daemon")
async def test_unknown_ids_are_shown_as_a_short_prefix(
        plugin_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    ids = ["x" * 5000] + [f"nope-{i}" for i in range(20_000)]
    async with plugin_stub(plugin_dir) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Allocate(allocate_request(ids))
    details = err.value.details() or ""
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert len(details) < 600 and details.count("nope-") == 4
    assert "and 19996 more" in details
    assert all(len(r.getMessage()) < 800 for r in caplog.records)


@pytest.mark.usefixtures("daemon")
async def test_too_many_containers_are_refused(plugin_dir: Path) -> None:
    request = api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=["hca-0001"])
        for _ in range(MAX_CONTAINERS + 1)])
    async with plugin_stub(plugin_dir) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Allocate(request)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert f"at most {MAX_CONTAINERS}" in (err.value.details() or "")
        ok = await stub.Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=["hca-0001"])] * MAX_CONTAINERS))
        assert len(ok.container_responses) == MAX_CONTAINERS


async def test_20k_plus_20k_preferred_allocation_is_answered(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    settings = settings_for(node, plugin_dir, pools=(PoolConfig(mode=Mode.EXCLUSIVE),))
    async with running(settings) as d:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == len(node.hca_names))
        real = sorted(exclusive_ids(d.runtimes[0].view.hcas).values())
        available = real + [f"stray-{i:05d}" for i in range(20_000)]
        must = [f"stray-{i:05d}" for i in range(0, 40_000, 2)]
        request = api_pb2.PreferredAllocationRequest(container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must,
                allocation_size=20_002)])
        async with plugin_stub(plugin_dir) as stub:
            resp = await stub.GetPreferredAllocation(request)
        got = list(resp.container_responses[0].deviceIDs)
        assert got[:20_000] == must and len(got) == 20_002
        assert await kubelet.admit_pod(R, 2)



@pytest.mark.usefixtures("daemon")
async def test_other_clients_streams_are_capped(plugin_dir: Path,
                                                kubelet: KubeletEmulator) -> None:
    async with plugin_stub(plugin_dir) as stub:
        streams = [stub.ListAndWatch(api_pb2.Empty()) for _ in range(MAX_OTHER_STREAMS)]
        for s in streams:
            assert len((await s.read()).devices) == 1000
        extra = stub.ListAndWatch(api_pb2.Empty())
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await extra.read()
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        streams[0].cancel()
        again = stub.ListAndWatch(api_pb2.Empty())
        for _ in range(50):  # the cancelled stream's end reaches the server soon
            try:
                assert len((await again.read()).devices) == 1000
                break
            except grpc.aio.AioRpcError:
                again = stub.ListAndWatch(api_pb2.Empty())
                await asyncio.sleep(0.02)
        else:
            pytest.fail("a stream slot never came free")
        for s in [*streams, again]:
            s.cancel()
    assert kubelet.registrations(R) == 1
    await still_serves(kubelet)
