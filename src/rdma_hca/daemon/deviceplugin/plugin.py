"""The ``v1beta1.DevicePlugin`` servicer for one pool: the only place protobuf is built.

It answers from the pool's current view and device state and never registers
itself: the kubelet lifecycle (``kubelet.py``) owns the server it runs in.

Any local process that can open the socket can call it, so every handler is bounded:
gRPC refuses requests over ``bounds.MAX_RECEIVE_BYTES`` before decoding them, a request
that does not decode is one throttled WARNING and ``INVALID_ARGUMENT`` (never gRPC's
ERROR traceback), a request names at most ``MAX_CONTAINERS`` containers, at most
``MAX_OTHER_STREAMS`` streams of clients other than the kubelet are open, and error
texts and log lines show only a short prefix of what the client sent.

Which ListAndWatch stream is the kubelet's: the first one opened after the lifecycle
announces a Register call (``expect_kubelet``). The kubelet opens its stream only
once Register has returned, so no other stream of the kubelet comes first; only the
end of that stream means "the kubelet went away" and makes the lifecycle register
again. Other clients' streams (tools, probes, an attacker) come and go without
effect. The limit: a client that opens a stream in the short window between our
Register call and the kubelet's own stream is taken for the kubelet; when it ends,
the pool registers once more, and the rule picks the next first stream again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.daemon.deviceplugin.bounds import shorten_ids
from rdma_hca.daemon.deviceplugin.pool import Allocation, DeviceInfo, UnknownDeviceIds
from rdma_hca.daemon.deviceplugin.runtime import PoolRuntime
from rdma_hca.kit.aio import unless
from rdma_hca.kit.unixserver import Malformed, Throttle, lenient_service
from rdma_hca.settings.model import Mode

log = logging.getLogger(__name__)

SERVICE = "v1beta1.DevicePlugin"
# The kubelet sends one container request per container of the pod that asks for the
# resource; no real pod comes near this, and it bounds the work one call can ask for.
MAX_CONTAINERS = 1000
# Streams other than the kubelet's (tools, probes) each hold a task and a copy of the
# list; more than this at once is refused, the kubelet's own stream never is.
MAX_OTHER_STREAMS = 32
# Allocate answers by allocation; exclusive pools have one per HCA set in use.
_PROTO_CACHE = 256

Context = grpc.aio.ServicerContext[Any, Any]


def to_proto(devices: Sequence[DeviceInfo]) -> api_pb2.ListAndWatchResponse:
    resp = api_pb2.ListAndWatchResponse()
    for d in devices:
        dev = resp.devices.add(ID=d.id, health="Healthy" if d.healthy else "Unhealthy")
        if d.numa_nodes:
            dev.topology.nodes.extend(api_pb2.NUMANode(ID=n) for n in d.numa_nodes)
    return resp


def allocation_proto(a: Allocation) -> api_pb2.ContainerAllocateResponse:
    resp = api_pb2.ContainerAllocateResponse()
    for key, value in a.envs:
        resp.envs[key] = value
    resp.devices.extend(
        api_pb2.DeviceSpec(container_path=d.container_path, host_path=d.host_path,
                           permissions=d.permissions) for d in a.devices)
    resp.mounts.extend(
        api_pb2.Mount(container_path=m.container_path, host_path=m.host_path,
                      read_only=m.read_only) for m in a.mounts)
    resp.cdi_devices.extend(api_pb2.CDIDevice(name=n) for n in a.cdi_devices)
    return resp


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """Serves one pool.

    ``on_stream_end`` is called when the kubelet's ListAndWatch stream ends while the
    server is meant to be serving: the kubelet never re-opens a stream, so the
    lifecycle must register again.
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
        self._awaiting_kubelet = False
        self.streams = 0  # open ListAndWatch streams, the kubelet's and others'
        self._others = 0  # of which not the kubelet's
        self._throttle = Throttle()
        self._protos: dict[int, tuple[Allocation, api_pb2.ContainerAllocateResponse]] = {}

    def add_to(self, server: grpc.aio.Server) -> None:
        """Serve this servicer on ``server``, with lenient request parsing."""
        e, lw = api_pb2.Empty, api_pb2.ListAndWatchResponse
        server.add_generic_rpc_handlers((lenient_service(SERVICE, {
            "GetDevicePluginOptions": (self.GetDevicePluginOptions, e,
                                       api_pb2.DevicePluginOptions, False),
            "ListAndWatch": (self.ListAndWatch, e, lw, True),
            "GetPreferredAllocation": (self.GetPreferredAllocation,
                                       api_pb2.PreferredAllocationRequest,
                                       api_pb2.PreferredAllocationResponse, False),
            "Allocate": (self.Allocate, api_pb2.AllocateRequest, api_pb2.AllocateResponse,
                         False),
            "PreStartContainer": (self.PreStartContainer, api_pb2.PreStartContainerRequest,
                                  api_pb2.PreStartContainerResponse, False),
        }),))

    def stop(self) -> None:
        """End every open stream normally, before the server goes away.

        A stream left waiting would be cancelled by the server's shutdown, which grpc
        reports as an error with a traceback; the kubelet sees the same end either way.
        """
        self.stopping = True
        self._stopped.set()

    def expect_kubelet(self) -> None:
        """A Register call is about to go out: the next stream opened is the kubelet's."""
        self._awaiting_kubelet = True

    def options(self) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False,
            get_preferred_allocation_available=self.runtime.config.mode is Mode.EXCLUSIVE,
        )

    async def _refuse(self, context: Context, method: str, message: str,
                      code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        held = self._throttle.allow(method)
        if held is not None:
            more = f" ({held} more refused since the last such line)" if held else ""
            log.warning("%s %s refused: %s%s", self.runtime.resource_name, method, message,
                        more, extra={"resource": self.runtime.resource_name})
        await context.abort(code, message)

    async def _check(self, context: Context, method: str, request: object) -> None:
        if isinstance(request, Malformed):
            await self._refuse(context, method, request.describe())

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty | Malformed[api_pb2.Empty], context: Context
    ) -> api_pb2.DevicePluginOptions:
        await self._check(context, "GetDevicePluginOptions", request)
        return self.options()

    async def ListAndWatch(
        self, request: api_pb2.Empty | Malformed[api_pb2.Empty], context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        await self._check(context, "ListAndWatch", request)
        state = self.runtime.state
        resend = self.resend_seconds or None
        resource = self.runtime.config.resource_name
        kubelets = self._awaiting_kubelet
        self._awaiting_kubelet = False
        if not kubelets and self._others >= MAX_OTHER_STREAMS:
            await self._refuse(context, "ListAndWatch",
                               f"{self._others} ListAndWatch streams of other clients are "
                               "open already; close one first",
                               grpc.StatusCode.RESOURCE_EXHAUSTED)
        log.debug("ListAndWatch stream opened for %s (%s)", resource,
                  "the kubelet's" if kubelets else "another client's")
        self.streams += 1
        self._others += not kubelets
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
            self.streams -= 1
            self._others -= not kubelets
            if not self.stopping and kubelets:
                log.warning("the kubelet closed the ListAndWatch stream of %s", resource)
                if self.on_stream_end is not None:
                    self.on_stream_end()
            elif not self.stopping:
                log.debug("another client closed its ListAndWatch stream of %s", resource)

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest
        | Malformed[api_pb2.PreferredAllocationRequest],
        context: Context,
    ) -> api_pb2.PreferredAllocationResponse:
        method = "GetPreferredAllocation"
        await self._check(context, method, request)
        assert isinstance(request, api_pb2.PreferredAllocationRequest)
        if len(request.container_requests) > MAX_CONTAINERS:
            await self._refuse(context, method, _too_many(len(request.container_requests)))
        view = self.runtime.view
        resp = api_pb2.PreferredAllocationResponse()
        for creq in request.container_requests:
            if creq.allocation_size < 0:
                await self._refuse(context, method,
                                   f"allocation_size must not be negative, got "
                                   f"{creq.allocation_size}")
            ids = view.preferred(creq.available_deviceIDs, creq.must_include_deviceIDs,
                                 creq.allocation_size)
            resp.container_responses.add(deviceIDs=ids)
        return resp

    async def Allocate(
        self, request: api_pb2.AllocateRequest | Malformed[api_pb2.AllocateRequest],
        context: Context,
    ) -> api_pb2.AllocateResponse:
        start = time.perf_counter()
        await self._check(context, "Allocate", request)
        assert isinstance(request, api_pb2.AllocateRequest)
        view = self.runtime.view
        resp = api_pb2.AllocateResponse()
        error: str | None = None
        if len(request.container_requests) > MAX_CONTAINERS:
            error = _too_many(len(request.container_requests))
        for n, creq in enumerate(request.container_requests):
            if error is not None:
                break
            if not creq.devices_ids:
                error = f"container request {n} names no device IDs"
                break
            try:
                resp.container_responses.append(self._proto(view.allocate(creq.devices_ids)))
            except UnknownDeviceIds as exc:
                error = f"{exc}; this plugin advertises only the IDs it sent in ListAndWatch"
        if self.on_allocate is not None:
            self.on_allocate(time.perf_counter() - start, error is None)
        if error is not None:
            await self._refuse(context, "Allocate", error)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("Allocate %s: %s", self.runtime.config.resource_name, shorten_ids(
                [r.envs.get("RDMA_HCA_DEVICES", "") for r in resp.container_responses]),
                extra={"resource": self.runtime.config.resource_name})
        return resp

    def _proto(self, allocation: Allocation) -> api_pb2.ContainerAllocateResponse:
        """The message for an allocation, built once: a view returns the same records."""
        cached = self._protos.get(id(allocation))
        if cached is not None and cached[0] is allocation:
            return cached[1]
        if len(self._protos) >= _PROTO_CACHE:
            self._protos.clear()
        message = allocation_proto(allocation)
        self._protos[id(allocation)] = (allocation, message)
        return message

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest | Malformed[api_pb2.PreStartContainerRequest],
        context: Context,
    ) -> api_pb2.PreStartContainerResponse:
        await self._check(context, "PreStartContainer", request)
        # Not required (options say so); answered anyway so a kubelet that calls it works.
        return api_pb2.PreStartContainerResponse()


def _too_many(count: int) -> str:
    return (f"the request names {count} containers; at most {MAX_CONTAINERS} are accepted "
            "(the kubelet sends one per container of a pod)")
