"""The gRPC services the kubelet calls: registration and DRAPlugin (v1, v1beta1).

Servicers only translate between protobuf and plain records; the work is the helper's
(``Preparer``), so both DRA versions share one implementation. Requests are
parsed leniently (the kit's server helper): one that does not decode is refused with
INVALID_ARGUMENT and one throttled line, never a gRPC traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol

import grpc

from rdma_hca.contract.checkpoint import PreparedDevice
from rdma_hca.daemon._proto.dra import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_v1_pb2,
)
from rdma_hca.daemon.dra.claims import ClaimRef
from rdma_hca.daemon.dra.kubeletplugin.plugin import PrepareResult
from rdma_hca.kit.unixserver import Malformed, Throttle, lenient_service

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
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


async def check_request(context: Any, method: str, request: object) -> None:
    """Refuse a request that did not decode: INVALID_ARGUMENT, and a line now and then."""
    if isinstance(request, Malformed):
        message = request.describe()
        held = _THROTTLE.allow(method)
        if held is not None:
            more = f" ({held} more refused since the last such line)" if held else ""
            log.warning("%s refused: %s%s", method, message, more)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)


def service_name(pb2: ModuleType, name: str) -> str:
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
        await check_request(context, "GetInfo", request)
        # The kubelet's connection monitor calls this every 10 s too: it is not a
        # registration, only NotifyRegistrationStatus is.
        return self.info

    async def NotifyRegistrationStatus(
        self, request: pluginregistration_v1_pb2.RegistrationStatus, context: Any,
    ) -> pluginregistration_v1_pb2.RegistrationStatusResponse:
        await check_request(context, "NotifyRegistrationStatus", request)
        await self.on_status(request.plugin_registered, request.error)
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


# --- DRAPlugin ---------------------------------------------------------------------------


def _claims(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]


def add_device(entry: Any, d: PreparedDevice, *, shares: bool) -> None:
    """The device's entries in a claim's answer: one per share when the API has share IDs.

    A device of consumable capacity holds one share per allocation result; the kubelet
    keeps each entry's share ID and the PodResources API reports it per container. The
    kubelet hands a container every CDI ID of every entry of its request, without
    removing repeats, so the CDI IDs go on the device's first entry only: one CDI device
    reaches the runtime once, and every entry names all the device's requests, so a
    container naming any of them gets the first.
    """
    requests = list(d.request_names)
    if not (shares and d.shares):
        entry.devices.add(request_names=requests, pool_name=d.pool, device_name=d.device,
                          cdi_device_ids=list(d.cdi_ids))
        return
    for i, share in enumerate(d.shares):
        entry.devices.add(request_names=requests, pool_name=d.pool, device_name=d.device,
                          cdi_device_ids=list(d.cdi_ids) if i == 0 else [],
                          share_id=share.share_id)


class _DraServiceBase:
    pb2: ModuleType
    shares = False  # the version's Device has share_id

    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        await check_request(context, "NodePrepareResources", request)
        results = await self.preparer.prepare(_claims(request))
        resp = self.pb2.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = resp.claims[uid]
            if result.error:
                entry.error = result.error
                continue
            for d in result.devices:
                add_device(entry, d, shares=self.shares)
        return resp

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        await check_request(context, "NodeUnprepareResources", request)
        errors = await self.preparer.unprepare(_claims(request))
        resp = self.pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            resp.claims[uid].error = error
        return resp

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        pb2 = self.pb2
        return lenient_service(service_name(pb2, "DRAPlugin"), {
            "NodePrepareResources": (self.NodePrepareResources, pb2.NodePrepareResourcesRequest,
                                     pb2.NodePrepareResourcesResponse, False),
            "NodeUnprepareResources": (self.NodeUnprepareResources,
                                       pb2.NodeUnprepareResourcesRequest,
                                       pb2.NodeUnprepareResourcesResponse, False),
        })


class DraServiceV1(_DraServiceBase):
    pb2 = dra_v1_pb2
    shares = True


class DraServiceV1beta1(_DraServiceBase):
    pb2 = dra_v1beta1_pb2


def add_dra_services(server: grpc.aio.Server, preparer: Preparer) -> None:
    server.add_generic_rpc_handlers((DraServiceV1(preparer).handler(),
                                     DraServiceV1beta1(preparer).handler()))


def add_registration_service(server: grpc.aio.Server, service: RegistrationService) -> None:
    pb2 = pluginregistration_v1_pb2
    server.add_generic_rpc_handlers((lenient_service(service_name(pb2, "Registration"), {
        "GetInfo": (service.GetInfo, pb2.InfoRequest, pb2.PluginInfo, False),
        "NotifyRegistrationStatus": (service.NotifyRegistrationStatus, pb2.RegistrationStatus,
                                     pb2.RegistrationStatusResponse, False),
    }),))
