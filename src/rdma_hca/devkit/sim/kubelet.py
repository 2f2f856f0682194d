"""A kubelet emulator for the device plugin protocol v1beta1.

There is no kubelet on the machines that run our tests, demo and benchmarks, yet the plugin's
hardest behaviour is its conversation with one: registering while already serving, the order of
calls inside ``Register``, a ListAndWatch stream whose end means "the kubelet went away", and a
kubelet restart that wipes the sockets. This package plays the kubelet's side of that conversation
over real unix sockets, in the kubelet's order, so the plugin's real code can be exercised
unchanged. The facts reproduced here are collected in ``kubelet-deviceplugin-api.md``.

It is a test double, not part of the daemon's serving path: nothing in the daemon imports it.
This module holds the emulator itself (its life cycle, registration, state);
``kubelet_streams`` its reading of ListAndWatch, ``kubelet_rules`` what the kubelet checks
and says, ``kubelet_records`` what it knows, ``kubelet_admission`` its calls into the plugin
for pods, ``kubelet_checkpoint`` its checkpoint file.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.devkit.sim.kubelet_records import Endpoint, PodDevices, ResourceState
from rdma_hca.devkit.sim.kubelet_rules import (
    API_VERSION,
    CHANNEL_OPTIONS,
    CHECKPOINT_NAME,
    HEALTHY,
    KUBELET_SOCKET,
    MAX_EVENTS,
    RECENT_EVENTS_IN_ERRORS,
    UNIX_PATH_MAX,
    RegisterRefused,
    endpoint_problem,
    format_quantity,
    resource_name_problem,
    rpc_error_text,
)
from rdma_hca.devkit.sim.kubelet_streams import StreamReader, bounded
from rdma_hca.kit.aio import cancel_all

if TYPE_CHECKING:
    from rdma_hca.daemon._proto.api_pb2_grpc import DevicePluginAsyncStub


class _RegistrationService(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletEmulator) -> None:
        self._kubelet = kubelet

    async def Register(
        self,
        request: api_pb2.RegisterRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> api_pb2.Empty:
        return await self._kubelet._handle_register(request, context)


class KubeletEmulator(StreamReader):
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
        self._superseded: set[Endpoint] = set()
        self._server: grpc.aio.Server | None = None
        self._resources: dict[str, ResourceState] = {}
        self._pods: list[PodDevices] = []
        self._events: deque[str] = deque(maxlen=MAX_EVENTS)
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
            await bounded(asyncio.ensure_future(server.stop(None)), "stopping the kubelet server")
        for resource in self._resources.values():
            endpoint, resource.endpoint = resource.endpoint, None
            resource.usable = False
            if endpoint is not None:
                await self._close_endpoint(endpoint)
        for endpoint in list(self._superseded):
            await self._close_endpoint(endpoint)
        self._superseded.clear()
        await cancel_all(list(self._tasks))
        if server is not None:
            await self._note("kubelet stopped")

    @property
    def superseded_streams(self) -> int:
        """Old streams still open after a newer registration of their resource (only with
        ``old_stream_disconnects_new``): each would disconnect the new one when it ends."""
        return len(self._superseded)

    async def drop_stream(self, resource: str) -> None:
        """Stop reading the resource's ListAndWatch stream, as a failing kubelet does.

        The plugin sees its stream cancelled; the kubelet counts every device unhealthy
        until the plugin registers again.
        """
        state = self._resources.get(resource)
        endpoint = state.endpoint if state is not None else None
        if endpoint is None or endpoint.ended or endpoint.closing:
            raise RuntimeError(f"no live ListAndWatch stream for {resource} to drop")
        if endpoint.reader is not None:
            await cancel_all([endpoint.reader])
        await self._stream_ended(endpoint, "dropped by the kubelet")

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
            recent = list(self._events)[-RECENT_EVENTS_IN_ERRORS:]
            lines = "\n  ".join(recent) if recent else "(none)"
            raise TimeoutError(
                f"kubelet emulator: condition {name} still false after {timeout:g} s; "
                f"recent events:\n  {lines}"
            ) from None

    async def _note(self, message: str) -> None:
        """Record an event and wake every waiter: all state changes go through here."""
        self._record(message)
        async with self._changed:
            self._changed.notify_all()

    # -- registration ------------------------------------------------------------------

    async def _handle_register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        try:
            endpoint = await self._admit_registration(request)
        except RegisterRefused as refused:
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

    async def _admit_registration(self, request: api_pb2.RegisterRequest) -> Endpoint:
        """Validate, then dial and ask for options, in the kubelet's order."""
        if request.version != API_VERSION:
            raise RegisterRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"requested API version {request.version!r} is not supported by kubelet. "
                f"Supported versions are [{API_VERSION!r}]",
            )
        problem = resource_name_problem(request.resource_name)
        if problem is not None:
            raise RegisterRefused(grpc.StatusCode.INVALID_ARGUMENT, problem)
        problem = endpoint_problem(request.endpoint)
        if problem is not None:
            raise RegisterRefused(grpc.StatusCode.INVALID_ARGUMENT, problem)
        return await self._dial(request.resource_name, self._dir / request.endpoint)

    async def _dial(self, resource: str, path: Path) -> Endpoint:
        target = f"unix://{path}"
        if len(str(path).encode()) > UNIX_PATH_MAX:
            raise RegisterRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"socket path {str(path)!r} is over the unix socket limit of {UNIX_PATH_MAX} "
                "bytes; use a shorter directory or endpoint name",
            )
        channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        try:
            try:
                await asyncio.wait_for(channel.channel_ready(), self._dial_timeout)
            except TimeoutError:
                raise RegisterRefused(
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
                raise RegisterRefused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"failed to get device plugin options from {target}: {rpc_error_text(err)}",
                ) from None
        except BaseException:
            await channel.close(None)
            raise
        self._serial += 1
        return Endpoint(resource, target, channel, stub, options, self._serial)
