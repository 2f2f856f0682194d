"""A kubelet emulator for the device plugin protocol v1beta1.

There is no kubelet on the machines that run our tests, demo and benchmarks, yet the plugin's
hardest behaviour is its conversation with one: registering while already serving, the order of
calls inside ``Register``, a ListAndWatch stream whose end means "the kubelet went away", and a
kubelet restart that wipes the sockets. This module plays the kubelet's side of that conversation
over real unix sockets, in the kubelet's order, so the plugin's real code can be exercised
unchanged. The facts reproduced here are collected in ``kubelet-deviceplugin-api.md``.

It is a test double, not part of the daemon's serving path: nothing in the daemon imports it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from rdma_hca.daemon._proto.api_pb2_grpc import DevicePluginAsyncStub

__all__ = [
    "API_VERSION",
    "CHECKPOINT_NAME",
    "KUBELET_SOCKET",
    "AdmissionError",
    "KubeletEmulator",
    "format_quantity",
    "resource_name_problem",
]

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_NAME = "kubelet_internal_checkpoint"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
MAX_DEVICE_ID_LEN = 63
# sun_path is 108 bytes including the terminating NUL; a longer path cannot be bound or dialled.
UNIX_PATH_MAX = 107
# The kubelet gives PreStartContainer 30 s; Allocate and GetPreferredAllocation get no deadline.
PRE_START_TIMEOUT = 30.0
# Key the kubelet uses in its checkpoint for devices that report no NUMA node.
NO_NUMA_NODE = "-1"
_RECENT_EVENTS_IN_ERRORS = 12
_MAX_EVENTS = 10_000

# Unix sockets never go through a proxy, but an http_proxy in the environment can still make
# gRPC try one; short reconnect backoff lets a dial succeed soon after the plugin starts serving.
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.enable_http_proxy", 0),
    # Each registration gets its own connection, as a restarted kubelet process has:
    # gRPC otherwise shares one between channels to the same path, and closing an
    # old endpoint's channel could then end the new endpoint's stream.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_QUANTITY_SUFFIXES = {0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


class AdmissionError(RuntimeError):
    """The kubelet refused a pod or a container, with the reason it would show in pod status.

    ``reason`` is the pod status reason (``UnexpectedAdmissionError``, ``OutOf<resource>``,
    ``RunContainerError``); ``code`` is the gRPC status of the failed call into the plugin,
    if a call failed.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str = "UnexpectedAdmissionError",
        code: grpc.StatusCode | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


class _RegisterRefused(Exception):
    """Register must fail with this gRPC status; the message is what the plugin will log."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def resource_name_problem(name: str) -> str | None:
    """Say why ``name`` is not a valid extended resource name, or return None if it is.

    Mirrors the kubelet's ``IsExtendedResourceName``: ``domain/name`` outside the
    ``kubernetes.io`` domains, the domain a DNS subdomain, and ``requests.<name>`` a qualified
    name (so the name part is at most 63 characters).
    """
    fix = "use '<domain>/<name>' such as 'rdma/hca'"
    if "/" not in name:
        return f"resource name {name!r} has no domain; {fix}"
    if "kubernetes.io/" in name:
        return f"resource name {name!r} is in a kubernetes.io domain, reserved for native resources"
    if name.startswith("requests."):
        return f"resource name {name!r} must not start with 'requests.'"
    domain, _, short = name.partition("/")
    if "/" in short:
        return f"resource name {name!r} has more than one '/'; {fix}"
    if not domain or len(domain) > 253 or not _DNS1123_SUBDOMAIN.match(domain):
        return (
            f"resource name {name!r}: domain {domain!r} is not a DNS subdomain "
            "(lowercase letters, digits, '-' and '.', at most 253 characters)"
        )
    if not short or len(short) > 63 or not _QUALIFIED_NAME_PART.match(short):
        return (
            f"resource name {name!r}: name {short!r} is not a qualified name (at most 63 "
            "characters: letters, digits, '-', '_' or '.', starting and ending alphanumeric)"
        )
    return None


def format_quantity(value: int) -> str:
    """Print a count the way ``kubectl`` prints a decimal Kubernetes Quantity.

    The canonical form moves trailing zeros into an SI suffix only in whole groups of three,
    which is why 1000 slots show as ``1k`` but 1500 stays ``1500``.
    """
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, exponent = abs(value), 0
    while mantissa % 1000 == 0 and exponent < 18:
        mantissa //= 1000
        exponent += 3
    return f"{sign}{mantissa}{_QUANTITY_SUFFIXES[exponent]}"


def _go_code(code: grpc.StatusCode) -> str:
    """Status code as grpc-go prints it (``InvalidArgument``), to match kubelet messages."""
    return "".join(part.capitalize() for part in code.name.split("_"))


def _rpc_error_text(err: grpc.aio.AioRpcError) -> str:
    return f"rpc error: code = {_go_code(err.code())} desc = {err.details() or ''}"


def _endpoint_problem(endpoint: str) -> str | None:
    if not endpoint:
        return "endpoint is empty; set it to the file name of the plugin's socket, e.g. 'rdma.sock'"
    if "/" in endpoint or endpoint in (".", ".."):
        return (
            f"endpoint {endpoint!r} must be a bare file name inside the device-plugins "
            "directory, not a path"
        )
    if endpoint in (KUBELET_SOCKET, CHECKPOINT_NAME):
        return f"endpoint {endpoint!r} is the kubelet's own file; serve the plugin on another name"
    return None


@dataclass(eq=False)
class _Endpoint:
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
class _Resource:
    """What the kubelet knows about one extended resource."""

    devices: dict[str, api_pb2.Device] = field(default_factory=dict)
    endpoint: _Endpoint | None = None
    # False from stream end (or kubelet stop) until the next list: every device counts unhealthy.
    usable: bool = False
    registrations: int = 0


@dataclass
class _PodDevices:
    pod_uid: str
    container: str
    resource: str
    ids: list[str]
    response: api_pb2.ContainerAllocateResponse


class _RegistrationService(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletEmulator) -> None:
        self._kubelet = kubelet

    async def Register(
        self,
        request: api_pb2.RegisterRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> api_pb2.Empty:
        return await self._kubelet._handle_register(request, context)


class KubeletEmulator:
    """The kubelet's half of the device plugin protocol, on ``<plugin_dir>/kubelet.sock``.

    State (capacity, allocatable, device lists, events) is readable at any time; ``wait_for``
    lets a test block until it reaches some shape without polling.

    By default a new registration of a resource cancels the old stream. With
    ``old_stream_disconnects_new=True`` the emulator instead behaves like kubelet 1.26 and later,
    which leave the old stream running and, when it ends, disconnect whatever registration is
    current for the resource: the reason a plugin must close its old server before registering
    again, and the way to test that it does.
    """

    def __init__(
        self,
        plugin_dir: str | os.PathLike[str],
        *,
        dial_timeout: float = 10.0,
        old_stream_disconnects_new: bool = False,
    ) -> None:
        if dial_timeout <= 0:
            raise ValueError(f"dial_timeout must be positive seconds, got {dial_timeout!r}")
        self._dir = Path(plugin_dir).absolute()
        self._dial_timeout = dial_timeout
        self._strict_disconnect = old_stream_disconnects_new
        # Superseded registrations still streaming (only with old_stream_disconnects_new).
        self._superseded: set[_Endpoint] = set()
        self._server: grpc.aio.Server | None = None
        self._resources: dict[str, _Resource] = {}
        self._pods: list[_PodDevices] = []
        self._events: deque[str] = deque(maxlen=_MAX_EVENTS)
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._serial = 0
        self._pod_serial = 0
        self._checkpoint_loaded = False

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def plugin_dir(self) -> Path:
        return self._dir

    @property
    def socket_path(self) -> Path:
        return self._dir / KUBELET_SOCKET

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Listen on a fresh ``kubelet.sock`` and serve ``v1beta1.Registration``."""
        if self._server is not None:
            raise RuntimeError("the kubelet emulator is already running; call stop() first")
        sock = self.socket_path
        if len(str(sock).encode()) > UNIX_PATH_MAX:
            raise ValueError(
                f"socket path {str(sock)!r} is {len(str(sock).encode())} bytes, over the unix "
                f"socket limit of {UNIX_PATH_MAX}; use a shorter plugin_dir"
            )
        self._dir.mkdir(parents=True, exist_ok=True)
        if sock.is_dir():
            raise ValueError(f"{sock} is a directory; remove it so the kubelet can listen there")
        # A kubelet that died leaves its socket file behind; binding needs the name free.
        sock.unlink(missing_ok=True)
        if not self._checkpoint_loaded:
            self._load_checkpoint()
            self._checkpoint_loaded = True
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_RegistrationService(self), server)
        try:
            server.add_insecure_port(f"unix://{sock}")
        except RuntimeError as err:
            await server.stop(None)
            raise OSError(
                f"cannot listen on {sock}: {err}; check the directory is writable"
            ) from err
        await server.start()
        self._server = server
        await self._note(f"kubelet listening on {sock}")

    async def stop(self) -> None:
        """Go away like a kubelet process: close the server and every plugin connection.

        Devices stay in capacity but none is allocatable until a plugin registers again and
        sends a list, as after a real kubelet restart.
        """
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)
        for resource in self._resources.values():
            endpoint, resource.endpoint = resource.endpoint, None
            resource.usable = False
            if endpoint is not None:
                await self._close_endpoint(endpoint)
        for endpoint in list(self._superseded):
            await self._close_endpoint(endpoint)
        self._superseded.clear()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if server is not None:
            await self._note("kubelet stopped")

    async def restart(self, delay: float = 0.0) -> None:
        """Stop, clean the directory as a starting kubelet does, wait ``delay``, start again."""
        await self.stop()
        self._clean_plugin_dir()
        if delay > 0:
            await asyncio.sleep(delay)
        await self.start()

    async def __aenter__(self) -> KubeletEmulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _clean_plugin_dir(self) -> None:
        """Delete every non-directory entry except the checkpoint, as the kubelet does on start.

        Like the kubelet this follows symlinks when deciding what is a directory. Plugins rely
        on this: their own socket vanishing is how they learn the kubelet restarted.
        """
        if not self._dir.is_dir():
            return
        for entry in os.scandir(self._dir):
            if entry.name == CHECKPOINT_NAME or entry.is_dir():
                continue
            try:
                os.unlink(entry.path)
            except OSError as err:
                self._record(f"could not remove {entry.path} while restarting: {err}")

    # -- state -------------------------------------------------------------------------

    def resources(self) -> list[str]:
        return sorted(self._resources)

    def capacity(self, resource: str) -> int:
        """All devices of the latest list; kept after the stream ends."""
        state = self._resources.get(resource)
        return len(state.devices) if state else 0

    def allocatable(self, resource: str) -> int:
        """Healthy devices of the latest list; 0 while no live stream backs them."""
        state = self._resources.get(resource)
        if state is None or not state.usable:
            return 0
        return sum(1 for d in state.devices.values() if d.health == HEALTHY)

    def devices(self, resource: str) -> list[api_pb2.Device]:
        """The latest device list (copies; devices the kubelet would reject are left out)."""
        state = self._resources.get(resource)
        if state is None:
            return []
        copies = []
        for device in state.devices.values():
            copy = api_pb2.Device()
            copy.CopyFrom(device)
            copies.append(copy)
        return copies

    def registrations(self, resource: str) -> int:
        state = self._resources.get(resource)
        return state.registrations if state else 0

    def options(self, resource: str) -> api_pb2.DevicePluginOptions | None:
        """The options from GetDevicePluginOptions of the current registration, if any."""
        state = self._resources.get(resource)
        if state is None or state.endpoint is None:
            return None
        copy = api_pb2.DevicePluginOptions()
        copy.CopyFrom(state.endpoint.options)
        return copy

    def allocated(self, resource: str) -> set[str]:
        """Device IDs handed to containers and not released (restored from the checkpoint)."""
        return {i for pod in self._pods if pod.resource == resource for i in pod.ids}

    def node_status(self) -> dict[str, dict[str, str]]:
        """The node's ``status.capacity`` / ``status.allocatable`` for our resources."""
        return {
            "capacity": {r: format_quantity(self.capacity(r)) for r in self.resources()},
            "allocatable": {r: format_quantity(self.allocatable(r)) for r in self.resources()},
        }

    def events(self) -> list[str]:
        return list(self._events)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Return once ``predicate()`` holds, re-checking on every state change.

        Raises TimeoutError naming the recent events, which usually show why the state never
        arrived (a rejected registration, an ended stream).
        """
        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(predicate)
        except TimeoutError:
            name = getattr(predicate, "__qualname__", repr(predicate))
            recent = list(self._events)[-_RECENT_EVENTS_IN_ERRORS:]
            lines = "\n  ".join(recent) if recent else "(none)"
            raise TimeoutError(
                f"kubelet emulator: condition {name} still false after {timeout:g} s; "
                f"recent events:\n  {lines}"
            ) from None

    def _record(self, message: str) -> None:
        self._events.append(message)

    async def _note(self, message: str) -> None:
        """Record an event and wake every waiter: all state changes go through here."""
        self._record(message)
        async with self._changed:
            self._changed.notify_all()

    def _state(self, resource: str) -> _Resource:
        return self._resources.setdefault(resource, _Resource())

    # -- registration ------------------------------------------------------------------

    async def _handle_register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        try:
            endpoint = await self._admit_registration(request)
        except _RegisterRefused as refused:
            await self._note(f"registration of {request.resource_name!r} rejected: {refused}")
            await context.abort(refused.code, str(refused))
        state = self._state(endpoint.resource)
        old, state.endpoint = state.endpoint, endpoint
        state.registrations += 1
        if old is not None and self._strict_disconnect and not (old.ended or old.closing):
            self._superseded.add(old)
        elif old is not None:
            await self._close_endpoint(old)
        # The kubelet starts reading ListAndWatch only after Register has returned.
        # grpc-stubs types the callback as a class; any callable taking the context works.
        context.add_done_callback(
            lambda _ctx: self._start_reader(endpoint)  # type: ignore[arg-type]
        )
        opts = endpoint.options
        await self._note(
            f"registered {endpoint.resource} at {endpoint.target} (registration "
            f"{state.registrations}; pre_start_required={opts.pre_start_required}, "
            f"get_preferred_allocation_available={opts.get_preferred_allocation_available})"
        )
        return api_pb2.Empty()

    async def _admit_registration(self, request: api_pb2.RegisterRequest) -> _Endpoint:
        """Validate, then dial and ask for options, in the kubelet's order."""
        if request.version != API_VERSION:
            raise _RegisterRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"requested API version {request.version!r} is not supported by kubelet. "
                f"Supported versions are [{API_VERSION!r}]",
            )
        problem = resource_name_problem(request.resource_name)
        if problem is not None:
            raise _RegisterRefused(grpc.StatusCode.INVALID_ARGUMENT, problem)
        problem = _endpoint_problem(request.endpoint)
        if problem is not None:
            raise _RegisterRefused(grpc.StatusCode.INVALID_ARGUMENT, problem)
        return await self._dial(request.resource_name, self._dir / request.endpoint)

    async def _dial(self, resource: str, path: Path) -> _Endpoint:
        target = f"unix://{path}"
        if len(str(path).encode()) > UNIX_PATH_MAX:
            raise _RegisterRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"socket path {str(path)!r} is over the unix socket limit of {UNIX_PATH_MAX} "
                "bytes; use a shorter directory or endpoint name",
            )
        channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        try:
            try:
                await asyncio.wait_for(channel.channel_ready(), self._dial_timeout)
            except TimeoutError:
                raise _RegisterRefused(
                    grpc.StatusCode.UNAVAILABLE,
                    f"failed to dial device plugin at {target}: nothing answered within "
                    f"{self._dial_timeout:g} s; serve the plugin's gRPC server on that socket "
                    "before calling Register",
                ) from None
            stub: DevicePluginAsyncStub = api_pb2_grpc.DevicePluginStub(channel)
            try:
                options = await stub.GetDevicePluginOptions(
                    api_pb2.Empty(), timeout=self._dial_timeout
                )
            except grpc.aio.AioRpcError as err:
                raise _RegisterRefused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"failed to get device plugin options from {target}: {_rpc_error_text(err)}",
                ) from None
        except BaseException:
            await channel.close(None)
            raise
        self._serial += 1
        return _Endpoint(resource, target, channel, stub, options, self._serial)

    def _start_reader(self, endpoint: _Endpoint) -> None:
        state = self._resources.get(endpoint.resource)
        if self._server is None or state is None or state.endpoint is not endpoint:
            return
        if endpoint.closing or endpoint.reader is not None:
            return
        task = asyncio.get_running_loop().create_task(self._read_stream(endpoint))
        endpoint.reader = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close_endpoint(self, endpoint: _Endpoint) -> None:
        """Drop a registration we no longer want, without counting it as a plugin failure."""
        endpoint.closing = True
        reader = endpoint.reader
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        await endpoint.channel.close(None)

    # -- ListAndWatch ------------------------------------------------------------------

    async def _read_stream(self, endpoint: _Endpoint) -> None:
        await self._note(f"ListAndWatch started for {endpoint.resource} at {endpoint.target}")
        call = endpoint.stub.ListAndWatch(api_pb2.Empty())
        try:
            async for response in call:
                await self._apply_list(endpoint, response)
            reason = "the plugin closed the stream"
        except grpc.aio.AioRpcError as err:
            reason = _rpc_error_text(err)
        finally:
            call.cancel()
        if endpoint.closing:
            return
        if endpoint in self._superseded:
            await self._superseded_stream_ended(endpoint, reason)
            return
        await self._stream_ended(endpoint, reason)

    async def _apply_list(
        self, endpoint: _Endpoint, response: api_pb2.ListAndWatchResponse
    ) -> None:
        state = self._resources.get(endpoint.resource)
        if state is None or state.endpoint is not endpoint or endpoint.closing:
            return
        devices: dict[str, api_pb2.Device] = {}
        for device in response.devices:
            if not device.ID or len(device.ID) > MAX_DEVICE_ID_LEN:
                self._record(
                    f"{endpoint.resource}: ignored device ID {device.ID!r} "
                    f"({len(device.ID)} characters; must be 1 to {MAX_DEVICE_ID_LEN})"
                )
                continue
            if device.ID in devices:
                self._record(f"{endpoint.resource}: device ID {device.ID!r} listed twice")
            copy = api_pb2.Device()
            copy.CopyFrom(device)
            devices[device.ID] = copy
        state.devices = devices
        state.usable = True
        healthy = sum(1 for d in devices.values() if d.health == HEALTHY)
        await self._note(
            f"list update for {endpoint.resource}: {len(devices)} devices, {healthy} healthy"
        )

    async def _stream_ended(self, endpoint: _Endpoint, reason: str) -> None:
        """The plugin went away: every device counts unhealthy at once and stays counted.

        The kubelet never re-opens an ended stream; only a new registration brings the
        resource back.
        """
        endpoint.ended = True
        state = self._resources.get(endpoint.resource)
        current = state is not None and state.endpoint is endpoint
        if state is not None and current:
            state.usable = False
        await endpoint.channel.close(None)
        kept = len(state.devices) if state is not None else 0
        await self._note(
            f"ListAndWatch stream for {endpoint.resource} ended ({reason}); all {kept} devices "
            "marked unhealthy until the plugin registers again"
        )

    async def _superseded_stream_ended(self, old: _Endpoint, reason: str) -> None:
        """Kubelet >= 1.26: an old stream ending disconnects the resource's current client."""
        self._superseded.discard(old)
        old.ended = True
        await old.channel.close(None)
        state = self._resources.get(old.resource)
        current = state.endpoint if state is not None else None
        if state is None or current is None or current.ended or current.closing:
            await self._note(f"superseded ListAndWatch stream for {old.resource} ended ({reason})")
            return
        current.ended = True
        current.closing = True  # its own stream end is this same disconnect, not a new one
        state.usable = False
        reader = current.reader
        if reader is not None:
            reader.cancel()
        await current.channel.close(None)
        await self._note(
            f"superseded ListAndWatch stream for {old.resource} at {old.target} ended "
            f"({reason}) and disconnected the current registration at {current.target}; all "
            f"{len(state.devices)} devices marked unhealthy until the plugin registers again"
        )

    # -- calls into the plugin ---------------------------------------------------------

    def _live_endpoint(self, resource: str) -> _Endpoint:
        state = self._resources.get(resource)
        if state is None or state.endpoint is None:
            raise AdmissionError(
                f"unknown device plugin {resource}: no plugin is registered for it",
            )
        endpoint = state.endpoint
        if endpoint.ended or endpoint.closing:
            raise AdmissionError(
                f"endpoint for {resource} ({endpoint.target}) has been stopped: its ListAndWatch "
                "stream ended; the plugin must register again",
            )
        return endpoint

    async def allocate(
        self,
        resource: str,
        container_requests: list[list[str]],
        *,
        pod_uid: str | None = None,
    ) -> api_pb2.AllocateResponse:
        """Call Allocate with one container request per list and checkpoint the result."""
        endpoint = self._live_endpoint(resource)
        request = api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in container_requests
            ]
        )
        try:
            response = await endpoint.stub.Allocate(request)
        except grpc.aio.AioRpcError as err:
            await self._note(f"Allocate for {resource} failed: {_rpc_error_text(err)}")
            raise AdmissionError(
                f"Allocate failed due to {_rpc_error_text(err)}, which is unexpected",
                code=err.code(),
            ) from None
        if len(response.container_responses) != len(container_requests):
            await self._note(
                f"Allocate for {resource} returned {len(response.container_responses)} "
                f"container responses for {len(container_requests)} containers"
            )
            raise AdmissionError(
                f"Allocate failed due to the plugin returning {len(response.container_responses)}"
                f" container responses for {len(container_requests)} container requests, "
                "which is unexpected"
            )
        self._pod_serial += 1
        uid = pod_uid or f"emulated-pod-{self._pod_serial:05d}"
        for index, ids in enumerate(container_requests):
            self._pods.append(
                _PodDevices(
                    uid, f"c{index}", resource, list(ids), response.container_responses[index]
                )
            )
        self._write_checkpoint()
        await self._note(
            f"allocated {resource} to pod {uid}: "
            + "; ".join(",".join(ids) for ids in container_requests)
        )
        return response

    async def get_preferred_allocation(
        self, resource: str, available: list[str], must_include: list[str], size: int
    ) -> list[str]:
        """Ask the plugin which ``size`` of ``available`` it prefers for one container."""
        endpoint = self._live_endpoint(resource)
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must_include,
                    allocation_size=size,
                )
            ]
        )
        try:
            response = await endpoint.stub.GetPreferredAllocation(request)
        except grpc.aio.AioRpcError as err:
            await self._note(
                f"GetPreferredAllocation for {resource} failed: {_rpc_error_text(err)}"
            )
            raise AdmissionError(
                f"Allocate failed due to device plugin GetPreferredAllocation rpc failed with "
                f"err: {_rpc_error_text(err)}, which is unexpected",
                code=err.code(),
            ) from None
        if not response.container_responses:
            return []
        return list(response.container_responses[0].deviceIDs)

    async def pre_start_container(self, resource: str, ids: list[str]) -> None:
        endpoint = self._live_endpoint(resource)
        try:
            await endpoint.stub.PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=ids), timeout=PRE_START_TIMEOUT
            )
        except grpc.aio.AioRpcError as err:
            await self._note(f"PreStartContainer for {resource} failed: {_rpc_error_text(err)}")
            raise AdmissionError(
                f"device plugin PreStartContainer rpc failed with err: {_rpc_error_text(err)}",
                reason="RunContainerError",
                code=err.code(),
            ) from None
        await self._note(f"PreStartContainer for {resource}: {','.join(ids)}")

    async def admit_pod(
        self,
        resource: str,
        count: int,
        *,
        pod_uid: str | None = None,
        start_container: bool = True,
    ) -> api_pb2.ContainerAllocateResponse:
        """Admit (and, by default, start) one container asking ``count`` of ``resource``.

        Picks healthy IDs not yet allocated, letting the plugin choose among them when it
        offers GetPreferredAllocation and there is a choice to make; then Allocate, and
        PreStartContainer if the plugin asked for it.
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        state = self._resources.get(resource)
        if state is None or not state.devices:
            raise AdmissionError(
                f"Node didn't have enough resource: {resource}, requested: {count}, used: 0, "
                "capacity: 0",
                reason=f"OutOf{resource}",
            )
        available = self._free_healthy(resource)
        if len(available) < count:
            raise AdmissionError(
                f"Allocate failed due to requested number of devices unavailable for {resource}."
                f" Requested: {count}, Available: {len(available)}, which is unexpected"
            )
        endpoint = self._live_endpoint(resource)
        chosen: list[str] = []
        if endpoint.options.get_preferred_allocation_available and len(available) > count:
            preferred = await self.get_preferred_allocation(resource, available, [], count)
            chosen = self._accept_preferred(resource, preferred, available, count)
        chosen += [i for i in available if i not in chosen][: count - len(chosen)]
        response = await self.allocate(resource, [chosen], pod_uid=pod_uid)
        if start_container and endpoint.options.pre_start_required:
            await self.pre_start_container(resource, chosen)
        return response.container_responses[0]

    async def release_pod(self, pod_uid: str) -> list[str]:
        """Forget a pod's devices, as the kubelet does once the pod is gone; returns the IDs."""
        freed = [i for pod in self._pods if pod.pod_uid == pod_uid for i in pod.ids]
        self._pods = [pod for pod in self._pods if pod.pod_uid != pod_uid]
        self._write_checkpoint()
        await self._note(f"released pod {pod_uid}: {','.join(freed) or 'no devices'}")
        return freed

    def _free_healthy(self, resource: str) -> list[str]:
        state = self._resources[resource]
        if not state.usable:
            return []
        taken = self.allocated(resource)
        return sorted(i for i, d in state.devices.items() if d.health == HEALTHY and i not in taken)

    def _accept_preferred(
        self, resource: str, preferred: list[str], available: list[str], count: int
    ) -> list[str]:
        """Keep what the kubelet keeps of a preference: offered IDs only, at most ``count``."""
        offered = set(available)
        stray = [i for i in preferred if i not in offered]
        if stray:
            self._record(
                f"GetPreferredAllocation for {resource} named IDs that were not offered; "
                f"ignored: {','.join(stray)}"
            )
        kept = list(dict.fromkeys(i for i in preferred if i in offered))
        if len(kept) > count:
            self._record(
                f"GetPreferredAllocation for {resource} returned {len(kept)} IDs for a request "
                f"of {count}; extra ignored"
            )
        return kept[:count]

    # -- checkpoint --------------------------------------------------------------------

    @property
    def checkpoint_path(self) -> Path:
        return self._dir / CHECKPOINT_NAME

    def _checkpoint_data(self) -> dict[str, Any]:
        entries = []
        for pod in self._pods:
            by_numa: dict[str, list[str]] = {}
            devices = self._resources.get(pod.resource, _Resource()).devices
            for device_id in pod.ids:
                device = devices.get(device_id)
                nodes = device.topology.nodes if device is not None else []
                key = str(nodes[0].ID) if nodes else NO_NUMA_NODE
                by_numa.setdefault(key, []).append(device_id)
            entries.append(
                {
                    "PodUID": pod.pod_uid,
                    "ContainerName": pod.container,
                    "ResourceName": pod.resource,
                    "DeviceIDs": by_numa,
                    "AllocResp": base64.b64encode(pod.response.SerializeToString()).decode(),
                }
            )
        registered = {name: sorted(r.devices) for name, r in sorted(self._resources.items())}
        return {"PodDeviceEntries": entries, "RegisteredDevices": registered}

    def _write_checkpoint(self) -> None:
        """Write the kubelet-shaped checkpoint atomically so a crash never leaves half a file.

        The checksum is a CRC32 of the canonical JSON of ``Data``: it detects corruption like
        the kubelet's does, but is not byte-compatible with the kubelet's own checksum.
        """
        data = self._checkpoint_data()
        body = json.dumps(data, sort_keys=True, separators=(",", ":"))
        document = {"Data": data, "Checksum": zlib.crc32(body.encode())}
        tmp = self.checkpoint_path.with_name(CHECKPOINT_NAME + ".tmp")
        tmp.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.checkpoint_path)

    def _load_checkpoint(self) -> None:
        """Restore allocations (and, like the kubelet, registered devices as unhealthy).

        An unreadable checkpoint is what the kubelet logs and then ignores; we record it as an
        event and start with no allocations.
        """
        path = self.checkpoint_path
        if not path.exists():
            return
        try:
            pods, registered = _parse_checkpoint(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as err:
            self._record(
                f"checkpoint {path} is unreadable ({err}); continuing without it, device "
                "allocation info may not be up to date; delete the file to silence this"
            )
            return
        self._pods = pods
        for name, ids in registered.items():
            state = self._state(name)
            if not state.devices:
                state.devices = {i: api_pb2.Device(ID=i, health=UNHEALTHY) for i in ids}
        self._record(
            f"checkpoint restored: {len(pods)} container allocations, "
            f"{len(registered)} registered resources"
        )


def _parse_checkpoint(text: str) -> tuple[list[_PodDevices], dict[str, list[str]]]:
    """Read our checkpoint format, raising ValueError that names the bad part."""
    document = json.loads(text)
    if not isinstance(document, dict) or not isinstance(document.get("Data"), dict):
        raise ValueError("no 'Data' object at the top level")
    data = document["Data"]
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    if document.get("Checksum") != zlib.crc32(body.encode()):
        raise ValueError("checksum does not match the data")
    pods: list[_PodDevices] = []
    for index, entry in enumerate(data.get("PodDeviceEntries") or []):
        try:
            ids = [i for group in entry["DeviceIDs"].values() for i in group]
            response = api_pb2.ContainerAllocateResponse()
            response.ParseFromString(base64.b64decode(entry.get("AllocResp", "")))
            pods.append(
                _PodDevices(
                    str(entry["PodUID"]),
                    str(entry["ContainerName"]),
                    str(entry["ResourceName"]),
                    [str(i) for i in ids],
                    response,
                )
            )
        except (KeyError, TypeError, AttributeError, ValueError, DecodeError) as err:
            raise ValueError(f"PodDeviceEntries[{index}] is malformed: {err!r}") from err
    registered_raw = data.get("RegisteredDevices") or {}
    if not isinstance(registered_raw, dict):
        raise ValueError("'RegisteredDevices' is not an object")
    registered = {str(k): [str(i) for i in v] for k, v in registered_raw.items()}
    return pods, registered
