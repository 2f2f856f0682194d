"""What the emulated kubelet checks and says: names, quantities, error texts, constants.

The facts reproduced here are collected in ``kubelet-deviceplugin-api.md``.
"""

from __future__ import annotations

import re
from typing import Any

import grpc
import grpc.aio

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


class RegisterRefused(Exception):
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
