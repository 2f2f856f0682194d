"""What the emulated kubelet knows about registrations, resources and pods."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc.aio

from rdma_hca.daemon._proto import api_pb2

if TYPE_CHECKING:
    from rdma_hca.daemon._proto.api_pb2_grpc import DevicePluginAsyncStub


@dataclass(eq=False)
class Endpoint:
    """One registration: the channel to the plugin and the stream reading from it."""

    resource: str
    target: str
    channel: grpc.aio.Channel
    stub: DevicePluginAsyncStub
    options: api_pb2.DevicePluginOptions
    serial: int
    reader: asyncio.Task[None] | None = None
    # Set when we close the endpoint ourselves, so the stream's end is not blamed on the plugin.
    closing: bool = False
    ended: bool = False


@dataclass
class ResourceState:
    """What the kubelet knows about one extended resource."""

    devices: dict[str, api_pb2.Device] = field(default_factory=dict)
    endpoint: Endpoint | None = None
    # False from stream end (or kubelet stop) until the next list: every device counts unhealthy.
    usable: bool = False
    registrations: int = 0


@dataclass
class PodDevices:
    pod_uid: str
    container: str
    resource: str
    ids: list[str]
    response: api_pb2.ContainerAllocateResponse
