"""What the DRA driver needs to know: one plain record the daemon's settings map onto.

(``settings_model.DraConfig`` is the user-facing ``dra:`` block; this is the driver's own.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rdma_hca.settings.config import Mode, Selectors
from rdma_hca.settings.model import (
    DEFAULT_API_BURST,
    DEFAULT_API_QPS,
    DEFAULT_DRA_START_JITTER_SECONDS,
)

if TYPE_CHECKING:
    from rdma_hca.settings.model import Settings

DEFAULT_DRIVER_NAME = "rdma-hca.io"
DRA_SOCKET = "dra.sock"


@dataclass(frozen=True, slots=True)
class DriverConfig:
    driver_name: str = DEFAULT_DRIVER_NAME
    """The DRA driver name: ResourceSlices, DeviceClass selectors and CDI kinds carry it."""
    node_name: str = ""
    """This node's name; the driver publishes and touches only this node's slices."""
    plugins_registry_dir: str = "/var/lib/kubelet/plugins_registry"
    """Where the kubelet's plugin watcher looks for registration sockets."""
    plugins_dir: str = "/var/lib/kubelet/plugins"
    """The DRA service socket lives in ``<plugins_dir>/<driver name>/``."""
    cdi_spec_dir: str = "/var/run/cdi"
    """Where the container runtime reads CDI specs; one file per prepared claim."""
    mode: Mode = Mode.SHARED
    """Shared: every device may be allocated to several claims at once; exclusive: not."""
    nccl_env: bool = False
    """Also set NCCL_IB_HCA in prepared containers, as the device plugin's Allocate does."""
    checkpoint_path: str = ""
    """Prepared claims survive restarts here; empty: ``<plugins_dir>/<driver>/checkpoint.json``."""
    read_deadline: float = 10.0
    """Seconds an API server call or a file operation may take before it counts as failed."""
    selectors: Selectors = field(default_factory=Selectors)
    """Which HCAs the driver offers (the device plugin pools must not offer the same ones)."""
    device_taints: bool = True
    """Taint the device of an HCA whose ports are all down (needs DRADeviceTaints)."""
    resync_seconds: float = 60.0
    """Check the published slice against the API server this often (0: only on events)."""
    start_jitter_seconds: float = DEFAULT_DRA_START_JITTER_SECONDS
    """The first publish waits a random part of this (a fleet restarting spreads out)."""
    api_qps: float = DEFAULT_API_QPS
    """The API client's rate limit: requests a second after the burst."""
    api_burst: int = DEFAULT_API_BURST
    """Requests the API client may send at once."""
    socket_check_seconds: float = 0.5
    """How often to check that our sockets still exist (a kubelet may wipe its directories)."""
    kubeconfig: str | None = None
    """A kubeconfig file; None: in-cluster credentials, else ``KUBECONFIG``."""

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: object) -> DriverConfig:
        """The driver's part of the daemon's settings; ``overrides`` set any other field."""
        fields: dict[str, object] = {
            "driver_name": settings.dra.driver_name,
            "mode": settings.dra.mode,
            "node_name": settings.node_name,
            "plugins_registry_dir": settings.plugins_registry_dir,
            "plugins_dir": settings.plugins_dir,
            "cdi_spec_dir": settings.cdi.spec_dir,
            "nccl_env": settings.nccl_env,
            "read_deadline": settings.read_deadline_seconds,
            "selectors": settings.dra.selectors,
            "resync_seconds": settings.dra.resync_seconds,
            "start_jitter_seconds": settings.dra.start_jitter_seconds,
            "api_qps": settings.dra.api_qps,
            "api_burst": settings.dra.api_burst,
        }
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]

    @property
    def registration_socket(self) -> str:
        return os.path.join(self.plugins_registry_dir, f"{self.driver_name}-reg.sock")

    @property
    def endpoint(self) -> str:
        return os.path.abspath(os.path.join(self.plugins_dir, self.driver_name, DRA_SOCKET))

    @property
    def checkpoint(self) -> str:
        return self.checkpoint_path or os.path.join(
            self.plugins_dir, self.driver_name, "checkpoint.json")

    @property
    def pool_name(self) -> str:
        """One pool per node, named after it, as the kubelet plugin helpers do."""
        return self.node_name
