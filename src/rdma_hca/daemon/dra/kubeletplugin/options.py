"""The helper's options: one record, checked once at start."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.kit.names import is_dns_subdomain
from rdma_hca.kit.unixserver import socket_path_problem

_POD_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class DraConfigError(ValueError):
    """The driver cannot run with this configuration; the message says how to fix it."""


@dataclass(frozen=True, slots=True)
class HelperOptions:
    """What the helper needs of the driver's configuration; :meth:`check` before use."""

    driver_name: str
    node_name: str
    pod_uid: str
    pool_name: str
    endpoint: str
    registration_socket: str
    lock_path: str
    lock_wait: float  # how long a claim waits for another instance's record lock
    health_resend_seconds: float
    device_taints: bool  # taint a device whose ports are all down (until the server refuses)
    resync_seconds: float
    start_jitter_seconds: float
    sockets: DriverConfig  # what the sockets read (``kubeletplugin/sockets.py``)

    @classmethod
    def from_config(cls, config: DriverConfig) -> HelperOptions:
        return cls(
            driver_name=config.driver_name,
            node_name=config.node_name,
            pod_uid=config.pod_uid,
            pool_name=config.pool_name,
            endpoint=config.endpoint,
            registration_socket=config.registration_socket,
            lock_path=config.lock_path,
            lock_wait=config.read_deadline,
            health_resend_seconds=config.health_resend_seconds,
            device_taints=config.device_taints,
            resync_seconds=config.resync_seconds,
            start_jitter_seconds=config.start_jitter_seconds,
            sockets=config,
        )

    @property
    def rolling(self) -> bool:
        """Another instance may serve beside this one (the helper's rolling-update mode)."""
        return bool(self.pod_uid)

    def check(self) -> None:
        """Raise :class:`DraConfigError` saying what to set when the options cannot work."""
        if not self.node_name:
            raise DraConfigError("the DRA driver needs the node's name: set --node-name or "
                                 "NODE_NAME (the chart sets it from spec.nodeName)")
        if len(self.driver_name) > 63 or not is_dns_subdomain(self.driver_name):
            raise DraConfigError(f"DRA driver name {self.driver_name!r} is not a lowercase DNS "
                                 "subdomain of at most 63 characters, e.g. rdma-hca.io")
        if self.pod_uid and not _POD_UID.match(self.pod_uid):
            raise DraConfigError(f"pod UID {self.pod_uid[:80]!r} cannot be part of a socket "
                                 "name: set POD_UID to the pod's metadata.uid (the chart does)")
        for path in (self.endpoint, self.registration_socket):
            if socket_path_problem(path) is not None:
                raise DraConfigError(f"socket path {path} is too long for a unix socket "
                                     "(107 bytes at most): use a shorter kubelet root directory")
