"""The DRA driver at run time: sockets for the kubelet, the node's slice, prepared claims.

Three things run: the gRPC servers on two unix sockets (registration in the kubelet's
``plugins_registry``, the DRA and health services under ``plugins/<driver>/``), a
publisher task that keeps the node's ResourceSlice equal to the offer, and a socket
watch that re-creates the sockets when something (a kubelet wiping its directories)
removed them. The kubelet registering us (NotifyRegistrationStatus) makes the publisher
check the API server's copy again, since a starting kubelet deletes the node's slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import grpc

from rdma_hca.daemon.dra import files
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.devices import Offer
from rdma_hca.daemon.dra.files import PreparedClaim, PreparedDevice
from rdma_hca.daemon.dra.kubeapi import KubeApiError, SliceApi
from rdma_hca.daemon.dra.service import (
    ClaimRef,
    HealthBoard,
    PrepareResult,
    RegistrationService,
    add_dra_services,
    add_registration_service,
)
from rdma_hca.daemon.dra.slices import SliceClient, SlicePublisher
from rdma_hca.kit.aio import wait_event
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.node.model import CharDevice, Hca, NodeInventory

log = logging.getLogger("rdma_hca.dra")

BACKOFF_FIRST = 0.2
BACKOFF_MAX = 10.0
STOP_WAIT = 1.0
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class DraConfigError(ValueError):
    """The driver cannot run with this configuration; the message says how to fix it."""


class ApiClient(SliceClient, Protocol):
    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def close(self) -> None: ...


def check_config(config: DriverConfig) -> None:
    if not config.node_name:
        raise DraConfigError("the DRA driver needs the node's name: set --node-name or NODE_NAME "
                             "(the chart sets it from spec.nodeName)")
    if len(config.driver_name) > 63 or not _DNS_SUBDOMAIN.match(config.driver_name):
        raise DraConfigError(f"DRA driver name {config.driver_name!r} is not a lowercase DNS "
                             "subdomain of at most 63 characters, e.g. rdma-hca.io")
    if len(config.endpoint) > 107 or len(os.path.abspath(config.registration_socket)) > 107:
        raise DraConfigError(f"socket path {config.endpoint} is too long for a unix socket "
                             "(107 bytes at most): use a shorter kubelet root directory")


def _socket_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class DraDriver:
    """Construct, ``await start(inventory)``, feed ``update(inventory)``, ``await stop()``."""

    def __init__(self, config: DriverConfig, *, api: ApiClient | None = None) -> None:
        self.config = config
        self._api = api
        self._own_api = api is None
        self.taints = config.device_taints
        self.offer = Offer.build((), config.driver_name, config.mode, self.taints)
        self.rdma_cm: CharDevice | None = None
        self.board = HealthBoard(config.pool_name)
        self.prepared: dict[str, PreparedClaim] = {}
        self.publisher: SlicePublisher | None = None
        self.registrations = 0
        self.registered = False
        self.publish_error: str | None = None
        self.published = asyncio.Event()  # set after every successful publish pass
        self.publish_passes = 0  # successful publish passes, written or not
        self._publishing = False
        self._hcas: tuple[Hca, ...] = ()
        self._lock = asyncio.Lock()
        self._files = OffLoop(config.read_deadline)
        self._wake = asyncio.Event()
        self._check = True
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._servers: list[grpc.aio.Server] = []
        self._socket_ids: dict[str, tuple[int, int] | None] = {}

    # --- life cycle ------------------------------------------------------------------------

    @property
    def file_stalls(self) -> int:
        """Reads and writes of the driver's files that passed their deadline, ever."""
        return self._files.stalls_total

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The driver's running tasks, for the daemon's supervisor."""
        return list(self._tasks)

    async def start(self, inventory: NodeInventory | None = None) -> None:
        check_config(self.config)
        self._stopping = False
        await self._load_checkpoint()
        if self._api is None:
            self._api = await SliceApi.connect(self.config.kubeconfig, self.config.read_deadline)
        self.publisher = SlicePublisher(self._api, self.config.driver_name,
                                        self.config.node_name, self.config.pool_name)
        if inventory is not None:
            await self.update(inventory)
        await self._serve()
        self._tasks = [
            asyncio.create_task(self._publish_loop(), name="dra-publish"),
            asyncio.create_task(self._watch_sockets(), name="dra-sockets"),
        ]
        self._wake.set()

    async def stop(self) -> None:
        """Stop serving and remove our sockets; the slice stays (the kubelet wipes it later).

        Bounded: a task that does not end within STOP_WAIT is left behind (and named),
        so SIGTERM always ends with the sockets removed.
        """
        self._stopping = True
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=STOP_WAIT)
            if pending:
                log.error("DRA driver tasks still running after %g s: %s", STOP_WAIT,
                          ", ".join(t.get_name() for t in pending))
        await self._stop_servers()
        if self._api is not None and self._own_api:
            with contextlib.suppress(Exception):
                await self._api.close()
            self._api = None

    async def update(self, inventory: NodeInventory) -> None:
        """Take a new inventory: the slice and the health streams follow it."""
        hcas = tuple(h for h in inventory.hcas if self.config.selectors.matches(h))
        self._hcas = hcas
        self.rdma_cm = inventory.rdma_cm
        self._rebuild()
        await self.board.set(self.offer.health())

    @property
    def idle(self) -> bool:
        """No publish pass running or due (tests and benchmarks wait for this)."""
        return not self._publishing and not self._wake.is_set()

    def _rebuild(self) -> None:
        offer = Offer.build(self._hcas, self.config.driver_name, self.config.mode, self.taints)
        if offer.digest != self.offer.digest:
            self.offer = offer
            self._wake.set()

    # --- sockets ---------------------------------------------------------------------------

    async def _serve(self) -> None:
        endpoint = self.config.endpoint
        registration = os.path.abspath(self.config.registration_socket)
        for path in (endpoint, registration):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # A socket left by a process killed with -9 would make bind fail.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        # The DRA service first: the kubelet dials it as soon as it has read GetInfo.
        dra = grpc.aio.server()
        add_dra_services(dra, self, self.board)
        dra.add_insecure_port("unix://" + endpoint)
        await dra.start()
        self._servers.append(dra)
        reg = grpc.aio.server()
        add_registration_service(reg, RegistrationService(
            self.config.driver_name, endpoint, self._on_registration))
        reg.add_insecure_port("unix://" + registration)
        await reg.start()
        self._servers.append(reg)
        self._socket_ids = {p: _socket_id(p) for p in (endpoint, registration)}
        log.info("DRA driver %s serving at %s, registration socket %s",
                 self.config.driver_name, endpoint, registration)

    async def _stop_servers(self) -> None:
        # The registration socket first, so the kubelet stops using the driver before the
        # service goes away.
        for server in reversed(self._servers):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.stop(0.2), STOP_WAIT)
        self._servers = []
        for path in self._socket_ids:
            with contextlib.suppress(OSError):
                if _socket_id(path) == self._socket_ids[path]:
                    os.unlink(path)
        self._socket_ids = {}
        self.registered = False

    async def _watch_sockets(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.config.socket_check_seconds)
            gone = [p for p, ident in self._socket_ids.items() if _socket_id(p) != ident]
            if not gone:
                continue
            log.info("socket %s removed (kubelet restart?); serving and registering again",
                     ", ".join(gone))
            try:
                await self._stop_servers()
                await self._serve()
            except Exception as exc:
                # Next check tries again; the driver must not die of a missing directory.
                log.error("cannot re-create the DRA sockets: %s", exc)
                self._socket_ids = {p: None for p in gone}

    async def _on_registration(self, registered: bool, error: str) -> None:
        if not registered:
            log.error("the kubelet refused the DRA driver registration: %s", error or "no reason")
            self.registered = False
            return
        self.registrations += 1
        self.registered = True
        log.info("registered with the kubelet (%d time(s)); publishing the ResourceSlice",
                 self.registrations)
        # A starting kubelet deleted this node's slices: look at the server's copy again.
        self._check = True
        self._wake.set()

    # --- publishing ------------------------------------------------------------------------

    async def _publish_loop(self) -> None:
        assert self.publisher is not None
        backoff = BACKOFF_FIRST
        resync = self.config.resync_seconds or None
        while not self._stopping:
            if not await wait_event(self._wake, resync):
                self._check = True
            self._wake.clear()
            check, self._check = self._check, False
            self._publishing = True
            try:
                await self.publisher.publish(self.offer, check=check)
            except KubeApiError as exc:
                if exc.status == 422 and "taints" in str(exc) and self.taints:
                    log.warning("the API server refuses device taints (DRADeviceTaints off?); "
                                "marking down HCAs only by their linkState attribute")
                    self.taints = False
                    self._rebuild()
                    self._check = True
                    self._wake.set()
                    continue
                message = str(exc)
                if message != self.publish_error:
                    log.error("cannot publish the ResourceSlice: %s; retrying", message)
                self.publish_error = message
                self._check = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                self._wake.set()
                continue
            except Exception:
                log.exception("publishing the ResourceSlice failed; retrying")
                self._check = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                self._wake.set()
                continue
            finally:
                self._publishing = False
            if self.publish_error is not None:
                log.info("ResourceSlice published again")
            self.publish_error = None
            backoff = BACKOFF_FIRST
            self.publish_passes += 1
            self.published.set()

    # --- prepare / unprepare ---------------------------------------------------------------

    async def _io(self, func: Any, path: str, *args: Any) -> Any:
        """Blocking file work on ``path`` off the loop, with the configured deadline.

        On the daemon's own threads, not the loop's default executor: a write stuck on a
        hung filesystem would keep ``asyncio.run`` from returning at exit, and so SIGTERM
        from ending the process. While one is stuck, the next call of the same kind on the
        same path fails at once (``Stalled``) instead of leaving another thread behind.
        """
        return await self._files.run(f"{func.__name__} of {path}", lambda: func(path, *args))

    async def _load_checkpoint(self) -> None:
        path = self.config.checkpoint
        try:
            self.prepared = await self._io(files.load_checkpoint, path)
        except files.CheckpointError as exc:
            aside = path + ".corrupt"
            log.error("%s; moved aside to %s, starting with no prepared claims", exc, aside)
            with contextlib.suppress(OSError):
                await self._io(os.replace, path, aside)
            self.prepared = {}
        if self.prepared:
            log.info("%d prepared claim(s) in the checkpoint", len(self.prepared))

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        async with self._lock:
            before = dict(self.prepared)
            out: dict[str, PrepareResult] = {}
            for ref in claims:
                try:
                    out[ref.uid] = await self._prepare_one(ref)
                except Exception as exc:
                    log.warning("claim %s/%s (%s) not prepared: %s", ref.namespace, ref.name,
                                ref.uid, exc, extra={"claim": f"{ref.namespace}/{ref.name}"})
                    out[ref.uid] = PrepareResult(error=str(exc) or type(exc).__name__)
            if self.prepared != before:
                try:
                    await self._io(files.save_checkpoint, self.config.checkpoint, self.prepared)
                except Exception as exc:
                    # Without the checkpoint a restart would forget these claims: fail them.
                    for uid in set(self.prepared) - set(before):
                        out[uid] = PrepareResult(error=f"cannot write the checkpoint: {exc}")
                    self.prepared = before
            return out

    async def _prepare_one(self, ref: ClaimRef) -> PrepareResult:
        known = self.prepared.get(ref.uid)
        if known is not None:
            path = files.cdi_spec_path(self.config.cdi_spec_dir, self.config.driver_name, ref.uid)
            if not await self._io(os.path.exists, path):
                # /var/run is a tmpfs: after a reboot the spec is gone but the claim is not.
                await self._write_spec(ref.uid, {d.device: self._hca(d.device, d.hca)
                                                 for d in known.devices})
            return PrepareResult(known.devices)
        if self._api is None:
            raise RuntimeError("the driver is not started")
        claim = await self._api.get_claim(ref.namespace, ref.name)
        uid = claim.get("metadata", {}).get("uid")
        if uid != ref.uid:
            raise ValueError(f"ResourceClaim {ref.namespace}/{ref.name} has UID {uid}, not "
                             f"{ref.uid}: it was deleted and created again")
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = [r for r in (allocation.get("devices") or {}).get("results") or []
                   if r.get("driver") == self.config.driver_name]
        if not results:
            raise ValueError(f"ResourceClaim {ref.namespace}/{ref.name} has no device of "
                             f"driver {self.config.driver_name} allocated")
        chosen: dict[str, Hca] = {}
        devices: list[PreparedDevice] = []
        for r in results:
            if r.get("pool") != self.config.pool_name:
                raise ValueError(f"device {r.get('device')} was allocated from pool "
                                 f"{r.get('pool')}, not from this node's pool "
                                 f"{self.config.pool_name}")
            name = str(r.get("device"))
            hca = self._hca(name, None)
            chosen[name] = hca
            devices.append(PreparedDevice(
                (str(r.get("request", "")),), self.config.pool_name, name, hca.name,
                (files.cdi_id(self.config.driver_name, ref.uid, name),)))
        await self._write_spec(ref.uid, chosen)
        prepared = PreparedClaim(ref.namespace, ref.name, tuple(devices))
        self.prepared[ref.uid] = prepared
        log.info("claim %s/%s prepared: %s", ref.namespace, ref.name,
                 ", ".join(f"{d.device} ({d.hca})" for d in devices),
                 extra={"claim": f"{ref.namespace}/{ref.name}"})
        return PrepareResult(prepared.devices)

    def _hca(self, device: str, hca_name: str | None) -> Hca:
        hca = self.offer.hcas.get(device)
        if hca is None or (hca_name is not None and hca.name != hca_name):
            raise LookupError(f"device {device} ({hca_name or 'HCA'}) is no longer on this node")
        if not hca.usable:
            raise LookupError(f"device {device} ({hca.name}) cannot be used: "
                              f"{'; '.join(hca.problems) or 'its verbs device node is missing'}")
        return hca

    async def _write_spec(self, uid: str, devices: Mapping[str, Hca]) -> None:
        spec = files.claim_spec(self.config.driver_name, uid, devices, self.rdma_cm,
                                self.config.nccl_env)
        await self._io(files.write_claim_spec, self.config.cdi_spec_dir,
                       self.config.driver_name, uid, spec)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        async with self._lock:
            before = dict(self.prepared)
            out: dict[str, str] = {}
            for ref in claims:
                try:
                    # Removed even when unknown: a crash may fall between spec and checkpoint.
                    await self._io(files.remove_claim_spec, self.config.cdi_spec_dir,
                                   self.config.driver_name, ref.uid)
                    if self.prepared.pop(ref.uid, None) is not None:
                        log.info("claim %s/%s unprepared", ref.namespace, ref.name,
                                 extra={"claim": f"{ref.namespace}/{ref.name}"})
                    out[ref.uid] = ""
                except Exception as exc:
                    out[ref.uid] = f"cannot remove the CDI spec: {exc}"
            if self.prepared != before:
                try:
                    await self._io(files.save_checkpoint, self.config.checkpoint, self.prepared)
                except Exception as exc:
                    for uid in set(before) - set(self.prepared):
                        out[uid] = f"cannot write the checkpoint: {exc}"
                    self.prepared = before
            return out
