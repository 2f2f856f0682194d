"""The kubelet's side of ListAndWatch: reading each registration's stream, and what its
end means (every device unhealthy until the plugin registers again; with kubelet 1.26
and later, an old stream's end disconnecting the current registration).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import grpc.aio

from rdma_hca.daemon._proto import api_pb2
from rdma_hca.devkit.sim.kubelet_admission import PodAdmission
from rdma_hca.devkit.sim.kubelet_records import Endpoint
from rdma_hca.devkit.sim.kubelet_rules import HEALTHY, MAX_DEVICE_ID_LEN, rpc_error_text
from rdma_hca.kit.aio import settle

CLOSE_WAIT = 5.0


class StreamReader(PodAdmission):
    """Reads the plugins' ListAndWatch streams into the emulator's state."""

    _server: grpc.aio.Server | None
    _superseded: set[Endpoint]
    _tasks: set[asyncio.Task[None]]

    def _start_reader(self, endpoint: Endpoint) -> None:
        state = self._resources.get(endpoint.resource)
        if self._server is None or state is None or state.endpoint is not endpoint:
            return
        if endpoint.closing or endpoint.reader is not None:
            return
        task = asyncio.get_running_loop().create_task(self._read_stream(endpoint))
        endpoint.reader = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close_endpoint(self, endpoint: Endpoint) -> None:
        """Drop a registration we no longer want, without counting it as a plugin failure."""
        endpoint.closing = True
        reader = endpoint.reader
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            await bounded(reader, f"the ListAndWatch reader of {endpoint.resource}")
        await bounded(asyncio.ensure_future(endpoint.channel.close(None)),
                       f"closing the channel to {endpoint.target}")

    async def _read_stream(self, endpoint: Endpoint) -> None:
        await self._note(f"ListAndWatch started for {endpoint.resource} at {endpoint.target}")
        call = endpoint.stub.ListAndWatch(api_pb2.Empty())
        try:
            async for response in call:
                await self._apply_list(endpoint, response)
            reason = "the plugin closed the stream"
        except grpc.aio.AioRpcError as err:
            reason = rpc_error_text(err)
        finally:
            call.cancel()
        if endpoint.closing:
            return
        if endpoint in self._superseded:
            await self._superseded_stream_ended(endpoint, reason)
            return
        await self._stream_ended(endpoint, reason)

    async def _apply_list(
        self, endpoint: Endpoint, response: api_pb2.ListAndWatchResponse
    ) -> None:
        state = self._resources.get(endpoint.resource)
        if state is None or state.endpoint is not endpoint or endpoint.closing:
            return
        devices: dict[str, api_pb2.Device] = {}
        for device in response.devices:
            if not device.ID or len(device.ID) > MAX_DEVICE_ID_LEN:
                self._record(
                    f"{endpoint.resource}: ignored device ID {device.ID!r} "
                    f"({len(device.ID)} characters; must be 1 to {MAX_DEVICE_ID_LEN})"
                )
                continue
            if device.ID in devices:
                self._record(f"{endpoint.resource}: device ID {device.ID!r} listed twice")
            copy = api_pb2.Device()
            copy.CopyFrom(device)
            devices[device.ID] = copy
        state.devices = devices
        state.usable = True
        healthy = sum(1 for d in devices.values() if d.health == HEALTHY)
        await self._note(
            f"list update for {endpoint.resource}: {len(devices)} devices, {healthy} healthy"
        )

    async def _stream_ended(self, endpoint: Endpoint, reason: str) -> None:
        """The plugin went away: every device counts unhealthy at once and stays counted.

        The kubelet never re-opens an ended stream; only a new registration brings the
        resource back.
        """
        endpoint.ended = True
        state = self._resources.get(endpoint.resource)
        current = state is not None and state.endpoint is endpoint
        if state is not None and current:
            state.usable = False
        await endpoint.channel.close(None)
        kept = len(state.devices) if state is not None else 0
        await self._note(
            f"ListAndWatch stream for {endpoint.resource} ended ({reason}); all {kept} devices "
            "marked unhealthy until the plugin registers again"
        )

    async def _superseded_stream_ended(self, old: Endpoint, reason: str) -> None:
        """Kubelet >= 1.26: an old stream ending disconnects the resource's current client."""
        self._superseded.discard(old)
        old.ended = True
        await old.channel.close(None)
        state = self._resources.get(old.resource)
        current = state.endpoint if state is not None else None
        if state is None or current is None or current.ended or current.closing:
            await self._note(f"superseded ListAndWatch stream for {old.resource} ended ({reason})")
            return
        current.ended = True
        current.closing = True  # its own stream end is this same disconnect, not a new one
        state.usable = False
        reader = current.reader
        if reader is not None:
            reader.cancel()
        await current.channel.close(None)
        await self._note(
            f"superseded ListAndWatch stream for {old.resource} at {old.target} ended "
            f"({reason}) and disconnected the current registration at {current.target}; all "
            f"{len(state.devices)} devices marked unhealthy until the plugin registers again"
        )


async def bounded(future: asyncio.Future[Any], what: str) -> None:
    """Wait for a closing step, but never forever: a test harness that hangs in its teardown
    hides the failure it was there to show. A step still running is named and left; one
    that failed raises its error."""
    if await settle([future], within=CLOSE_WAIT, what=f"the kubelet emulator: {what}"):
        return
    with contextlib.suppress(asyncio.CancelledError):
        future.result()
