"""The kubelet's side of DRA, over the real sockets: plugin watcher, DRA calls, health.

Like the kubelet it watches ``<root>/plugins_registry`` for sockets (names starting with
a dot are ignored), calls ``GetInfo``, checks the plugin type and picks the newest DRA
service it knows, then ``NotifyRegistrationStatus``; it calls NodePrepareResources and
NodeUnprepareResources on the endpoint the plugin gave and holds the health stream open
(reopening it every ``health_retry`` seconds when it ends). As the 1.33+ kubelet does,
several registration sockets may name one driver (a rolling update): the newest is the
one called, and when its socket goes the kubelet goes back to the one registered before
it, still there, without wiping the driver's slices. ``restart()`` is a kubelet
restart: connections dropped, the registration sockets removed, and every ResourceSlice
of the node deleted through the API server, as a starting kubelet does. What the driver
answered for each claim is kept (``claims``, :mod:`.claiminfo`): ``container_devices``
says which CDI devices a container of a pod gets, as the kubelet decides it, and
``claim_resources`` shows each answer as the PodResources API reports it per container
(each device entry with its share ID).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import stat
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from rdma_hca.daemon._proto.dra import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    health_v1beta1_pb2,
    health_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from rdma_hca.devkit.dra.claiminfo import ClaimInfoCache

log = logging.getLogger(__name__)

DRA_SERVICES = {"v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
                "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}
HEALTH_SERVICES = {"v1.DRAResourceHealth": (health_v1_pb2, health_v1_pb2_grpc),
                   "v1beta1.DRAResourceHealth": (health_v1beta1_pb2, health_v1beta1_pb2_grpc),
                   "v1alpha1.DRAResourceHealth": (health_v1alpha1_pb2,
                                                  health_v1alpha1_pb2_grpc)}
CALL_TIMEOUT = 10.0
_CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


@dataclass
class Plugin:
    name: str
    endpoint: str
    service: str
    health_service: str | None
    socket: str
    channel: grpc.aio.Channel
    health_task: asyncio.Task[None] | None = None


@dataclass
class HealthUpdate:
    driver: str
    devices: dict[str, str]  # "pool/device" -> "HEALTHY", "UNHEALTHY", "UNKNOWN"


@dataclass
class KubeletEvents:
    registered: list[str] = field(default_factory=list)  # driver names, in order
    refused: list[str] = field(default_factory=list)  # why a plugin was refused
    health: list[HealthUpdate] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # back to an older instance


@dataclass(frozen=True)
class ClaimResource:
    """One device of a prepared claim as the PodResources API reports it per container."""

    driver: str
    pool: str
    device: str
    share_id: str | None  # None when the answer had none (field unset)
    cdi_devices: tuple[str, ...]


def _is_socket(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns) if stat.S_ISSOCK(st.st_mode) else None


class DraKubelet:
    def __init__(self, root: str, node_name: str, *, api_url: str | None = None,
                 api_token: str | None = None, poll_seconds: float = 0.02,
                 health_retry: float = 5.0, wipe_delay: float = 30.0,
                 services: Sequence[str] = tuple(DRA_SERVICES)) -> None:
        self.root = root
        self.registry = os.path.join(root, "plugins_registry")
        self.node_name = node_name
        self.api_url = api_url
        self.api_token = api_token
        self.poll_seconds = poll_seconds
        self.health_retry = health_retry
        self.wipe_delay = wipe_delay
        self.services = tuple(services)
        self.plugins: dict[str, Plugin] = {}  # by driver name: the one called
        self.standby: dict[str, list[Plugin]] = {}  # registered before it, oldest first
        self.events = KubeletEvents()
        self.claims = ClaimInfoCache()  # survives a restart, as the kubelet's checkpoint
        self.starts = 0
        self._seen: dict[str, tuple[int, int]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wipes: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()

    # --- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        os.makedirs(self.registry, exist_ok=True)
        os.makedirs(os.path.join(self.root, "plugins"), exist_ok=True)
        self.starts += 1
        await self.wipe_slices(None)
        self._task = asyncio.create_task(self._watch(), name="dra-kubelet-watch")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._wipes.values()) if t is not None]
        self._task = None
        self._wipes = {}
        for p in [*self.plugins.values(), *(q for ps in self.standby.values() for q in ps)]:
            await self._drop(p)
        self.plugins = {}
        self.standby = {}
        self._seen = {}
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

    async def restart(self) -> None:
        """A kubelet restart: forget every plugin, remove their sockets, wipe the slices."""
        await self.stop()
        for name in os.listdir(self.registry):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.registry, name))
        await self.start()

    async def wait_registered(self, driver: str, count: int = 1, timeout: float = 10.0) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.events.registered.count(driver) < count:
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            waiter = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({waiter}, timeout=left)
            finally:
                waiter.cancel()
        return True

    # --- plugin watcher --------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            try:
                names = os.listdir(self.registry)
            except OSError:
                names = []
            present: dict[str, tuple[int, int]] = {}
            for name in names:
                if name.startswith("."):
                    continue
                path = os.path.join(self.registry, name)
                ident = _is_socket(path)
                if ident is not None:
                    present[path] = ident
            for path in [p for p in self._seen if p not in present]:
                del self._seen[path]
                await self._deregister(path)
            for path, ident in present.items():
                if self._seen.get(path) != ident:
                    self._seen[path] = ident
                    await self._deregister(path)
                    await self._register(path)
            await asyncio.sleep(self.poll_seconds)

    async def _register(self, socket: str) -> None:
        channel = grpc.aio.insecure_channel("unix://" + socket, options=_CHANNEL_OPTIONS)
        try:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(),
                                      timeout=CALL_TIMEOUT)
            error = ""
            service = next((s for s in info.supported_versions if s in self.services), None)
            if info.type != "DRAPlugin":
                error = f"plugin type {info.type!r} is not handled here"
            elif service is None:
                error = (f"none of the services supported by the plugin "
                         f"({list(info.supported_versions)}) are supported by the kubelet")
            elif info.name in self.plugins and self.plugins[info.name].endpoint == info.endpoint \
                    and self.plugins[info.name].socket != socket:
                error = f"endpoint {info.endpoint} already registered for {info.name}"
            if not error:
                health = next((s for s in HEALTH_SERVICES if s in info.supported_versions), None)
                assert service is not None
                plugin = Plugin(info.name, info.endpoint, service, health, socket,
                                grpc.aio.insecure_channel("unix://" + info.endpoint,
                                                          options=_CHANNEL_OPTIONS))
                old = self.plugins.pop(info.name, None)
                if old is not None and old.socket != socket:
                    self.standby.setdefault(info.name, []).append(old)
                elif old is not None:
                    await self._drop(old)
                self.plugins[info.name] = plugin
                wipe = self._wipes.pop(info.name, None)
                if wipe is not None:
                    wipe.cancel()
                if health is not None:
                    plugin.health_task = asyncio.create_task(self._health(plugin),
                                                             name=f"health-{info.name}")
            await stub.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=not error,
                                                             error=error),
                timeout=CALL_TIMEOUT)
            if error:
                self.events.refused.append(error)
            else:
                self.events.registered.append(info.name)
            self._changed.set()
        except grpc.aio.AioRpcError as exc:
            self.events.refused.append(f"{socket}: {exc.code().name}: {exc.details()}")
            self._changed.set()
        finally:
            await channel.close(None)

    async def _deregister(self, socket: str) -> None:
        for name, waiting in list(self.standby.items()):
            for p in [p for p in waiting if p.socket == socket]:
                waiting.remove(p)
                await self._drop(p)
            if not waiting:
                del self.standby[name]
        for name, p in list(self.plugins.items()):
            if p.socket == socket:
                del self.plugins[name]
                await self._drop(p)
                earlier = self.standby.get(name)
                if earlier:
                    # Back to the instance registered before: its slices stay.
                    self.plugins[name] = earlier.pop()
                    if not earlier:
                        del self.standby[name]
                    self.events.fallbacks.append(name)
                    self._changed.set()
                elif self.wipe_delay >= 0:
                    self._wipes[name] = asyncio.create_task(self._wipe_later(name))

    async def _drop(self, p: Plugin) -> None:
        if p.health_task is not None:
            p.health_task.cancel()
            await asyncio.wait({p.health_task}, timeout=1.0)
        await p.channel.close(None)

    async def _wipe_later(self, driver: str) -> None:
        await asyncio.sleep(self.wipe_delay)
        self._wipes.pop(driver, None)
        await self.wipe_slices(driver)

    async def _health(self, p: Plugin) -> None:
        assert p.health_service is not None
        pb2, pb2_grpc = HEALTH_SERVICES[p.health_service]
        stub = pb2_grpc.DRAResourceHealthStub(p.channel)
        names = {v.number: v.name for v in pb2.HealthStatus.DESCRIPTOR.values}
        while True:
            try:
                async for resp in stub.NodeWatchResources(pb2.NodeWatchResourcesRequest()):
                    devices = {f"{d.device.pool_name}/{d.device.device_name}": names[d.health]
                               for d in resp.devices}
                    self.events.health.append(HealthUpdate(p.name, devices))
                    self._changed.set()
            except grpc.aio.AioRpcError as exc:
                log.debug("health stream of %s ended: %s", p.name, exc.code().name)
            await asyncio.sleep(self.health_retry)

    # --- DRA calls -------------------------------------------------------------------------

    def _stub(self, driver: str) -> tuple[Any, Any]:
        p = self.plugins.get(driver)
        if p is None:
            raise LookupError(f"DRA driver {driver} is not registered")
        pb2, pb2_grpc = DRA_SERVICES[p.service]
        return pb2, pb2_grpc.DRAPluginStub(p.channel)

    async def prepare(self, driver: str, claims: Sequence[tuple[str, str, str]]) -> Any:
        """NodePrepareResources for (namespace, uid, name) claims; returns the response."""
        pb2, stub = self._stub(driver)
        request = pb2.NodePrepareResourcesRequest(
            claims=[pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        response = await stub.NodePrepareResources(request, timeout=CALL_TIMEOUT)
        for claim in claims:
            if claim[1] in response.claims:
                self.claims.prepared(driver, claim, response.claims[claim[1]])
        return response

    async def unprepare(self, driver: str, claims: Sequence[tuple[str, str, str]]) -> Any:
        pb2, stub = self._stub(driver)
        request = pb2.NodeUnprepareResourcesRequest(
            claims=[pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        response = await stub.NodeUnprepareResources(request, timeout=CALL_TIMEOUT)
        for claim in claims:
            answer = response.claims.get(claim[1])
            if answer is not None and not answer.error:
                self.claims.unprepared(driver, claim)
        return response

    def claim_resources(self, uid: str) -> list[ClaimResource]:
        """A container's ``dynamicResources[].claimResources`` for a claim it names: every
        device entry of the claim's answer, each with its share ID."""
        info = self.claims.by_uid(uid)
        if info is None:
            return []
        return [ClaimResource(driver, d.pool, d.device, d.share_id, d.cdi_ids)
                for driver, devices in info.devices.items() for d in devices]

    def container_devices(self, pod: Mapping[str, Any], container: str) -> list[str]:
        """The CDI devices the kubelet starts ``container`` of ``pod`` (a Pod object) with,
        from what the drivers answered for its claims."""
        return self.claims.container_devices(pod, container)

    # --- the API server --------------------------------------------------------------------

    async def wipe_slices(self, driver: str | None) -> None:
        """Delete the node's ResourceSlices (of one driver, or all), as the kubelet does."""
        if self.api_url is None:
            return
        selector = f"spec.nodeName={self.node_name}"
        if driver is not None:
            selector += f",spec.driver={driver}"
        url = (f"{self.api_url}/apis/resource.k8s.io/v1/resourceslices?"
               + urllib.parse.urlencode({"fieldSelector": selector}))
        request = urllib.request.Request(url, method="DELETE")
        if self.api_token:
            request.add_header("Authorization", f"Bearer {self.api_token}")

        def call() -> None:
            with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as resp:
                json.load(resp)

        await asyncio.to_thread(call)
