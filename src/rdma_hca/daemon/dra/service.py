"""The gRPC services the kubelet calls: registration, DRAPlugin (v1, v1beta1), health.

Servicers only translate between protobuf and the driver's plain records; the work is
the driver's (``Preparer``), so both DRA versions share one implementation. Requests are
parsed leniently (the kit's server helper): one that does not decode is refused with
INVALID_ARGUMENT and one throttled line, never a gRPC traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol

import grpc

from rdma_hca.daemon._proto.dra import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
    health_v1beta1_pb2,
    pluginregistration_v1_pb2,
)
from rdma_hca.daemon.dra.claims import ClaimRef, PrepareResult
from rdma_hca.kit.broadcast import Broadcast
from rdma_hca.kit.unixserver import Malformed, Throttle, lenient_service

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# What each device's health message asks the kubelet to wait for the next one (its own
# default is 30 s too); the streams resend well within it.
HEALTH_CHECK_TIMEOUT = 30
# Most recent first: the kubelet takes the first entry it knows.
SUPPORTED_SERVICES = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1beta1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)


class Preparer(Protocol):
    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]: ...
    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]: ...


# --- registration ------------------------------------------------------------------------


_THROTTLE = Throttle()


async def _check(context: Any, method: str, request: object) -> None:
    """Refuse a request that did not decode: INVALID_ARGUMENT, and a line now and then."""
    if isinstance(request, Malformed):
        message = request.describe()
        held = _THROTTLE.allow(method)
        if held is not None:
            more = f" ({held} more refused since the last such line)" if held else ""
            log.warning("%s refused: %s%s", method, message, more)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)


def _service_name(pb2: ModuleType, name: str) -> str:
    return str(pb2.DESCRIPTOR.services_by_name[name].full_name)


class RegistrationService:
    def __init__(self, driver: str, endpoint: str,
                 on_status: Callable[[bool, str], Awaitable[None]]) -> None:
        self.info = pluginregistration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=driver, endpoint=endpoint,
            supported_versions=list(SUPPORTED_SERVICES))
        self.on_status = on_status

    async def GetInfo(self, request: pluginregistration_v1_pb2.InfoRequest,
                      context: Any) -> pluginregistration_v1_pb2.PluginInfo:
        await _check(context, "GetInfo", request)
        # The kubelet's connection monitor calls this every 10 s too: it is not a
        # registration, only NotifyRegistrationStatus is.
        return self.info

    async def NotifyRegistrationStatus(
        self, request: pluginregistration_v1_pb2.RegistrationStatus, context: Any,
    ) -> pluginregistration_v1_pb2.RegistrationStatusResponse:
        await _check(context, "NotifyRegistrationStatus", request)
        await self.on_status(request.plugin_registered, request.error)
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


# --- DRAPlugin ---------------------------------------------------------------------------


def _claims(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]


class _DraServiceBase:
    pb2: ModuleType

    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        await _check(context, "NodePrepareResources", request)
        results = await self.preparer.prepare(_claims(request))
        resp = self.pb2.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = resp.claims[uid]
            if result.error:
                entry.error = result.error
                continue
            for d in result.devices:
                entry.devices.add(request_names=list(d.request_names), pool_name=d.pool,
                                  device_name=d.device, cdi_device_ids=list(d.cdi_ids))
        return resp

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        await _check(context, "NodeUnprepareResources", request)
        errors = await self.preparer.unprepare(_claims(request))
        resp = self.pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            resp.claims[uid].error = error
        return resp


    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        pb2 = self.pb2
        return lenient_service(_service_name(pb2, "DRAPlugin"), {
            "NodePrepareResources": (self.NodePrepareResources, pb2.NodePrepareResourcesRequest,
                                     pb2.NodePrepareResourcesResponse, False),
            "NodeUnprepareResources": (self.NodeUnprepareResources,
                                       pb2.NodeUnprepareResourcesRequest,
                                       pb2.NodeUnprepareResourcesResponse, False),
        })


class DraServiceV1(_DraServiceBase):
    pb2 = dra_v1_pb2


class DraServiceV1beta1(_DraServiceBase):
    pb2 = dra_v1beta1_pb2


# --- health ------------------------------------------------------------------------------


class HealthBoard:
    """The devices' health as the streams send it: a broadcast value (``kit.broadcast``),
    so every stream follows it at its own pace and a change wakes every stream."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._health: Broadcast[dict[str, bool]] = Broadcast({})
        self.updated: dict[str, int] = {}
        self.streams = 0
        self.resends = 0  # messages sent again without a change

    @property
    def health(self) -> dict[str, bool]:
        return self._health.value

    @property
    def version(self) -> int:
        return self._health.generation

    async def set(self, health: Mapping[str, bool]) -> bool:
        new = dict(health)
        old = self._health.value
        if new == old:
            return False
        now = int(time.time())
        for name, ok in new.items():
            if old.get(name) != ok:
                self.updated[name] = now
        self.updated = {n: t for n, t in self.updated.items() if n in new}
        return self._health.publish(new)

    async def follow(self, resend: float | None = None) -> AsyncIterator[dict[str, bool]]:
        """The current health at once, then after every change, until cancelled.

        With ``resend``, the same health again when nothing changed for that long: the
        kubelet marks a device Unknown when it hears nothing of it within its
        health-check timeout.
        """
        seen = -1
        self.streams += 1
        try:
            while True:
                if self.version == seen and await self._health.wait_newer(seen, resend) == seen:
                    self.resends += 1
                seen = self.version
                yield dict(self.health)
        finally:
            self.streams -= 1


class _HealthServiceBase:
    pb2: ModuleType
    details = True  # v1alpha1 has no message or timeout field

    def __init__(self, board: HealthBoard, resend: float) -> None:
        self.board = board
        self.resend = resend

    def _response(self, health: Mapping[str, bool]) -> Any:
        pb2 = self.pb2
        resp = pb2.NodeWatchResourcesResponse()
        for name, ok in sorted(health.items()):
            d = resp.devices.add(
                device=pb2.DeviceIdentifier(pool_name=self.board.pool, device_name=name),
                health=pb2.HEALTHY if ok else pb2.UNHEALTHY,
                last_updated_time=self.board.updated.get(name, int(time.time())))
            if self.details:
                d.health_check_timeout_seconds = HEALTH_CHECK_TIMEOUT
                if not ok:
                    d.message = "no port of this HCA is up, or its device node is missing"
        return resp

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        await _check(context, "NodeWatchResources", request)
        async for health in self.board.follow(self.resend):
            yield self._response(health)

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        pb2 = self.pb2
        return lenient_service(_service_name(pb2, "DRAResourceHealth"), {
            "NodeWatchResources": (self.NodeWatchResources, pb2.NodeWatchResourcesRequest,
                                   pb2.NodeWatchResourcesResponse, True),
        })


class HealthServiceV1(_HealthServiceBase):
    pb2 = health_v1_pb2


class HealthServiceV1beta1(_HealthServiceBase):
    pb2 = health_v1beta1_pb2


class HealthServiceV1alpha1(_HealthServiceBase):
    pb2 = health_v1alpha1_pb2
    details = False


def add_dra_services(server: grpc.aio.Server, preparer: Preparer, board: HealthBoard,
                     resend: float) -> None:
    server.add_generic_rpc_handlers((
        DraServiceV1(preparer).handler(), DraServiceV1beta1(preparer).handler(),
        HealthServiceV1(board, resend).handler(), HealthServiceV1beta1(board, resend).handler(),
        HealthServiceV1alpha1(board, resend).handler()))


def add_registration_service(server: grpc.aio.Server, service: RegistrationService) -> None:
    pb2 = pluginregistration_v1_pb2
    server.add_generic_rpc_handlers((lenient_service(_service_name(pb2, "Registration"), {
        "GetInfo": (service.GetInfo, pb2.InfoRequest, pb2.PluginInfo, False),
        "NotifyRegistrationStatus": (service.NotifyRegistrationStatus, pb2.RegistrationStatus,
                                     pb2.RegistrationStatusResponse, False),
    }),))
