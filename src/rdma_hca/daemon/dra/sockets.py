"""The driver's two sockets for the kubelet: the DRA service and the registration.

As in the upstream kubelet plugin helper: the DRA service (``plugins/<driver>/``) is
served first, since the kubelet dials it as soon as it has read GetInfo; then the
registration socket in ``plugins_registry``, which the kubelet's plugin watcher finds.
Both are the one hardened unix-socket server of the kit (0600, path checked, requests
size-limited). Their directories are watched through inotify: a socket removed (a
kubelet wiping its directories) or replaced is served again at once, with backoff while
that fails, and a slow backstop check covers a lost event. With a pod UID both names
carry it (the helper's rolling-update mode), so a second instance serves beside this
one, and each instance only ever removes its own sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

import grpc

from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.service import RegistrationService, add_registration_service
from rdma_hca.kit.aio import cancel_all, wait_event
from rdma_hca.kit.dirwatch import watch_dir
from rdma_hca.kit.sayonce import Latch
from rdma_hca.kit.unixserver import UnixServer

log = logging.getLogger(__name__)

# The kubelet's largest request is a NodePrepareResources for one pod's claims: tens of
# claims of three short strings each, a few kB. 1 MiB leaves a wide margin; anything
# larger is refused by gRPC before it is decoded.
MAX_RECEIVE_BYTES = 1024 * 1024
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 5.0
STOP_WAIT = 1.0
HINT = "use a shorter kubelet root directory (--kubelet-root)"


class KubeletSockets:
    """``start()``, ``stop()``; ``registered`` follows the kubelet's answer."""

    def __init__(self, config: DriverConfig, add_dra: Callable[[grpc.aio.Server], None],
                 on_registered: Callable[[], None] | None = None) -> None:
        self.config = config
        self._add_dra = add_dra
        self.on_registered = on_registered
        self.registered = False
        self.registrations = 0
        self.serves = 0  # times a socket was (re)created, start included
        self._dra: UnixServer | None = None
        self._reg: UnixServer | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._failing = Latch()

    @property
    def endpoint(self) -> str:
        return self.config.endpoint

    @property
    def registration_socket(self) -> str:
        return self.config.registration_socket

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks)

    async def start(self) -> None:
        await self._serve_dra()
        await self._serve_registration()
        log.info("DRA driver %s serving at %s, registration socket %s",
                 self.config.driver_name, self.endpoint, self.registration_socket)
        self._tasks = [
            asyncio.create_task(self._watch(self.registration_socket), name="dra-watch-reg"),
            asyncio.create_task(self._watch(self.endpoint), name="dra-watch-plugin"),
            asyncio.create_task(self._keep(), name="dra-sockets"),
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cancel_all(tasks), STOP_WAIT)
        # The registration socket first, so the kubelet stops using the driver before the
        # service goes away.
        for server in (self._reg, self._dra):
            if server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.stop(0.2), STOP_WAIT)
                server.remove_socket()  # even when the stop did not finish
        self._reg = self._dra = None
        self.registered = False

    # --- serving ----------------------------------------------------------------------

    async def _serve_dra(self) -> None:
        old, self._dra = self._dra, None
        if old is not None:
            await old.stop(0.2)
        server = UnixServer(self.endpoint, self._add_dra, max_receive_bytes=MAX_RECEIVE_BYTES,
                            hint=HINT)
        await server.start()
        self._dra = server
        self.serves += 1

    async def _serve_registration(self) -> None:
        old, self._reg = self._reg, None
        if old is not None:
            await old.stop(0.2)
        service = RegistrationService(self.config.driver_name, self.endpoint, self._on_status)
        server = UnixServer(self.registration_socket,
                            lambda s: add_registration_service(s, service),
                            max_receive_bytes=MAX_RECEIVE_BYTES, hint=HINT)
        await server.start()
        self._reg = server
        self.serves += 1

    async def _on_status(self, registered: bool, error: str) -> None:
        if not registered:
            log.error("the kubelet refused the DRA driver registration: %s", error or "no reason")
            self.registered = False
            return
        self.registrations += 1
        self.registered = True
        log.info("registered with the kubelet (%d time(s))", self.registrations)
        if self.on_registered is not None:
            self.on_registered()

    # --- keeping them there -----------------------------------------------------------

    async def _watch(self, path: str) -> None:
        name = os.path.basename(path)
        async for event in watch_dir(os.path.dirname(path)):
            if event.watching or event.gone or event.name == name:
                self._wake.set()

    async def _keep(self) -> None:
        delay = 0.0
        while True:
            await wait_event(self._wake, delay or self.config.socket_check_seconds)
            self._wake.clear()
            dra_gone = self._dra is None or not self._dra.on_disk()
            reg_gone = self._reg is None or not self._reg.on_disk()
            if not (dra_gone or reg_gone):
                delay = 0.0
                continue
            if self._failing.reason is None:
                gone = [p for p, g in ((self.endpoint, dra_gone),
                                       (self.registration_socket, reg_gone)) if g]
                log.info("socket %s removed or replaced (kubelet restart?); serving and "
                         "registering again", ", ".join(gone))
            try:
                self.registered = False
                if dra_gone:
                    # The kubelet must dial the new service: registering again tells it.
                    await self._serve_dra()
                await self._serve_registration()
            except (OSError, RuntimeError) as exc:
                if self._failing.set(str(exc)):
                    log.error("cannot re-create the DRA sockets: %s; retrying", exc)
                delay = min(max(delay * 2, BACKOFF_FIRST), BACKOFF_MAX)
                continue
            if self._failing.clear():
                log.info("the DRA sockets are served again")
            delay = 0.0
