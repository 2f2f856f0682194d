"""What the lifecycle and hostile-client tests share: a daemon on a sim node, raw clients."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc

from rdma_hca.daemon._proto import api_pb2_grpc
from rdma_hca.daemon.deviceplugin.registration import socket_name
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.settings.model import Settings

R = "rdma/hca"


def settings_for(node: SimNode, plugin_dir: Path, **kw: object) -> Settings:
    base = Settings(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                    kubelet_dir=str(plugin_dir), metrics_address="", health_poll_seconds=0.05)
    return replace(base, **kw)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Daemon]:
    d = Daemon(settings, netlink=False)
    await d.start()
    try:
        yield d
    finally:
        await d.stop()


@contextlib.asynccontextmanager
async def plugin_stub(plugin_dir: Path, resource: str = R
                      ) -> AsyncIterator[api_pb2_grpc.DevicePluginStub]:
    """A client of the plugin's socket that is not the kubelet."""
    target = "unix://" + str(plugin_dir / socket_name(resource))
    async with grpc.aio.insecure_channel(target) as channel:
        yield api_pb2_grpc.DevicePluginStub(channel)
