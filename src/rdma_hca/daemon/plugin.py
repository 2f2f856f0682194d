"""The ``v1beta1.DevicePlugin`` servicer for one pool.

It answers from the pool's current view and device state and never registers
itself: the kubelet lifecycle (``kubelet.py``) owns the server it runs in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

import grpc

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.daemon.config import Mode
from rdma_hca.daemon.pool import DeviceInfo, UnknownDeviceIds
from rdma_hca.daemon.runtime import PoolRuntime
from rdma_hca.kit.aio import unless

log = logging.getLogger("rdma_hca.plugin")


def to_proto(devices: Sequence[DeviceInfo]) -> api_pb2.ListAndWatchResponse:
    resp = api_pb2.ListAndWatchResponse()
    for d in devices:
        dev = resp.devices.add(ID=d.id, health="Healthy" if d.healthy else "Unhealthy")
        if d.numa_nodes:
            dev.topology.nodes.extend(api_pb2.NUMANode(ID=n) for n in d.numa_nodes)
    return resp


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """Serves one pool.

    ``on_stream_end`` is called when a ListAndWatch stream ends while the server is
    meant to be serving: the kubelet never re-opens a stream, so the lifecycle must
    register again.
    """

    def __init__(
        self,
        runtime: PoolRuntime,
        *,
        resend_seconds: float = 30.0,
        on_stream_end: Callable[[], None] | None = None,
        on_allocate: Callable[[float, bool], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.resend_seconds = resend_seconds
        self.on_stream_end = on_stream_end
        self.on_allocate = on_allocate
        self.stopping = False
        self._stopped = asyncio.Event()

    def stop(self) -> None:
        """End every open stream normally, before the server goes away.

        A stream left waiting would be cancelled by the server's shutdown, which grpc
        reports as an error with a traceback; the kubelet sees the same end either way.
        """
        self.stopping = True
        self._stopped.set()

    def options(self) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False,
            get_preferred_allocation_available=self.runtime.config.mode is Mode.EXCLUSIVE,
        )

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.DevicePluginOptions:
        return self.options()

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        state = self.runtime.state
        resend = self.resend_seconds or None
        resource = self.runtime.config.resource_name
        log.debug("ListAndWatch stream opened for %s", resource)
        try:
            seen = state.generation
            yield to_proto(state.devices)
            while not self._stopped.is_set():
                newer = await unless(state.wait_newer(seen, timeout=resend),
                                     self._stopped.wait())
                if newer is None or self._stopped.is_set():
                    return
                seen = newer.result()
                # A new generation, or the resend interval passed: send the whole list,
                # which the kubelet takes as a replacement, so a missed update heals.
                yield to_proto(state.devices)
        finally:
            if not self.stopping:
                log.warning("the kubelet closed the ListAndWatch stream of %s", resource)
                if self.on_stream_end is not None:
                    self.on_stream_end()

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.PreferredAllocationResponse:
        view = self.runtime.view
        resp = api_pb2.PreferredAllocationResponse()
        for creq in request.container_requests:
            if creq.allocation_size < 0:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"allocation_size must not be negative, got "
                                    f"{creq.allocation_size}")
            ids = view.preferred(list(creq.available_deviceIDs),
                                 list(creq.must_include_deviceIDs), creq.allocation_size)
            resp.container_responses.add(deviceIDs=ids)
        return resp

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.AllocateResponse:
        start = time.perf_counter()
        view = self.runtime.view
        resp = api_pb2.AllocateResponse()
        error: str | None = None
        for n, creq in enumerate(request.container_requests):
            if not creq.devices_ids:
                error = f"container request {n} names no device IDs"
                break
            try:
                resp.container_responses.append(view.allocate(list(creq.devices_ids)))
            except UnknownDeviceIds as exc:
                error = f"{exc}; this plugin advertises only the IDs it sent in ListAndWatch"
                break
        if self.on_allocate is not None:
            self.on_allocate(time.perf_counter() - start, error is None)
        if error is not None:
            log.warning("Allocate refused: %s", error)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)
        log.debug("Allocate %s: %s", self.runtime.config.resource_name,
                 "; ".join(r.envs.get("RDMA_HCA_DEVICES", "") for r in resp.container_responses))
        return resp

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.PreStartContainerResponse:
        # Not required (options say so); answered anyway so a kubelet that calls it works.
        return api_pb2.PreStartContainerResponse()
