"""Which ListAndWatch stream's end makes the daemon register again: only the kubelet's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lifecycle_support import R, plugin_stub, running, settings_for

from rdma_hca.daemon._proto import api_pb2
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until


async def test_fifty_stray_streams_cause_no_registration(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    async with running(settings_for(node, plugin_dir)) as d:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        before = kubelet.registrations(R)
        async with plugin_stub(plugin_dir) as stub:
            for _ in range(50):
                call = stub.ListAndWatch(api_pb2.Empty())
                first = await asyncio.wait_for(call.read(), 10)
                assert len(first.devices) == 1000
                call.cancel()
        # Every stray stream has ended once only the kubelet's is left, and a stream's end
        # owes a registration in the same step, so a wrongly counted end shows now.
        service = d.lifecycle.servers[R].service
        assert await wait_until(lambda: service.streams == 1, 10)
        assert not d.lifecycle.pools[R].restart_owed
        assert kubelet.registrations(R) == before
        assert d.lifecycle.registrations[R] == before
        assert kubelet.allocatable(R) == 1000
        assert d.ready()
        assert d.lifecycle.servers[R].service.streams == 1  # only the kubelet's is left


async def test_the_kubelets_stream_ending_registers_again(
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    async with running(settings_for(node, plugin_dir)) as d:
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        async with plugin_stub(plugin_dir) as stub:
            # A stray stream open meanwhile changes nothing about which one counts.
            stray = stub.ListAndWatch(api_pb2.Empty())
            await asyncio.wait_for(stray.read(), 10)
            before = kubelet.registrations(R)
            await kubelet.drop_stream(R)
            await kubelet.wait_for(lambda: kubelet.registrations(R) == before + 1
                                   and kubelet.allocatable(R) == 1000, timeout=10)
            stray.cancel()
        assert await wait_until(d.ready, 5)
        # The stream of the new registration is the kubelet's again.
        before = kubelet.registrations(R)
        await kubelet.drop_stream(R)
        await kubelet.wait_for(lambda: kubelet.registrations(R) == before + 1
                               and kubelet.allocatable(R) == 1000, timeout=10)
