"""Staying registered with the kubelet: serve, register, and do both again when needed.

The kubelet deletes every socket in its device-plugins directory when it starts,
creates ``kubelet.sock`` anew and never re-opens a ListAndWatch stream that ended.
So three things mean "serve and register again": ``kubelet.sock`` appearing, our
socket disappearing, and a stream ending while we meant to serve. All of them only
mark a pool dirty and wake one reconcile task, which restarts servers one at a
time with backoff; nothing else ever touches a server, so triggers that arrive
together cannot race each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.daemon.plugin import DevicePluginService
from rdma_hca.daemon.runtime import PoolRuntime
from rdma_hca.kit.aio import cancel_all, unless

log = logging.getLogger("rdma_hca.kubelet")

KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"
REGISTER_TIMEOUT = 15.0  # the kubelet dials us back inside Register with a 10 s timeout
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 5.0


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
    """One pool's gRPC server on its own unix socket."""

    def __init__(self, service: DevicePluginService, kubelet_dir: str) -> None:
        self.service = service
        self.path = os.path.join(kubelet_dir, socket_name(service.runtime.resource_name))
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Future[None] | None = None

    async def start(self) -> None:
        # A socket left by a process killed with -9 would make bind fail.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        server.add_insecure_port("unix://" + os.path.abspath(self.path))
        await server.start()
        self._server = server

    async def stop(self, grace: float = 0.5) -> None:
        """Stop once, even if called again or if the caller is cancelled meanwhile.

        An interrupted gRPC server shutdown, or a second one started beside it, fails
        inside gRPC ("invalid state"); so the shutdown runs as one task of its own.
        """
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace))
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float) -> None:
        self.service.stop()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class KubeletLifecycle:
    """Owns every pool's server; keeps each one registered with the kubelet."""

    def __init__(
        self,
        runtimes: list[PoolRuntime],
        kubelet_dir: str,
        *,
        resend_seconds: float = 30.0,
        backstop_seconds: float = 5.0,
        on_allocate: Callable[[str, float, bool], None] | None = None,
    ) -> None:
        self.runtimes = {r.resource_name: r for r in runtimes}
        self.kubelet_dir = kubelet_dir
        self.resend_seconds = resend_seconds
        self.backstop_seconds = backstop_seconds
        self.on_allocate = on_allocate
        self.servers: dict[str, PoolServer] = {}
        self._retired: list[PoolServer] = []
        self.registered: dict[str, bool] = dict.fromkeys(self.runtimes, False)
        self.registrations: dict[str, int] = dict.fromkeys(self.runtimes, 0)
        self.kubelet_restarts = 0
        self._wake = asyncio.Event()
        self._hurry = False
        self._tasks: list[asyncio.Task[None]] = []
        self._last_error: dict[str, str] = {}
        # What a pool's registration answers: which kubelet.sock it went to, when the
        # Register call began, and since when a new registration has been owed. Server
        # restarts are owed the same way, by time: a trigger that arrives while a server
        # is being replaced is answered by the server that replaces it, and only a trigger
        # newer than the serving server asks for another. (All times are monotonic ns.)
        self._registered_with: dict[str, KubeletId] = {}
        self._registered_at: dict[str, int] = {}
        self._need_since: dict[str, int] = {}
        self._restart_since: dict[str, int] = {}
        self._served_at: dict[str, int] = {}
        # The Register call in flight: its pool, the kubelet.sock it went to, and the
        # event that makes it give up.
        self._inflight: tuple[str, KubeletId, asyncio.Event] | None = None

    # --- triggers -------------------------------------------------------------------

    def request(self, resource: str | None, reason: str, *, hurry: bool = False) -> None:
        """Owe a fresh server and a registration to one pool (or all, with None)."""
        now = time.monotonic_ns()
        targets = list(self.runtimes) if resource is None else [resource]
        for r in targets:
            if self.registered[r] or not self._restart_owed(r):
                log.info("%s: serve and register again: %s", r, reason)
            self._restart_since[r] = now
            self.registered[r] = False
            self._need_since[r] = now
            self._abandon_register(r, reason)
        self._hurry = self._hurry or hurry
        self._wake.set()

    def kubelet_started(self) -> None:
        """kubelet.sock was created: pools registered with any other socket register again.

        Triggers of one kubelet restart (our socket removed, the stream ended, the new
        kubelet.sock) arrive in any order, some while a Register is in flight. A pool
        whose registration already went to this very socket is left alone, so a restart
        costs one registration, not one per trigger.
        """
        self.kubelet_restarts += 1
        kubelet = kubelet_id(self.kubelet_dir)
        if self._inflight is not None and self._inflight[1] != kubelet:
            self._abandon_register(self._inflight[0], "kubelet.sock was created anew")
        for r in self.runtimes:
            # Only a finished registration with another socket is stale; one in flight
            # is judged by the reconcile task when it returns.
            if self.registered[r] and self._registered_with.get(r) != kubelet:
                log.info("%s: serve and register again: kubelet.sock was created "
                         "(kubelet started)", r)
                self.registered[r] = False
        self._hurry = True
        self._wake.set()

    def _restart_owed(self, resource: str) -> bool:
        return self._restart_since.get(resource, -1) >= self._served_at.get(resource, 0)

    def _registering(self, resource: str) -> bool:
        return self._inflight is not None and self._inflight[0] == resource

    def _abandon_register(self, resource: str, reason: str) -> None:
        """Give up a Register in flight that can no longer succeed.

        The kubelet dials our socket inside Register and waits up to 10 s for it; when
        that socket was just removed, or another kubelet took over kubelet.sock, waiting
        would only delay the registration that works.
        """
        inflight = self._inflight
        if inflight is None or inflight[0] != resource or inflight[2].is_set():
            return
        log.info("%s: giving up the Register call in flight: %s", resource, reason)
        inflight[2].set()

    def _current(self, resource: str, kubelet: KubeletId | None) -> bool:
        """Registered with the kubelet behind ``kubelet`` and nothing owed since."""
        server = self.servers.get(resource)
        return (
            kubelet is not None
            and self._registered_with.get(resource) == kubelet
            and self._registered_at.get(resource, -1) > self._need_since.get(resource, 0)
            and not self._restart_owed(resource)
            and server is not None
            and os.path.exists(server.path)
        )

    def ready(self) -> bool:
        return all(self.registered.values())

    # --- tasks ----------------------------------------------------------------------

    async def start(self) -> None:
        self.request(None, "start")
        self._tasks = [
            asyncio.create_task(self._reconcile_loop(), name="reconcile"),
            asyncio.create_task(self._watch_dir(), name="watch-kubelet-dir"),
            asyncio.create_task(self._backstop(), name="backstop"),
        ]

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        self._tasks = []
        for server in [*self._retired, *self.servers.values()]:
            await server.stop()
        self._retired.clear()
        self.servers.clear()
        for r in self.registered:
            self.registered[r] = False

    def remove_sockets(self) -> None:
        """Last resort when a server will not stop: at least leave no socket behind."""
        for server in self.servers.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(server.path)

    async def _reconcile_loop(self) -> None:
        delay = 0.0
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._hurry:
                delay, self._hurry = 0.0, False
            failed = False
            for resource in sorted(self.runtimes):
                kubelet = kubelet_id(self.kubelet_dir)
                if self._current(resource, kubelet):
                    continue
                if self._registered_with.get(resource) not in (None, kubelet):
                    # A new kubelet: serve afresh, so nothing of the old one lingers.
                    self._restart_since[resource] = time.monotonic_ns()
                failed = not await self._serve_and_register(resource) or failed
            kubelet = kubelet_id(self.kubelet_dir)
            for resource in self.runtimes:
                self.registered[resource] = self._current(resource, kubelet)
            if self.ready():
                delay = 0.0
                continue
            if not failed:
                # Something changed while a Register was in flight: look again now.
                self._wake.set()
                continue
            delay = min(max(delay * 2, BACKOFF_FIRST), BACKOFF_MAX)
            # Retry after the delay, or at once when something new happens.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.set()

    async def _serve_and_register(self, resource: str) -> bool:
        current = self.servers.get(resource)
        fresh = (self._restart_owed(resource) or current is None
                 or not os.path.exists(current.path))
        # When only Register failed last time (no kubelet yet), the server is fine and
        # nobody has talked to it: keep it rather than churn the socket on every retry.
        if fresh and not await self._serve(resource):
            return False
        server = self.servers[resource]
        kubelet_path = os.path.join(self.kubelet_dir, KUBELET_SOCKET)
        before = kubelet_id(self.kubelet_dir)
        if before is None:
            self._note_failure(resource, f"waiting for the kubelet: {kubelet_path} does not "
                                         "exist")
            return False
        if not os.path.exists(server.path):
            # Removed while it was being served (a starting kubelet cleans the directory):
            # the kubelet could not dial it, so serve again before registering.
            return True
        started = time.monotonic_ns()
        give_up = asyncio.Event()
        self._inflight = (resource, before, give_up)
        try:
            call = await unless(register(self.kubelet_dir, os.path.basename(server.path),
                                         resource, server.service.options()),
                                give_up.wait())
        finally:
            self._inflight = None
        if call is None:
            return True  # given up: the loop looks again at once
        try:
            call.result()
        except grpc.aio.AioRpcError as exc:
            self._note_failure(
                resource, f"Register on {kubelet_path} failed: {exc.code().name}: "
                          f"{exc.details()}")
            return False
        self.registrations[resource] += 1
        self._last_error.pop(resource, None)
        log.info("%s: registered with the kubelet (endpoint %s)", resource,
                 os.path.basename(server.path))
        if kubelet_id(self.kubelet_dir) == before:
            self._registered_with[resource] = before
            self._registered_at[resource] = started
        # else kubelet.sock was replaced during the call: which kubelet answered is
        # unknown, so the pool stays owed and the loop registers it once more.
        return True

    async def _serve(self, resource: str) -> bool:
        runtime = self.runtimes[resource]
        old = self.servers.pop(resource, None)
        if old is not None:
            # Close the old server first: an old stream ending after the new
            # registration could otherwise disconnect the new one. Until it is closed
            # it stays known, so that shutting down mid-way still finishes it.
            self._retired.append(old)
            await old.stop()
            self._retired.remove(old)
        observe = self.on_allocate

        def on_allocate(seconds: float, ok: bool) -> None:
            if observe is not None:
                observe(resource, seconds, ok)

        service = DevicePluginService(
            runtime,
            resend_seconds=self.resend_seconds,
            on_stream_end=lambda: self.request(resource, "the kubelet's stream ended"),
            on_allocate=on_allocate,
        )
        server = PoolServer(service, self.kubelet_dir)
        served = time.monotonic_ns()
        try:
            await server.start()
        except (OSError, RuntimeError) as exc:
            self._note_failure(resource, f"cannot serve on {server.path}: {exc}")
            return False
        self.servers[resource] = server
        self._served_at[resource] = served
        return True

    def _note_failure(self, resource: str, message: str) -> None:
        # Logged once per distinct reason, not on every retry.
        if self._last_error.get(resource) != message:
            log.warning("%s: %s; retrying", resource, message)
            self._last_error[resource] = message

    async def _watch_dir(self) -> None:
        from asyncinotify import Inotify, Mask

        mask = (Mask.CREATE | Mask.DELETE | Mask.MOVED_TO | Mask.MOVED_FROM
                | Mask.DELETE_SELF | Mask.MOVE_SELF)
        ours = {socket_name(r): r for r in self.runtimes}
        while True:
            if not os.path.isdir(self.kubelet_dir):
                await asyncio.sleep(1.0)
                continue
            try:
                with Inotify() as inotify:
                    inotify.add_watch(self.kubelet_dir, mask)
                    async for event in inotify:
                        name = event.name.name if event.name is not None else None
                        if event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED):
                            self.request(None, f"{self.kubelet_dir} was removed")
                            break
                        created = bool(event.mask & (Mask.CREATE | Mask.MOVED_TO))
                        if name == KUBELET_SOCKET and created:
                            self.kubelet_started()
                        elif name in ours and not created:
                            resource = ours[name]
                            server = self.servers.get(resource)
                            # Our own restarts delete and re-create the file, so only a
                            # socket that is gone now counts, and only for a pool that is
                            # registered or registering (one being retried serves afresh
                            # anyway).
                            if ((self.registered[resource] or self._registering(resource))
                                    and server is not None
                                    and not os.path.exists(server.path)):
                                self.request(resource, f"our socket {name} was removed")
            except OSError as exc:
                log.warning("cannot watch %s (%s); polling it instead", self.kubelet_dir, exc)
                await asyncio.sleep(self.backstop_seconds)

    async def _backstop(self) -> None:
        """A slow poll in case an inotify event was lost (or inotify is unavailable)."""
        while True:
            await asyncio.sleep(self.backstop_seconds)
            for resource, server in list(self.servers.items()):
                if self.registered[resource] and not Path(server.path).exists():
                    self.request(resource, f"our socket {server.path} is gone")
            if not self.ready():
                self._wake.set()

