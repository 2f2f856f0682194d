"""The typed settings the daemon runs with: plain frozen records, no parsing here.

``rdma_hca.settings.config`` builds them from the declaration in
:mod:`rdma_hca.settings.decl`.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from rdma_hca.contract.dra import RESYNC_SECONDS
from rdma_hca.kit.text import short_repr
from rdma_hca.node.model import Hca

ENV_PREFIX = "RDMA_HCA_"
DEFAULT_RESOURCE_NAME = "rdma/hca"
DEFAULT_RDMA_HCA_MAX = 1000
DEFAULT_METRICS_ADDRESS = ":9478"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
DEFAULT_KUBELET_DIR = DEFAULT_KUBELET_ROOT + "/device-plugins"
# The kubelet's own socket in its device-plugins directory: the device plugin registers
# there, and the daemon's SIGHUP rescan says whether it is there whichever front end runs.
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_DRA_DRIVER_NAME = "rdma-hca.io"
DEFAULT_READ_DEADLINE_SECONDS = 5.0
DEFAULT_HEALTH_POLL_SECONDS = 0.5
DEFAULT_FLAP_HOLD_SECONDS = 30.0
DEFAULT_RESEND_SECONDS = 30.0
DEFAULT_HTTP_MAX_CONNECTIONS = 64
# client-go's rest.Config defaults (DefaultQPS, DefaultBurst).
DEFAULT_API_QPS = 5.0
DEFAULT_API_BURST = 10
# The kubelet's own client budget (its kubeAPIQPS and kubeAPIBurst defaults): the claim
# reads of NodePrepareResources come at the pace the kubelet starts pods.
DEFAULT_CLAIM_API_QPS = 50.0
DEFAULT_CLAIM_API_BURST = 100
DEFAULT_DRA_RESYNC_SECONDS = RESYNC_SECONDS  # the driver's wire contract says it
DEFAULT_DRA_START_JITTER_SECONDS = 5.0
DEFAULT_STATUS_RETRY_AFTER_MAX_SECONDS = 60.0
# Bits per second: link rates are whole Gb/s, and so are bandwidth requests.
BANDWIDTH_STEP = 10**9


class ConfigError(ValueError):
    """A setting that cannot be used; the message names field, value and what is allowed."""

    def __init__(self, field_name: str, value: object, allowed: str, source: str = "") -> None:
        where = f" (from {source})" if source else ""
        super().__init__(f"{field_name}: {short_repr(value)}{where} is not valid: {allowed}")
        self.field_name = field_name
        self.value = value
        self.allowed = allowed
        self.source = source


class Mode(StrEnum):
    SHARED = "shared"
    EXCLUSIVE = "exclusive"


class UnhealthyWhen(StrEnum):
    ANY = "any"
    ALL = "all"


class NcclEnv(StrEnum):
    """What NCCL/UCX variables a container gets for its HCAs (docs/nccl.md).

    ``auto``: every variable derived from the node; ``hca``: only NCCL_IB_HCA (what
    ``true`` meant before the other variables existed); ``off``: none of them.
    """

    AUTO = "auto"
    HCA = "hca"
    OFF = "off"


class DeviceMetadata(StrEnum):
    """Whether, and in which versions, the DRA driver writes KEP-5304 device metadata.

    ``v1alpha1``: the version Kubernetes 1.36 reads; ``v1beta1``: v1beta1 then v1alpha1 in
    one stream, newest first, as the upstream helper writes when given both; ``off``: none.
    """

    OFF = "off"
    V1ALPHA1 = "v1alpha1"
    V1BETA1 = "v1beta1"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Selectors:
    """Which HCAs a pool holds; every non-empty list must match, any entry within it."""

    names: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    link_layers: tuple[str, ...] = ()
    netdevs: tuple[str, ...] = ()
    pci_vendors: tuple[str, ...] = ()
    pci_devices: tuple[str, ...] = ()

    @property
    def takes_all(self) -> bool:
        """True when no list is given: every HCA of the node matches."""
        return not (self.names or self.drivers or self.link_layers or self.netdevs
                    or self.pci_vendors or self.pci_devices)

    def matches(self, hca: Hca) -> bool:
        if self.names and not _any_glob(self.names, [hca.name]):
            return False
        if self.drivers and not _any_glob(self.drivers, [hca.driver or ""]):
            return False
        if self.link_layers and not any(
            p.link_layer.value.lower() in {x.lower() for x in self.link_layers} for p in hca.ports
        ):
            return False
        if self.netdevs and not _any_glob(self.netdevs, hca.netdevs):
            return False
        if self.pci_vendors and norm_hex(hca.pci_vendor) not in {
            norm_hex(v) for v in self.pci_vendors
        }:
            return False
        return not (
            self.pci_devices
            and norm_hex(hca.pci_device) not in {norm_hex(v) for v in self.pci_devices}
        )


def _any_glob(patterns: Sequence[str], values: Sequence[str]) -> bool:
    # fnmatchcase, never substring: "mlx5_1" must not select "mlx5_10".
    return any(fnmatch.fnmatchcase(v, p) for p in patterns for v in values)


def norm_hex(value: str | None) -> str:
    if not value:
        return ""
    v = value.strip().lower()
    return v[2:] if v.startswith("0x") else v


@dataclass(frozen=True, slots=True)
class PoolConfig:
    resource_name: str = DEFAULT_RESOURCE_NAME
    rdma_hca_max: int = DEFAULT_RDMA_HCA_MAX
    mode: Mode = Mode.SHARED
    unhealthy_when: UnhealthyWhen = UnhealthyWhen.ANY
    selectors: Selectors = field(default_factory=Selectors)


@dataclass(frozen=True, slots=True)
class CdiConfig:
    enabled: bool = False
    spec_dir: str = "/var/run/cdi"


@dataclass(frozen=True, slots=True)
class DraConfig:
    """The Dynamic Resource Allocation driver: off by default."""

    enabled: bool = False
    driver_name: str = DEFAULT_DRA_DRIVER_NAME
    # Shared: every device carries allowMultipleAllocations, as the seed's shared HCAs.
    mode: Mode = Mode.SHARED
    # Which HCAs the driver publishes; empty selectors mean every HCA of the node.
    selectors: Selectors = field(default_factory=Selectors)
    # The API client's own rate limit, as client-go's: what the driver sends on its own.
    api_qps: float = DEFAULT_API_QPS
    api_burst: int = DEFAULT_API_BURST
    # The claim reads a pod's start waits for, on a budget of their own.
    claim_api_qps: float = DEFAULT_CLAIM_API_QPS
    claim_api_burst: int = DEFAULT_CLAIM_API_BURST
    # The check of the server's copy of the slices (jittered); 0: only on events.
    resync_seconds: float = DEFAULT_DRA_RESYNC_SECONDS
    # The first publish waits a random part of this, so a fleet restarting spreads out.
    start_jitter_seconds: float = DEFAULT_DRA_START_JITTER_SECONDS
    # A claim status write waits what the server's Retry-After says, at most this.
    status_retry_after_max_seconds: float = DEFAULT_STATUS_RETRY_AFTER_MAX_SECONDS
    # Per-request device metadata files (KEP-5304) mounted into the claim's containers.
    device_metadata: DeviceMetadata = DeviceMetadata.OFF
    # The node-wide device (all-hcas, shared mode), for rdma/hca through DRA.
    node_device: bool = True
    # What a claim asking no bandwidth holds of an HCA, bits per second (0: nothing).
    default_bandwidth: int = 0


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """The HTTP endpoints (/metrics, /healthz, /readyz)."""

    max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS


@dataclass(frozen=True, slots=True)
class FabricConfig:
    """What the daemon learns of the fabric: off by default (LLDP needs CAP_NET_RAW)."""

    lldp: bool = False


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``serve`` runs with.

    The kubelet's directories derive from ``kubelet_root`` unless given: an empty
    ``kubelet_dir`` (device-plugins), ``plugins_registry_dir`` or ``plugins_dir`` is filled
    in from it when the object is made. ``device_plugin_enabled=False`` means no pool.
    """

    pools: tuple[PoolConfig, ...] = (PoolConfig(),)
    device_plugin_enabled: bool = True
    non_host_network: bool = False
    # Node Events from the device plugin's side too (the DRA driver always records them).
    events_enabled: bool = False
    nccl_env: NcclEnv = NcclEnv.AUTO
    health_poll_seconds: float = DEFAULT_HEALTH_POLL_SECONDS
    flap_hold_seconds: float = DEFAULT_FLAP_HOLD_SECONDS
    resend_seconds: float = DEFAULT_RESEND_SECONDS
    read_deadline_seconds: float = DEFAULT_READ_DEADLINE_SECONDS
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    http: HttpConfig = field(default_factory=HttpConfig)
    fabric: FabricConfig = field(default_factory=FabricConfig)
    log_format: LogFormat = LogFormat.TEXT
    log_level: LogLevel = LogLevel.INFO
    cdi: CdiConfig = field(default_factory=CdiConfig)
    dra: DraConfig = field(default_factory=DraConfig)
    sysfs_root: str = "/sys"
    dev_root: str = "/dev"
    kubelet_root: str = DEFAULT_KUBELET_ROOT
    kubelet_dir: str = ""
    plugins_registry_dir: str = ""
    plugins_dir: str = ""
    node_name: str = ""
    pod_uid: str = ""
    config_file: str | None = None
    # One line each: things that work but are probably not what was meant.
    warnings: tuple[str, ...] = field(default=(), compare=False)
    # YAML key -> the layer that gave its value ("flag --sysfs-root", "environment variable
    # RDMA_HCA_SYSFS_ROOT", "config file ..."); a key not here has its default.
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        derived = {
            "kubelet_dir": "device-plugins",
            "plugins_registry_dir": "plugins_registry",
            "plugins_dir": "plugins",
        }
        for attr, sub in derived.items():
            if not getattr(self, attr):
                object.__setattr__(self, attr, os.path.join(self.kubelet_root, sub))
        if not self.device_plugin_enabled and self.pools:
            object.__setattr__(self, "pools", ())
