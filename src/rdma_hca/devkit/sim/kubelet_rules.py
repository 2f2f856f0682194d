"""What the emulated kubelet checks and says: names, quantities, error texts, constants.

The facts reproduced here are collected in ``kubelet-deviceplugin-api.md``.
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

from rdma_hca.kit import names, quantity

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
RECENT_EVENTS_IN_ERRORS = 12
MAX_EVENTS = 10_000

# Unix sockets never go through a proxy, but an http_proxy in the environment can still make
# gRPC try one; short reconnect backoff lets a dial succeed soon after the plugin starts serving.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.enable_http_proxy", 0),
    # Each registration gets its own connection, as a restarted kubelet process has:
    # gRPC otherwise shares one between channels to the same path, and closing an
    # old endpoint's channel could then end the new endpoint's stream.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]



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


class RegisterRefused(Exception):
    """Register must fail with this gRPC status; the message is what the plugin will log."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def resource_name_problem(name: str) -> str | None:
    """Say why ``name`` is not a valid extended resource name (the kubelet's
    ``IsExtendedResourceName``), or return None if it is."""
    problem = names.resource_name_problem(name)
    return f"resource name {name!r}: {problem}" if problem else None


def format_quantity(value: int) -> str:
    """Print a count the way ``kubectl`` prints a decimal Kubernetes Quantity (1000 is 1k)."""
    return quantity.format_quantity(quantity.parse_quantity(str(value)))


def go_code(code: grpc.StatusCode) -> str:
    """Status code as grpc-go prints it (``InvalidArgument``), to match kubelet messages."""
    return "".join(part.capitalize() for part in code.name.split("_"))


def rpc_error_text(err: grpc.aio.AioRpcError) -> str:
    return f"rpc error: code = {go_code(err.code())} desc = {err.details() or ''}"


def endpoint_problem(endpoint: str) -> str | None:
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
