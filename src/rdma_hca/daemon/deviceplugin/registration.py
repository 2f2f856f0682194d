"""One pool's registration with the kubelet: its server, its Register call, its times.

``KubeletLifecycle`` (``kubelet.py``) holds one :class:`Registration` per pool and
moves it through :class:`State`; this module holds the pieces it is made of: the
gRPC server on the pool's socket, the Register call, and how the kubelet's socket
is told apart from one kubelet start to the next.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import re
from dataclasses import dataclass, field

import grpc

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.daemon.deviceplugin.bounds import MAX_RECEIVE_BYTES
from rdma_hca.daemon.deviceplugin.plugin import DevicePluginService
from rdma_hca.daemon.deviceplugin.runtime import PoolRuntime
from rdma_hca.kit.unixserver import UnixServer
from rdma_hca.settings.model import KUBELET_SOCKET

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
REGISTER_TIMEOUT = 15.0  # the kubelet dials us back inside Register with a 10 s timeout

KubeletId = tuple[int, int]


def kubelet_id(kubelet_dir: str) -> KubeletId | None:
    """Which kubelet.sock is there now: (inode, ctime), or None when there is none.

    The inode alone is not enough (a new kubelet.sock can reuse the old inode number);
    with the creation time it tells one kubelet start from the next.
    """
    try:
        st = os.stat(os.path.join(kubelet_dir, KUBELET_SOCKET))
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


def socket_name(resource_name: str) -> str:
    """Our socket's file name: one per resource, so pools restart independently."""
    return "rdma-hca-" + re.sub(r"[^A-Za-z0-9]+", "-", resource_name).strip("-") + ".sock"


async def register(kubelet_dir: str, endpoint: str, resource_name: str,
                   options: api_pb2.DevicePluginOptions,
                   timeout: float = REGISTER_TIMEOUT) -> None:
    """Call ``Registration.Register`` on ``kubelet.sock``; raises ``grpc.aio.AioRpcError``."""
    target = "unix://" + os.path.abspath(os.path.join(kubelet_dir, KUBELET_SOCKET))
    # A subchannel of its own: gRPC would otherwise reuse a connection another channel
    # holds to the same path, which may lead to the kubelet.sock that was just replaced.
    channel_options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(target, options=channel_options) as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        await stub.Register(
            api_pb2.RegisterRequest(version=API_VERSION, endpoint=endpoint,
                                    resource_name=resource_name, options=options),
            timeout=timeout,
        )


class PoolServer:
    """One pool's gRPC server on its own unix socket (0600, size-limited requests)."""

    def __init__(self, service: DevicePluginService, kubelet_dir: str) -> None:
        self.service = service
        self.path = os.path.join(kubelet_dir, socket_name(service.runtime.resource_name))
        self._unix = UnixServer(self.path, service.add_to, max_receive_bytes=MAX_RECEIVE_BYTES,
                                hint="use a shorter --kubelet-dir")

    async def start(self) -> None:
        await self._unix.start()

    def on_disk(self) -> bool:
        """Our socket is still the file at our path (not removed, not replaced)."""
        return self._unix.on_disk()

    async def stop(self, grace: float = 0.5) -> None:
        """Stop once, even if called again or if the caller is cancelled meanwhile."""
        await self._unix.stop(grace, before=self.service.stop)

    def remove_socket(self) -> None:
        """Remove our socket, but never a file someone else put on our name."""
        self._unix.remove_socket()


class State(enum.Enum):
    STOPPED = "stopped"  # before start and after stop: nothing owed
    OWED = "owed"  # a server and/or a registration is owed; the reconcile task acts
    REGISTERING = "registering"  # a Register call is in flight
    REGISTERED = "registered"  # registered with the current kubelet, nothing owed since


@dataclass(eq=False)
class RegisterCall:
    """The Register call in flight: which kubelet.sock it went to, how to give it up."""

    kubelet: KubeletId
    give_up: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class Registration:
    """One pool's standing with the kubelet.

    Registrations and server restarts are owed by time: a trigger at ``owed_since``
    asks for a registration that began later, and one at ``restart_since`` for a
    server started later. So a trigger that arrives while a server is being replaced,
    or while a Register call is in flight, is answered by that server or that call,
    and only a newer trigger asks for another. All times are monotonic ns.
    """

    runtime: PoolRuntime
    state: State = State.STOPPED
    server: PoolServer | None = None
    call: RegisterCall | None = None
    registered_with: KubeletId | None = None  # the kubelet.sock the last success went to
    registered_at: int = -1  # when the last successful Register call began
    owed_since: int = 0
    restart_since: int = -1
    served_at: int = 0  # when the serving server was started
    registrations: int = 0  # successful Register calls
    last_error: str | None = None  # logged once per distinct reason

    @property
    def resource(self) -> str:
        return self.runtime.resource_name

    @property
    def restart_owed(self) -> bool:
        return self.restart_since >= self.served_at

    def owe(self, now: int) -> None:
        """Owe a fresh server and a registration from ``now`` on."""
        self.restart_since = now
        self.owed_since = now
        if self.state is State.REGISTERED:
            self.state = State.OWED

    def current(self, kubelet: KubeletId | None) -> bool:
        """Registered with the kubelet behind ``kubelet``, and nothing owed since."""
        return (
            kubelet is not None
            and self.registered_with == kubelet
            and self.registered_at > self.owed_since
            and not self.restart_owed
            and self.server is not None
            and self.server.on_disk()
        )

    def give_up(self, reason: str) -> None:
        """Give up the Register call in flight, which can no longer succeed.

        The kubelet dials our socket inside Register and waits up to 10 s for it; when
        that socket was just removed, or another kubelet took over kubelet.sock, waiting
        would only delay the registration that works.
        """
        if self.call is None or self.call.give_up.is_set():
            return
        log.info("%s: giving up the Register call in flight: %s", self.resource, reason)
        self.call.give_up.set()

    def note_failure(self, message: str) -> None:
        if self.last_error != message:
            log.warning("%s: %s; retrying", self.resource, message)
            self.last_error = message
