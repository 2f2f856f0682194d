"""The DRA driver's view of the daemon's settings: derived from ``Settings``, no defaults.

Every value a user can set comes from :class:`~rdma_hca.settings.model.Settings` (where
its default is declared, once); the rest are fixed by the driver (``FIXED``) or given by
the caller that builds the view (a kubeconfig, a checkpoint path for tests). Names of
the sockets and files follow the upstream kubelet plugin helper, including its
rolling-update mode: with a pod UID, both sockets carry it, so the old and the new pod
of a DaemonSet rolling update serve side by side.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rdma_hca.contract.checkpoint import CHECKPOINT_FILE
from rdma_hca.daemon.offer.env import EnvSettings, env_settings
from rdma_hca.settings.model import DeviceMetadata, Mode, Selectors, Settings

DRA_SOCKET = "dra.sock"
LOCK_FILE = "claims.lock"


@dataclass(frozen=True, slots=True)
class Fixed:
    """What the driver decides itself; tests change it with ``dataclasses.replace``."""

    device_taints: bool = True  # taint a device whose ports are all down (DRADeviceTaints)
    socket_check_seconds: float = 5.0  # backstop of the socket watch, in case inotify lost one
    health_resend_seconds: float = 10.0  # every device's health again, within the kubelet's 30 s


FIXED = Fixed()


@dataclass(frozen=True, slots=True)
class DriverConfig:
    """Built by :meth:`from_settings` only; every field is required."""

    driver_name: str
    node_name: str
    pod_uid: str
    plugins_registry_dir: str
    plugins_dir: str
    cdi_spec_dir: str
    mode: Mode
    env: EnvSettings
    checkpoint_path: str
    read_deadline: float
    selectors: Selectors
    kubeconfig: str | None
    device_taints: bool
    resync_seconds: float
    start_jitter_seconds: float
    api_qps: float
    api_burst: int
    claim_api_qps: float
    claim_api_burst: int
    status_retry_after_max_seconds: float
    sysfs_root: str
    socket_check_seconds: float
    health_resend_seconds: float
    device_metadata: DeviceMetadata
    node_device: bool
    default_bandwidth: int

    @classmethod
    def from_settings(cls, settings: Settings, *, read_deadline: float | None = None,
                      kubeconfig: str | None = None, checkpoint_path: str = "",
                      fixed: Fixed = FIXED) -> DriverConfig:
        return cls(
            driver_name=settings.dra.driver_name,
            node_name=settings.node_name,
            pod_uid=settings.pod_uid,
            plugins_registry_dir=settings.plugins_registry_dir,
            plugins_dir=settings.plugins_dir,
            cdi_spec_dir=settings.cdi.spec_dir,
            # Whichever layer gave it, the driver compares the enum.
            mode=Mode(settings.dra.mode),
            env=env_settings(settings),
            checkpoint_path=checkpoint_path,
            read_deadline=(settings.read_deadline_seconds if read_deadline is None
                           else read_deadline),
            selectors=settings.dra.selectors,
            kubeconfig=kubeconfig,
            device_taints=fixed.device_taints,
            resync_seconds=settings.dra.resync_seconds,
            start_jitter_seconds=settings.dra.start_jitter_seconds,
            api_qps=settings.dra.api_qps,
            api_burst=settings.dra.api_burst,
            claim_api_qps=settings.dra.claim_api_qps,
            claim_api_burst=settings.dra.claim_api_burst,
            status_retry_after_max_seconds=settings.dra.status_retry_after_max_seconds,
            sysfs_root=settings.sysfs_root,
            socket_check_seconds=fixed.socket_check_seconds,
            health_resend_seconds=fixed.health_resend_seconds,
            device_metadata=DeviceMetadata(settings.dra.device_metadata),
            node_device=settings.dra.node_device,
            default_bandwidth=settings.dra.default_bandwidth,
        )

    @property
    def plugin_dir(self) -> str:
        """``<plugins_dir>/<driver>``: the DRA socket, the checkpoint and the lock."""
        return os.path.abspath(os.path.join(self.plugins_dir, self.driver_name))

    @property
    def registration_socket(self) -> str:
        name = (f"{self.driver_name}-{self.pod_uid}-reg.sock" if self.pod_uid
                else f"{self.driver_name}-reg.sock")
        return os.path.abspath(os.path.join(self.plugins_registry_dir, name))

    @property
    def endpoint(self) -> str:
        name = f"dra-{self.pod_uid}.sock" if self.pod_uid else DRA_SOCKET
        return os.path.join(self.plugin_dir, name)

    @property
    def checkpoint(self) -> str:
        return self.checkpoint_path or os.path.join(self.plugin_dir, CHECKPOINT_FILE)

    @property
    def lock_path(self) -> str:
        """Shared by every instance on the node: claims are serialized across them."""
        return os.path.join(self.plugin_dir, LOCK_FILE)

    @property
    def pool_name(self) -> str:
        """One pool per node, named after it, as the kubelet plugin helpers do."""
        return self.node_name
