"""The kubelet emulator against a tiny device plugin, over real unix sockets.

The plugin here is deliberately bare (a ``DevicePluginServicer`` fed from a queue) so these tests
check the emulator's kubelet behaviour, not our plugin's.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.kubelet_rules import (
    CHECKPOINT_NAME,
    AdmissionError,
    format_quantity,
    resource_name_problem,
)

RESOURCE = "rdma/hca"
Context = grpc.aio.ServicerContext[Any, Any]


def dev(device_id: str, health: str = "Healthy") -> api_pb2.Device:
    return api_pb2.Device(ID=device_id, health=health)


class TinyPlugin(api_pb2_grpc.DevicePluginServicer):
    """A device plugin reduced to what a test needs to drive and observe."""

    def __init__(self, options: api_pb2.DevicePluginOptions | None = None) -> None:
        self.options = options or api_pb2.DevicePluginOptions()
        self.calls: list[str] = []
        # Each item is one ListAndWatch message; None ends the stream from the plugin side.
        self.lists: asyncio.Queue[list[api_pb2.Device] | None] = asyncio.Queue()
        self.stream_closed = asyncio.Event()
        self.preferred: list[str] = []
        self.preferred_requests: list[api_pb2.PreferredAllocationRequest] = []
        self.allocate_requests: list[api_pb2.AllocateRequest] = []
        self.allocate_error: str | None = None
        self.pre_start_requests: list[list[str]] = []
        # When set, GetDevicePluginOptions holds its answer until the test opens the gate.
        self.options_gate: asyncio.Event | None = None
        self.options_asked = asyncio.Event()

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context
    ) -> api_pb2.DevicePluginOptions:
        self.calls.append("GetDevicePluginOptions")
        self.options_asked.set()
        if self.options_gate is not None:
            await self.options_gate.wait()
        return self.options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        self.calls.append("ListAndWatch")
        try:
            while True:
                devices = await self.lists.get()
                if devices is None:
                    return
                yield api_pb2.ListAndWatchResponse(devices=devices)
        finally:
            self.stream_closed.set()

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Context
    ) -> api_pb2.PreferredAllocationResponse:
        self.calls.append("GetPreferredAllocation")
        self.preferred_requests.append(request)
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=self.preferred)
            ]
        )

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: Context
    ) -> api_pb2.AllocateResponse:
        self.calls.append("Allocate")
        self.allocate_requests.append(request)
        if self.allocate_error is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self.allocate_error)
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(envs={"IDS": ",".join(c.devices_ids)})
                for c in request.container_requests
            ]
        )

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Context
    ) -> api_pb2.PreStartContainerResponse:
        self.calls.append("PreStartContainer")
        self.pre_start_requests.append(list(request.devices_ids))
        return api_pb2.PreStartContainerResponse()


async def serve(plugin: TinyPlugin, path: Path) -> grpc.aio.Server:
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


async def register(
    plugin_dir: Path,
    endpoint: str,
    *,
    resource: str = RESOURCE,
    version: str = "v1beta1",
    options: api_pb2.DevicePluginOptions | None = None,
) -> None:
    async with grpc.aio.insecure_channel(f"unix://{plugin_dir / 'kubelet.sock'}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        await stub.Register(
            api_pb2.RegisterRequest(
                version=version, endpoint=endpoint, resource_name=resource, options=options
            )
        )


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[KubeletEmulator]:
    emulator = KubeletEmulator(tmp_path, dial_timeout=2.0)
    await emulator.start()
    yield emulator
    await emulator.stop()


@pytest.fixture
async def servers() -> AsyncIterator[list[grpc.aio.Server]]:
    started: list[grpc.aio.Server] = []
    yield started
    for server in started:
        await server.stop(None)


async def plugin_on(
    kubelet: KubeletEmulator,
    servers: list[grpc.aio.Server],
    name: str = "p.sock",
    options: api_pb2.DevicePluginOptions | None = None,
) -> TinyPlugin:
    """Serve a TinyPlugin on ``name`` and register it, as a real plugin does."""
    plugin = TinyPlugin(options)
    servers.append(await serve(plugin, kubelet.plugin_dir / name))
    await register(kubelet.plugin_dir, name)
    return plugin


# -- registration ----------------------------------------------------------------------


async def test_options_are_asked_inside_register_and_the_stream_opens_after(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    plugin = TinyPlugin(api_pb2.DevicePluginOptions(pre_start_required=True))
    servers.append(await serve(plugin, kubelet.plugin_dir / "p.sock"))
    plugin.options_gate = asyncio.Event()
    # The request's own options must be ignored in favour of GetDevicePluginOptions.
    registering = asyncio.create_task(
        register(
            kubelet.plugin_dir,
            "p.sock",
            options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
        )
    )
    await plugin.options_asked.wait()
    assert not registering.done()  # Register is still waiting for the options
    assert kubelet.registrations(RESOURCE) == 0
    plugin.options_gate.set()
    await registering
    # Options are asked inside Register. ListAndWatch starts once Register has finished on
    # the kubelet side; whether the plugin sees it before or after its own Register call
    # resumes is a race on a real kubelet too, so only the kubelet-side order is asserted.
    assert plugin.calls[0] == "GetDevicePluginOptions"
    assert kubelet.registrations(RESOURCE) == 1

    await plugin.lists.put([dev("a")])
    await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) == 1)
    assert plugin.calls == ["GetDevicePluginOptions", "ListAndWatch"]
    options = kubelet.options(RESOURCE)
    assert options is not None
    assert options.pre_start_required
    assert not options.get_preferred_allocation_available
    events = kubelet.events()
    registered = next(i for i, e in enumerate(events) if e.startswith("registered rdma/hca"))
    started = next(i for i, e in enumerate(events) if e.startswith("ListAndWatch started"))
    assert registered < started


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"version": "v1alpha"}, "'v1alpha' is not supported"),
        ({"resource": "hca"}, "it must be <domain>/<name>"),
        ({"resource": "kubernetes.io/hca"}, "kubernetes.io"),
        ({"resource": "RDMA/hca"}, "must be a DNS subdomain"),
        ({"resource": "rdma/-hca"}, "the part after '/' must be 1-63 characters"),
        ({"resource": "rdma/" + "h" * 64}, "the part after '/' must be 1-63 characters"),
        ({"endpoint": "../p.sock"}, "bare file name"),
        ({"endpoint": "/tmp/p.sock"}, "bare file name"),
        ({"endpoint": ""}, "endpoint is empty"),
    ],
)
async def test_register_rejects_bad_requests_with_a_message(
    kubelet: KubeletEmulator,
    servers: list[grpc.aio.Server],
    kwargs: dict[str, str],
    fragment: str,
) -> None:
    plugin = TinyPlugin()
    servers.append(await serve(plugin, kubelet.plugin_dir / "p.sock"))
    endpoint = kwargs.pop("endpoint", "p.sock")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await register(
            kubelet.plugin_dir,
            endpoint,
            resource=kwargs.get("resource", RESOURCE),
            version=kwargs.get("version", "v1beta1"),
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in (caught.value.details() or "")
    assert plugin.calls == []  # validation happens before dialling
    assert kubelet.resources() == []
    assert any("rejected" in e and fragment in e for e in kubelet.events())


async def test_register_fails_when_nothing_serves_the_endpoint(tmp_path: Path) -> None:
    async with KubeletEmulator(tmp_path, dial_timeout=0.2) as kubelet:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await register(tmp_path, "absent.sock")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        details = caught.value.details() or ""
        assert "failed to dial device plugin" in details
        assert "absent.sock" in details
        assert kubelet.registrations(RESOURCE) == 0


def test_resource_name_rules() -> None:
    for good in ("rdma/hca", "example.com/foo_bar.1", "a.b-c/X"):
        assert resource_name_problem(good) is None, good
    for bad in ("", "/hca", "rdma/", "rdma/a/b", "requests.rdma/hca", "x.kubernetes.io/y"):
        assert resource_name_problem(bad) is not None, bad


# -- device lists ----------------------------------------------------------------------


async def test_capacity_counts_all_devices_allocatable_only_exactly_healthy(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    plugin = await plugin_on(kubelet, servers)
    too_long = "x" * 64
    await plugin.lists.put(
        [dev("a"), dev("b"), dev("c", "Unhealthy"), dev("d", "healthy"), dev(too_long)]
    )
    await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) > 0)
    assert kubelet.capacity(RESOURCE) == 4
    assert kubelet.allocatable(RESOURCE) == 2
    assert [d.ID for d in kubelet.devices(RESOURCE)] == ["a", "b", "c", "d"]
    assert any(too_long in e and "ignored" in e for e in kubelet.events())

    # Each message replaces the whole list, and a device can come back to Healthy.
    await plugin.lists.put([dev("c"), dev("d")])
    await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) == 2)
    assert kubelet.allocatable(RESOURCE) == 2
    assert [d.ID for d in kubelet.devices(RESOURCE)] == ["c", "d"]


async def test_stream_end_marks_every_device_unhealthy_and_is_never_reopened(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    plugin = await plugin_on(kubelet, servers)
    await plugin.lists.put([dev("a"), dev("b"), dev("c")])
    await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 3)

    await plugin.lists.put(None)
    await kubelet.wait_for(lambda: any("stream for rdma/hca ended" in e for e in kubelet.events()))
    assert kubelet.allocatable(RESOURCE) == 0
    assert kubelet.capacity(RESOURCE) == 3
    assert kubelet.node_status() == {
        "capacity": {RESOURCE: "3"},
        "allocatable": {RESOURCE: "0"},
    }
    with pytest.raises(AdmissionError, match="has been stopped"):
        await kubelet.allocate(RESOURCE, [["a"]])
    assert plugin.calls.count("ListAndWatch") == 1

    # Only a new registration brings the resource back.
    await register(kubelet.plugin_dir, "p.sock")
    await plugin.lists.put([dev("a"), dev("b")])
    await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 2)
    assert plugin.calls.count("ListAndWatch") == 2
    assert kubelet.registrations(RESOURCE) == 2


async def test_dropping_a_stream_cancels_it_at_the_plugin(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    plugin = await plugin_on(kubelet, servers)
    await plugin.lists.put([dev("a"), dev("b")])
    await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 2)
    await kubelet.drop_stream(RESOURCE)
    await asyncio.wait_for(plugin.stream_closed.wait(), 5)
    assert kubelet.allocatable(RESOURCE) == 0 and kubelet.capacity(RESOURCE) == 2
    assert any("dropped by the kubelet" in e for e in kubelet.events())
    with pytest.raises(RuntimeError, match="no live ListAndWatch stream"):
        await kubelet.drop_stream(RESOURCE)


async def test_plugin_server_dying_counts_as_stream_end(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    plugin = await plugin_on(kubelet, servers)
    await plugin.lists.put([dev("a")])
    await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 1)
    await servers.pop().stop(None)
    await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 0)
    assert kubelet.capacity(RESOURCE) == 1


async def test_reregistration_replaces_the_old_stream(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    old = await plugin_on(kubelet, servers, "old.sock")
    await old.lists.put([dev("a")])
    await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) == 1)

    new = await plugin_on(kubelet, servers, "new.sock")
    await old.stream_closed.wait()  # the emulator cancelled the old stream
    await new.lists.put([dev("x"), dev("y")])
    await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) == 2)

    # The old plugin going away must not disturb the new registration.
    await servers[0].stop(None)
    await new.lists.put([dev("x"), dev("y"), dev("z")])
    await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) == 3)
    assert kubelet.allocatable(RESOURCE) == 3
    assert kubelet.registrations(RESOURCE) == 2
    assert not any("ended" in e for e in kubelet.events())
    assert old.calls.count("ListAndWatch") == 1


async def test_strict_mode_old_stream_end_disconnects_the_new_registration(
    tmp_path: Path, servers: list[grpc.aio.Server]
) -> None:
    async with KubeletEmulator(tmp_path, old_stream_disconnects_new=True) as kubelet:
        old = await plugin_on(kubelet, servers, "old.sock")
        await old.lists.put([dev("a")])
        await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) == 1)
        new = await plugin_on(kubelet, servers, "new.sock")
        await new.lists.put([dev("x"), dev("y")])
        await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 2)

        # A plugin that forgets to close its old server before registering again loses the
        # new registration as soon as the old server goes.
        await servers[0].stop(None)
        await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 0)
        await new.stream_closed.wait()
        assert kubelet.capacity(RESOURCE) == 2
        assert any("disconnected the current registration" in e for e in kubelet.events())
        with pytest.raises(AdmissionError, match="has been stopped"):
            await kubelet.allocate(RESOURCE, [["x"]])

        # Closing the old server first, then registering, keeps the resource.
        await servers[1].stop(None)
        final = await plugin_on(kubelet, servers, "final.sock")
        await final.lists.put([dev("x")])
        await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 1)
        assert kubelet.registrations(RESOURCE) == 3


async def test_node_status_uses_quantity_formatting(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    plugin = await plugin_on(kubelet, servers)
    await plugin.lists.put([dev(f"hca-{i:04d}") for i in range(1000)])
    await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) == 1000)
    assert kubelet.node_status() == {
        "capacity": {RESOURCE: "1k"},
        "allocatable": {RESOURCE: "1k"},
    }


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (8, "8"),
        (1000, "1k"),
        (1500, "1500"),
        (2000, "2k"),
        (10**6, "1M"),
        (1_500_000, "1500k"),
        (10**9, "1G"),
    ],
)
def test_format_quantity(value: int, text: str) -> None:
    assert format_quantity(value) == text


# -- restart ---------------------------------------------------------------------------


async def test_restart_removes_sockets_and_files_but_keeps_checkpoint_and_directories(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    root = kubelet.plugin_dir
    plugin = await plugin_on(kubelet, servers)
    await plugin.lists.put([dev("a"), dev("b")])
    await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 2)
    await kubelet.allocate(RESOURCE, [["a"]])
    (root / "stray.txt").write_text("left by someone")
    (root / "sub").mkdir()
    (root / "sub" / "inner.sock").write_text("")
    old_inode = (root / "kubelet.sock").stat().st_ino

    await kubelet.restart()

    assert not (root / "p.sock").exists()
    assert not (root / "stray.txt").exists()
    assert (root / "sub" / "inner.sock").exists()
    assert "a" in (root / CHECKPOINT_NAME).read_text()
    assert stat.S_ISSOCK((root / "kubelet.sock").stat().st_mode)
    assert isinstance(old_inode, int)  # inodes may repeat: nothing relies on them
    # Capacity survives the restart, allocatable waits for the plugin to come back.
    assert kubelet.capacity(RESOURCE) == 2
    assert kubelet.allocatable(RESOURCE) == 0
    assert kubelet.allocated(RESOURCE) == {"a"}

    await servers.pop().stop(None)
    plugin = await plugin_on(kubelet, servers)
    await plugin.lists.put([dev("a"), dev("b")])
    await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 2)
    assert kubelet.registrations(RESOURCE) == 2


async def test_checkpoint_is_restored_by_a_new_kubelet(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    plugin = await plugin_on(kubelet, servers)
    await plugin.lists.put([dev("a"), dev("b"), dev("c")])
    await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 3)
    await kubelet.allocate(RESOURCE, [["a", "b"]], pod_uid="pod-1")
    document = json.loads((kubelet.plugin_dir / CHECKPOINT_NAME).read_text())
    entry = document["Data"]["PodDeviceEntries"][0]
    assert entry["PodUID"] == "pod-1"
    assert entry["DeviceIDs"] == {"-1": ["a", "b"]}
    await kubelet.stop()

    async with KubeletEmulator(kubelet.plugin_dir) as fresh:
        assert fresh.allocated(RESOURCE) == {"a", "b"}
        assert fresh.capacity(RESOURCE) == 3
        assert fresh.allocatable(RESOURCE) == 0
        assert await fresh.release_pod("pod-1") == ["a", "b"]
        assert fresh.allocated(RESOURCE) == set()


async def test_corrupt_checkpoint_is_reported_not_fatal(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_NAME).write_text('{"Data": {}, "Checksum": 1}')
    async with KubeletEmulator(tmp_path) as kubelet:
        assert kubelet.allocated(RESOURCE) == set()
        assert any("checksum does not match" in e for e in kubelet.events())


async def test_repeated_restarts_do_not_leak_file_descriptors(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    async def cycle() -> None:
        await kubelet.restart()
        for server in servers:
            await server.stop(None)
        servers.clear()
        plugin = await plugin_on(kubelet, servers)
        await plugin.lists.put([dev("a")])
        await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 1)

    for _ in range(3):  # let gRPC create its pollers and worker pipes first
        await cycle()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(15):
        await cycle()
    assert len(os.listdir("/proc/self/fd")) <= before + 2


# -- allocation ------------------------------------------------------------------------


async def test_admit_pod_uses_the_plugins_preference_and_prestart(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    plugin = await plugin_on(
        kubelet,
        servers,
        options=api_pb2.DevicePluginOptions(
            get_preferred_allocation_available=True, pre_start_required=True
        ),
    )
    plugin.preferred = ["d3", "d1"]
    await plugin.lists.put([dev("d0"), dev("d1"), dev("d2"), dev("d3"), dev("d4", "Unhealthy")])
    await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 4)

    response = await kubelet.admit_pod(RESOURCE, 2)
    assert response.envs["IDS"] == "d3,d1"
    request = plugin.preferred_requests[0].container_requests[0]
    assert sorted(request.available_deviceIDs) == ["d0", "d1", "d2", "d3"]
    assert request.allocation_size == 2
    assert plugin.pre_start_requests == [["d3", "d1"]]
    assert kubelet.allocated(RESOURCE) == {"d1", "d3"}
    assert "d3" in (kubelet.plugin_dir / CHECKPOINT_NAME).read_text()

    # Exactly as many candidates as needed: no preference to ask for.
    response = await kubelet.admit_pod(RESOURCE, 2)
    assert response.envs["IDS"] == "d0,d2"
    assert plugin.calls.count("GetPreferredAllocation") == 1

    with pytest.raises(AdmissionError) as caught:
        await kubelet.admit_pod(RESOURCE, 1)
    assert caught.value.reason == "UnexpectedAdmissionError"
    assert "Requested: 1, Available: 0" in str(caught.value)


async def test_preference_for_devices_not_offered_is_ignored(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    plugin = await plugin_on(
        kubelet,
        servers,
        options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    plugin.preferred = ["ghost", "b"]
    await plugin.lists.put([dev("a"), dev("b"), dev("c")])
    await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 3)
    response = await kubelet.admit_pod(RESOURCE, 2, start_container=True)
    assert response.envs["IDS"] == "b,a"
    assert "PreStartContainer" not in plugin.calls
    assert any("ghost" in e and "ignored" in e for e in kubelet.events())


async def test_failed_allocate_is_an_unexpected_admission_error(
    kubelet: KubeletEmulator, servers: list[grpc.aio.Server]
) -> None:
    plugin = await plugin_on(kubelet, servers)
    plugin.allocate_error = "unknown device id 'a'"
    await plugin.lists.put([dev("a")])
    await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 1)
    with pytest.raises(AdmissionError) as caught:
        await kubelet.admit_pod(RESOURCE, 1)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "code = InvalidArgument desc = unknown device id 'a'" in str(caught.value)
    assert "which is unexpected" in str(caught.value)
    assert kubelet.allocated(RESOURCE) == set()
    assert not (kubelet.plugin_dir / CHECKPOINT_NAME).exists()


async def test_admit_pod_for_an_unknown_resource_is_out_of_resource(
    kubelet: KubeletEmulator,
) -> None:
    with pytest.raises(AdmissionError) as caught:
        await kubelet.admit_pod("example.com/none", 1)
    assert caught.value.reason == "OutOfexample.com/none"
    assert "capacity: 0" in str(caught.value)


# -- waiting ---------------------------------------------------------------------------


async def test_wait_for_timeout_names_the_condition_and_recent_events(
    kubelet: KubeletEmulator,
) -> None:
    def plugin_registered() -> bool:
        return kubelet.registrations(RESOURCE) > 0

    with pytest.raises(TimeoutError) as caught:
        await kubelet.wait_for(plugin_registered, timeout=0.05)
    message = str(caught.value)
    assert "plugin_registered" in message
    assert "kubelet listening on" in message
