"""Staying registered with the kubelet: serve, register, and do both again when needed.

The kubelet deletes every socket in its device-plugins directory when it starts,
creates ``kubelet.sock`` anew and never re-opens a ListAndWatch stream that ended.
So three things mean "serve and register again": ``kubelet.sock`` appearing, our
socket disappearing (or being replaced by another file), and the kubelet's stream
ending while we meant to serve. Other clients' streams do not count: the servicer
tells the kubelet's stream apart (see ``plugin.py``). All triggers only mark a
pool's :class:`Registration` as owed and wake one reconcile task, which restarts
servers one at a time with backoff; nothing else ever touches a server, so triggers
that arrive together cannot race each other.

Each pool's registration moves through its states like this::

    STOPPED --start--> OWED --serve, Register--> REGISTERING --ok, nothing newer owed-->
    REGISTERED --trigger--> OWED ...        (a failed or given-up call goes back to OWED)

A missing device-plugins directory is said once (with what to check) and then waited
for quietly, with the same backoff.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

import grpc

from rdma_hca.daemon.deviceplugin.plugin import DevicePluginService
from rdma_hca.daemon.deviceplugin.registration import (
    PoolServer,
    RegisterCall,
    Registration,
    State,
    kubelet_id,
    register,
    socket_name,
)
from rdma_hca.daemon.deviceplugin.runtime import PoolRuntime
from rdma_hca.kit.aio import cancel_all, unless, wait_event
from rdma_hca.kit.backoff import Backoff
from rdma_hca.kit.dirwatch import DirEvent, follow_dir
from rdma_hca.settings.model import KUBELET_SOCKET

log = logging.getLogger(__name__)

BACKOFF_FIRST = 0.05
BACKOFF_MAX = 5.0


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
        self.pools = {r.resource_name: Registration(r) for r in runtimes}
        self.kubelet_dir = kubelet_dir
        self.resend_seconds = resend_seconds
        self.backstop_seconds = backstop_seconds
        self.on_allocate = on_allocate
        self._retired: list[PoolServer] = []
        self.kubelet_restarts = 0
        self._wake = asyncio.Event()
        self._hurry = False
        self._tasks: list[asyncio.Task[None]] = []
        self._dir_missing = False
        self.failed_passes = 0  # reconcile passes that ended in a retry with backoff
        # The entry named by the last directory event handled: events come in order, so
        # once a file made after something has been seen, that something was handled too.
        self.last_dir_event: str | None = None

    # --- what others read ---------------------------------------------------------------

    @property
    def registered(self) -> dict[str, bool]:
        return {r: p.state is State.REGISTERED for r, p in self.pools.items()}

    @property
    def registrations(self) -> dict[str, int]:
        return {r: p.registrations for r, p in self.pools.items()}

    @property
    def servers(self) -> dict[str, PoolServer]:
        return {r: p.server for r, p in self.pools.items() if p.server is not None}

    def ready(self) -> bool:
        return all(p.state is State.REGISTERED for p in self.pools.values())

    # --- triggers -------------------------------------------------------------------

    def request(self, resource: str | None, reason: str, *, hurry: bool = False) -> None:
        """Owe a fresh server and a registration to one pool (or all, with None)."""
        now = time.monotonic_ns()
        targets = list(self.pools.values()) if resource is None else [self.pools[resource]]
        for p in targets:
            if p.state is State.REGISTERED or not p.restart_owed:
                log.info("%s: serve and register again: %s", p.resource, reason)
            if p.state is State.STOPPED:
                p.state = State.OWED
            p.owe(now)
            p.give_up(reason)
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
        for p in self.pools.values():
            if p.call is not None and p.call.kubelet != kubelet:
                p.give_up("kubelet.sock was created anew")
            # Only a finished registration with another socket is stale; one in flight
            # is judged by the reconcile task when it returns.
            if p.state is State.REGISTERED and p.registered_with != kubelet:
                log.info("%s: serve and register again: kubelet.sock was created "
                         "(kubelet started)", p.resource)
                p.state = State.OWED
        self._hurry = True
        self._wake.set()

    def _socket_changed(self, p: Registration, what: str) -> None:
        """Our socket was removed or replaced: serve again, if we were serving there.

        Our own restarts delete and re-create the file, so only a socket that is not
        ours now counts, and only for a pool that is registered or registering (one
        being retried serves afresh anyway).
        """
        if (p.state in (State.REGISTERED, State.REGISTERING) and p.server is not None
                and not p.server.on_disk()):
            self.request(p.resource, f"our socket {what}")

    # --- tasks ----------------------------------------------------------------------

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The lifecycle's running tasks, for the daemon's supervisor."""
        return list(self._tasks)

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
        for p in self.pools.values():
            p.server = None
            p.state = State.STOPPED

    def remove_sockets(self) -> None:
        """Last resort when a server will not stop: at least leave no socket behind."""
        for server in self.servers.values():
            server.remove_socket()

    async def _reconcile_loop(self) -> None:
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX)
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._hurry:
                backoff.reset()
                self._hurry = False
            failed = not self._dir_ready()
            if not failed:
                for resource in sorted(self.pools):
                    p = self.pools[resource]
                    kubelet = kubelet_id(self.kubelet_dir)
                    if p.current(kubelet):
                        continue
                    if p.registered_with not in (None, kubelet):
                        # A new kubelet: serve afresh, so nothing of the old one lingers.
                        p.restart_since = time.monotonic_ns()
                    failed = not await self._serve_and_register(p) or failed
            kubelet = kubelet_id(self.kubelet_dir)
            for p in self.pools.values():
                p.state = State.REGISTERED if p.current(kubelet) else State.OWED
            if self.ready():
                backoff.reset()
                continue
            if not failed:
                # Something changed while a Register was in flight: look again now.
                self._wake.set()
                continue
            self.failed_passes += 1
            # Retry after the backoff's wait, or at once when something new happens.
            await wait_event(self._wake, backoff.next())
            self._wake.set()

    def _dir_ready(self) -> bool:
        """The device-plugins directory exists; said once when it does not."""
        if os.path.isdir(self.kubelet_dir):
            if self._dir_missing:
                log.info("the kubelet's device-plugins directory %s exists now",
                         self.kubelet_dir)
                self._dir_missing = False
            return True
        if not self._dir_missing:
            log.warning(
                "the kubelet's device-plugins directory %s does not exist: is the kubelet "
                "running on this node, and do --kubelet-dir (or the kubelet root) point "
                "where it keeps its sockets? Waiting for it to appear", self.kubelet_dir)
            self._dir_missing = True
        return False

    async def _serve_and_register(self, p: Registration) -> bool:
        fresh = p.restart_owed or p.server is None or not p.server.on_disk()
        # When only Register failed last time (no kubelet yet), the server is fine and
        # nobody has talked to it: keep it rather than churn the socket on every retry.
        if fresh and not await self._serve(p):
            return False
        server = p.server
        assert server is not None
        kubelet_path = os.path.join(self.kubelet_dir, KUBELET_SOCKET)
        before = kubelet_id(self.kubelet_dir)
        if before is None:
            p.note_failure(f"waiting for the kubelet: {kubelet_path} does not exist")
            return False
        if not server.on_disk():
            # Removed while it was being served (a starting kubelet cleans the directory):
            # the kubelet could not dial it, so serve again before registering.
            return True
        started = time.monotonic_ns()
        p.call = RegisterCall(before)
        p.state = State.REGISTERING
        server.service.expect_kubelet()
        try:
            call = await unless(register(self.kubelet_dir, os.path.basename(server.path),
                                         p.resource, server.service.options()),
                                p.call.give_up.wait())
        finally:
            p.call = None
            p.state = State.OWED
        if call is None:
            return True  # given up: the loop looks again at once
        try:
            call.result()
        except grpc.aio.AioRpcError as exc:
            p.note_failure(f"Register on {kubelet_path} failed: {exc.code().name}: "
                           f"{exc.details()}")
            return False
        p.registrations += 1
        p.last_error = None
        log.info("%s: registered with the kubelet (endpoint %s)", p.resource,
                 os.path.basename(server.path))
        if kubelet_id(self.kubelet_dir) == before:
            p.registered_with = before
            p.registered_at = started
        # else kubelet.sock was replaced during the call: which kubelet answered is
        # unknown, so the pool stays owed and the loop registers it once more.
        return True

    async def _serve(self, p: Registration) -> bool:
        old, p.server = p.server, None
        if old is not None:
            # Close the old server first: an old stream ending after the new
            # registration could otherwise disconnect the new one. Until it is closed
            # it stays known, so that shutting down mid-way still finishes it.
            self._retired.append(old)
            await old.stop()
            self._retired.remove(old)
        observe = self.on_allocate
        resource = p.resource

        def on_allocate(seconds: float, ok: bool) -> None:
            if observe is not None:
                observe(resource, seconds, ok)

        service = DevicePluginService(
            p.runtime,
            resend_seconds=self.resend_seconds,
            on_stream_end=lambda: self.request(resource, "the kubelet's stream ended"),
            on_allocate=on_allocate,
        )
        server = PoolServer(service, self.kubelet_dir)
        served = time.monotonic_ns()
        try:
            await server.start()
        except (OSError, RuntimeError) as exc:
            p.note_failure(f"cannot serve on {server.path}: {exc}")
            return False
        p.server = server
        p.served_at = served
        return True

    async def _watch_dir(self) -> None:
        ours = {socket_name(r): p for r, p in self.pools.items()}

        def on_event(event: DirEvent) -> None:  # on the loop, as the watch reads it
            if event.watching:
                if self._dir_missing:
                    self._hurry = True
                    self._wake.set()
            elif event.gone:
                self.request(None, f"{self.kubelet_dir} was removed")
            elif event.name == KUBELET_SOCKET and event.created:
                self.kubelet_started()
            elif (pool := ours.get(event.name or "")) is not None:
                self._socket_changed(
                    pool, f"{event.name} was " + (
                        "removed" if event.removed else "replaced by another file"))
            self.last_dir_event = event.name

        await follow_dir(self.kubelet_dir, on_event, retry=self.backstop_seconds)

    async def _backstop(self) -> None:
        """A slow poll in case an inotify event was lost (or inotify is unavailable)."""
        while True:
            await asyncio.sleep(self.backstop_seconds)
            for p in self.pools.values():
                if p.state is State.REGISTERED and p.server is not None:
                    self._socket_changed(p, f"{p.server.path} is gone or replaced")
            if not self.ready():
                self._wake.set()
