"""The driver's two sockets for the kubelet: the DRA service and the registration.

As in the upstream kubelet plugin helper: the DRA service (``plugins/<driver>/``) is
served first, since the kubelet dials it as soon as it has read GetInfo; then the
registration socket in ``plugins_registry``, which the kubelet's plugin watcher finds.
Both are the one hardened unix-socket server of the kit (0600, path checked, requests
size-limited). Their directories are watched through inotify: a socket removed (a
kubelet wiping its directories) is served again at once, with backoff while that
fails, and a slow backstop check covers a lost event. With a pod UID both names carry
it (the helper's rolling-update mode), so a second instance serves beside this one,
and each instance only ever removes its own sockets.

One writer per socket path. Without a pod UID two instances would share both names
(a host run beside a leftover one, two units), and each taking its socket back from
the other is a fight without end: both re-registering, the kubelet re-dialling. So a
path that a live process serves (a connection to it succeeds) is never taken: at
start that refuses the start (:class:`SocketInUse`, exit status 2, naming the other
process), and while running, a DRA socket replaced by one that answers makes this
instance give way (:class:`SocketTaken`): it stops serving, removes its registration
socket, and its task ends, which stops the daemon with the exit status of the same
contest at start (2, its one line naming the other instance; ``daemon.supervise``). Not
kept running idle: it would go on publishing the node's slice beside the instance
that serves (a contest over the slice when their settings differ) and look alive
while serving nothing. Two instances that started at the same moment end with one
serving: whichever DRA socket is on the path is the one that stays. A registration
socket replaced by a live one while our DRA socket is ours is left alone: the other
instance gives way on its side, removing it, and ours is served again at once.

One driver per node. Without a pod UID an instance is not the chart's (a host run, a
unit), and two instances of one driver on a node prepare each other's claims with their
own settings: the kubelet calls the newest registration. So such an instance looks for
another live one of its driver whatever its socket names: a socket in the driver's plugin
directory that answers, or a registration socket whose GetInfo names the driver. Found at
start, the start is refused (:class:`SocketInUse`, exit status 2, its path and pid);
appearing while it runs (the chart's pod started beside a host run), this instance gives
way as above. With a pod UID nothing changes: a rolling update serves two on purpose.

Dead instances leave nothing behind. A process killed with -9 leaves its sockets, and
the kubelet keeps dialling a dead registration every few seconds. At start, and
whenever a new socket of this driver appears, sockets of this driver that refuse a
connection (nothing listens on them) are removed: only this driver's names, never one
that answers, never another driver's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import grpc

from rdma_hca.daemon._proto.dra import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from rdma_hca.daemon.dra.config import DRA_SOCKET, DriverConfig
from rdma_hca.daemon.dra.kubeletplugin.services import (
    RegistrationService,
    add_registration_service,
)
from rdma_hca.kit.aio import cancel_all, wait_event
from rdma_hca.kit.backoff import Backoff
from rdma_hca.kit.dirwatch import DirEvent, follow_dir
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
FIX = ("stop the other instance, or give each instance its own POD_UID (the pod's "
       "metadata.uid, as the chart sets it for a rolling update)")
NODE_FIX = ("one driver per node: stop one of them (an instance run by hand beside the "
            "chart's pod is the one to stop)")
GETINFO_TIMEOUT = 1.0
# A socket that has just appeared answers once its server has started: probed again a
# few times before it is taken for a dead one.
RIVAL_PROBES = (0.0, 0.05, 0.2, 0.5, 1.0)
# A pod UID as part of a socket name (as the driver's configuration checks it), and the
# shape of a Kubernetes UID.
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_KUBE_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class SocketInUse(Exception):
    """A live process serves one of our socket paths; the message names it and the fix."""


class SocketTaken(SocketInUse):
    """While running, our DRA socket was replaced by a live one: this instance gave way."""


@dataclass(frozen=True, slots=True)
class Peer:
    """A unix socket file and whether something listens on it."""

    ident: tuple[int, int]  # (device, inode) of the file probed
    alive: bool
    pid: int = 0  # of the listening process; 0 when unknown (another PID namespace)

    def who(self) -> str:
        return f"pid {self.pid}" if self.pid else "pid not known here"


def peer_at(path: str) -> Peer | None:
    """Who listens on the unix socket at ``path``; None when it is no socket (or gone).

    A non-blocking connect answers at once for a unix socket: accepted (alive: the pid
    comes from SO_PEERCRED), EAGAIN (alive: its backlog is full), ECONNREFUSED (dead:
    the file outlived its process). Any other error tells nothing: None.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    ident = (st.st_dev, st.st_ino)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK
                         | socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
        pid, _, _ = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        return Peer(ident, True, pid)
    except BlockingIOError:
        return Peer(ident, True)
    except ConnectionRefusedError:
        return Peer(ident, False)
    except OSError:
        return None
    finally:
        sock.close()


async def plugin_name(path: str, timeout: float = GETINFO_TIMEOUT) -> str | None:
    """The name GetInfo answers on the registration socket at ``path``; None when it does
    not answer as a plugin registration does."""
    channel = grpc.aio.insecure_channel("unix://" + path,
                                        options=[("grpc.use_local_subchannel_pool", 1)])
    try:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=timeout)
        return str(info.name)
    except (grpc.RpcError, OSError):
        return None
    finally:
        await channel.close(None)


def _sockets_in(directory: str) -> list[str]:
    """Paths of the names in ``directory`` that are not hidden (a server binding under a
    hidden name is not serving yet); empty when it cannot be read."""
    try:
        return [os.path.join(directory, n) for n in sorted(os.listdir(directory))
                if not n.startswith(".")]
    except OSError:
        return []


def _same_file(path: str, ident: tuple[int, int]) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == ident


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
        self.dead_removed = 0  # sockets of gone instances removed
        self.watches = 0  # watches of the two directories (re)started
        self.gave_way: str | None = None  # why this instance stopped serving
        self._dra: UnixServer | None = None
        self._reg: UnixServer | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._failing = Latch()
        self._waiting = Latch()  # our registration socket is another's, for now
        self._rival: tuple[str, Peer] | None = None  # another instance found while running
        self._checks: set[asyncio.Task[None]] = set()

    @property
    def endpoint(self) -> str:
        return self.config.endpoint

    @property
    def registration_socket(self) -> str:
        return self.config.registration_socket

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks)

    @property
    def waiting_for(self) -> str | None:
        """Our registration socket while another live instance holds its path."""
        return self._waiting.reason

    async def start(self) -> None:
        """Serve both sockets; :class:`SocketInUse` when a live process serves either."""
        for path in (self.endpoint, self.registration_socket):
            peer = peer_at(path)
            if peer is not None and peer.alive:
                raise SocketInUse(f"{path} is served by another instance of the DRA driver "
                                  f"{self.config.driver_name} ({peer.who()}): {FIX}")
        if not self.config.pod_uid:
            rival = await self.rival()
            if rival is not None:
                path, peer = rival
                raise SocketInUse(f"another instance of the DRA driver "
                                  f"{self.config.driver_name} already serves this node at "
                                  f"{path} ({peer.who()}): {NODE_FIX}")
        self.remove_dead()
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
        tasks, self._tasks = [*self._tasks, *self._checks], []
        self._checks.clear()
        # The keeper may have ended by giving way: said already, so its error is not raised.
        await cancel_all(tasks, within=STOP_WAIT, what="the DRA sockets' tasks")
        await self._close()
        self.registered = False

    async def _close(self) -> None:
        # The registration socket first, so the kubelet stops using the driver before the
        # service goes away. Each removes its socket only while it is still ours.
        for server in (self._reg, self._dra):
            if server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.stop(0.2), STOP_WAIT)
                server.remove_socket()  # even when the stop did not finish
        self._reg = self._dra = None

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

    # --- another instance of the driver on the node ---------------------------------------

    async def rival(self, paths: list[str] | None = None) -> tuple[str, Peer] | None:
        """Another live instance of this driver among ``paths`` (default: every socket of
        both directories): a socket of the plugin directory that answers, or a
        registration socket whose GetInfo names this driver. Never our own two."""
        plugin_dir = os.path.dirname(self.endpoint)
        if paths is None:
            paths = [*_sockets_in(plugin_dir),
                     *_sockets_in(os.path.dirname(self.registration_socket))]
        live: list[tuple[str, Peer]] = []
        for path in paths:
            if path in (self.endpoint, self.registration_socket):
                continue
            peer = peer_at(path)
            if peer is None or not peer.alive:
                continue
            if os.path.dirname(path) == plugin_dir:
                return path, peer
            live.append((path, peer))
        names = await asyncio.gather(*(plugin_name(p) for p, _ in live))
        return next((found for found, name in zip(live, names, strict=True)
                     if name == self.config.driver_name), None)

    def _check_new(self, path: str) -> None:
        """A name appeared in one of our directories: without a pod UID, look whether it
        is another instance of this driver (once its server answers)."""
        if self.config.pod_uid or path in (self.endpoint, self.registration_socket) \
                or os.path.basename(path).startswith("."):
            return
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                return  # the checkpoint and its temp files come and go here too
        except OSError:
            return
        task = asyncio.create_task(self._probe(path), name="dra-rival-check")
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _probe(self, path: str) -> None:
        for delay in RIVAL_PROBES:
            await asyncio.sleep(delay)
            peer = peer_at(path)
            if peer is None:
                return  # gone, or no socket
            if peer.alive:
                rival = await self.rival([path])
                if rival is not None and self._rival is None:
                    self._rival = rival
                    self._wake.set()
                return

    # --- keeping them there -----------------------------------------------------------

    async def _watch(self, path: str) -> None:
        directory, name = os.path.split(path)

        def on_event(event: DirEvent) -> None:  # on the loop, as the watch reads it
            if event.watching:
                self.watches += 1
                self.remove_dead()  # anything may have appeared while not watching
                for found in _sockets_in(directory):
                    self._check_new(found)
            if event.watching or event.gone or event.name == name:
                self._wake.set()
            elif event.created and event.name is not None:
                self._check_new(os.path.join(directory, event.name))
                if self._ours(directory, event.name):
                    # Another instance has started: any that are gone leave their sockets.
                    self.remove_dead(skip=os.path.join(directory, event.name))

        # A socket is never written: files closed after a write here are the checkpoint's
        # temp files, which would wake the loop while a Prepare's thread writes them. The
        # plugin directory's watch is shared with the checkpoint's follower.
        await follow_dir(directory, on_event, writes=False)

    async def _keep(self) -> None:
        delay = 0.0
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX)
        while True:
            await wait_event(self._wake, delay or self.config.socket_check_seconds)
            self._wake.clear()
            if self._rival is not None:
                where, other = self._rival
                await self._give_way(
                    f"another instance of the DRA driver {self.config.driver_name} started "
                    f"serving this node at {where} ({other.who()}); this instance, run "
                    f"without POD_UID, stops serving rather than serve beside it: "
                    f"{NODE_FIX}")
            dra_gone = self._dra is None or not self._dra.on_disk()
            reg_gone = self._reg is None or not self._reg.on_disk()
            if not (dra_gone or reg_gone):
                delay = 0.0
                continue
            if dra_gone:
                peer = peer_at(self.endpoint)
                if peer is not None and peer.alive:
                    await self._give_way(
                        f"{self.endpoint} was replaced by a socket that another instance "
                        f"of the DRA driver {self.config.driver_name} serves "
                        f"({peer.who()}); this instance stops serving the DRA driver "
                        f"rather than take it back: {FIX}")
            reg_taken = False
            if reg_gone:
                peer = peer_at(self.registration_socket)
                reg_taken = peer is not None and peer.alive
                if reg_taken and self._waiting.set(self.registration_socket):
                    log.warning("%s was replaced by a socket another instance serves (%s); "
                                "not taking it back while that one answers",
                                self.registration_socket, peer.who() if peer else "")
            if reg_taken and not dra_gone:
                delay = 0.0
                continue
            if self._failing.reason is None:
                gone = [p for p, g in ((self.endpoint, dra_gone),
                                       (self.registration_socket, reg_gone)) if g]
                log.info("socket %s removed (kubelet restart?); serving and registering "
                         "again", ", ".join(gone))
            try:
                if dra_gone:
                    await self._serve_dra()
                # The kubelet must dial a new service: registering again tells it (through
                # the other instance's registration, when it holds ours: same endpoint).
                if not reg_taken:
                    self.registered = False
                    await self._serve_registration()
                    self._waiting.clear()
            except (OSError, RuntimeError) as exc:
                if self._failing.set(str(exc)):
                    log.error("cannot re-create the DRA sockets: %s; retrying", exc)
                delay = backoff.next()
                continue
            if self._failing.clear():
                log.info("the DRA sockets are served again")
            backoff.reset()
            delay = 0.0

    async def _give_way(self, why: str) -> NoReturn:
        """Another live instance serves our DRA socket's path, or (without a pod UID) this
        node: stop here, never fight."""
        log.error("%s", why)
        self.gave_way = why
        self.registered = False
        await self._close()  # our registration socket goes; the other's stays
        raise SocketTaken(why)

    # --- sockets of instances that are gone -------------------------------------------

    def _ours(self, directory: str, name: str) -> bool:
        """A socket name this driver's instances use, in one of its two directories.

        In the plugin directory (this driver's own) every ``dra[-<uid>].sock`` is ours.
        In the shared registry, ``<driver>-<uid>-reg.sock`` could also be the socket of
        a driver whose name extends ours with a dash: it is taken as ours only when its
        UID has a Kubernetes UID's shape or its DRA socket is beside it in our directory.
        """
        if directory == os.path.dirname(self.endpoint):
            if name == DRA_SOCKET:
                return True
            return name.startswith("dra-") and name.endswith(".sock") and bool(
                _UID.match(name[len("dra-"):-len(".sock")]))
        if directory != os.path.dirname(self.registration_socket):
            return False
        driver = self.config.driver_name
        if name == f"{driver}-reg.sock":
            return True
        prefix, suffix = f"{driver}-", "-reg.sock"
        if not (name.startswith(prefix) and name.endswith(suffix)):
            return False
        uid = name[len(prefix):-len(suffix)]
        return bool(_UID.match(uid)) and (bool(_KUBE_UID.match(uid)) or os.path.lexists(
            os.path.join(os.path.dirname(self.endpoint), f"dra-{uid}.sock")))

    def remove_dead(self, skip: str | None = None) -> list[str]:
        """Remove this driver's sockets that refuse connections; the paths removed.

        The registry first: its names are recognised by their DRA socket beside them.
        A socket put on such a name between the probe and the removal is one its owner
        has just bound: its own watch serves it again at once.
        """
        removed = []
        own = {self.endpoint, self.registration_socket, skip}
        for directory in (os.path.dirname(self.registration_socket),
                          os.path.dirname(self.endpoint)):
            try:
                names = sorted(os.listdir(directory))
            except OSError:
                continue
            for name in names:
                path = os.path.join(directory, name)
                if path in own or not self._ours(directory, name):
                    continue
                peer = peer_at(path)
                if peer is None or peer.alive or not _same_file(path, peer.ident):
                    continue
                try:
                    os.unlink(path)
                except OSError:
                    continue
                log.info("removed %s: a socket of this driver that nothing listens on (its "
                         "instance is gone)", path)
                removed.append(path)
        self.dead_removed += len(removed)
        return removed
