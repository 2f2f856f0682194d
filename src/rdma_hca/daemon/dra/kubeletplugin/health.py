"""The health stream the kubelet watches (DRAResourceHealth v1, v1beta1, v1alpha1).

The devices' health is a broadcast value (:class:`HealthBoard`): each stream follows it
at its own pace and sends it again before the kubelet's health-check timeout.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from types import ModuleType
from typing import Any

import grpc

from rdma_hca.daemon._proto.dra import health_v1_pb2, health_v1alpha1_pb2, health_v1beta1_pb2
from rdma_hca.daemon.dra.kubeletplugin.services import check_request, service_name
from rdma_hca.kit.broadcast import Broadcast
from rdma_hca.kit.unixserver import lenient_service

# What each device's health message asks the kubelet to wait for the next one (its own
# default is 30 s too); the streams resend well within it.
HEALTH_CHECK_TIMEOUT = 30


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
        await check_request(context, "NodeWatchResources", request)
        async for health in self.board.follow(self.resend):
            yield self._response(health)

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        pb2 = self.pb2
        return lenient_service(service_name(pb2, "DRAResourceHealth"), {
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


def add_health_services(server: grpc.aio.Server, board: HealthBoard, resend: float) -> None:
    server.add_generic_rpc_handlers((
        HealthServiceV1(board, resend).handler(), HealthServiceV1beta1(board, resend).handler(),
        HealthServiceV1alpha1(board, resend).handler()))
