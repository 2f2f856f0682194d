"""The benchmark's baseline: the least a grpc.aio DevicePlugin server can do.

``python -m rdma_hca.devkit.bench_bare --socket PATH --response FILE`` serves Allocate with the
serialized ``AllocateResponse`` in FILE (taken from our daemon, so both send the same
bytes) and nothing else worth measuring. It runs in its own process, as the daemon does
in the benchmark, so Allocate latency, memory and idle CPU compare like with like: what
the daemon adds over this is the cost of being a device plugin rather than a gRPC server.

It prints ``ready`` on stdout once it serves, so the benchmark can time its start-up
without polling the socket.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Sequence

import grpc
from google.protobuf.message import DecodeError

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc

READY_LINE = "ready"


class BareDevicePlugin(api_pb2_grpc.DevicePluginServicer):
    """Answers every Allocate with one precomputed response, whatever was asked."""

    def __init__(self, response: api_pb2.AllocateResponse) -> None:
        self.response = response

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions()

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.AllocateResponse:
        return self.response

    # The rest of the service exists only because the servicer class requires it.

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        yield api_pb2.ListAndWatchResponse()

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.PreferredAllocationResponse:
        return api_pb2.PreferredAllocationResponse()

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def load_response(path: str) -> api_pb2.AllocateResponse:
    """Read the serialized response; a ValueError says what is wrong with the file."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ValueError(f"cannot read the response file {path}: {exc.strerror}") from None
    response = api_pb2.AllocateResponse()
    try:
        response.ParseFromString(raw)
    except DecodeError as exc:
        raise ValueError(f"{path} is not a serialized v1beta1.AllocateResponse ({exc}); "
                         "write it with AllocateResponse.SerializeToString()") from None
    return response


async def serve(socket_path: str, response: api_pb2.AllocateResponse) -> None:
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(BareDevicePlugin(response), server)
    server.add_insecure_port("unix://" + socket_path)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(READY_LINE, flush=True)
    await stop.wait()
    await server.stop(None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rdma_hca.devkit.bench_bare",
        description="Baseline gRPC DevicePlugin server for the benchmarks.",
    )
    parser.add_argument("--socket", required=True, metavar="PATH",
                        help="unix socket to serve on (removed first if it exists)")
    parser.add_argument("--response", required=True, metavar="FILE",
                        help="serialized AllocateResponse to answer every Allocate with")
    args = parser.parse_args(argv)
    try:
        response = load_response(args.response)
    except ValueError as exc:
        print(f"bench_bare: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args.socket, response))
    except RuntimeError as exc:  # grpc raises RuntimeError when it cannot bind
        print(f"bench_bare: cannot serve on {args.socket}: {exc}; check that the directory "
              "exists and is writable", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
