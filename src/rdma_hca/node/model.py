"""Immutable records of what discovery found on a node.

Nothing here does I/O: these values flow from discovery to ``pool``, ``health``
and the reports, and being frozen they can be shared between tasks and compared
to notice change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class LinkLayer(StrEnum):
    INFINIBAND = "InfiniBand"
    ETHERNET = "Ethernet"
    UNKNOWN = "Unknown"


class GidKind(StrEnum):
    """What address a GID holds; decides whether non-hostNetwork pods can use it."""

    IPV4_MAPPED = "ipv4-mapped"
    GLOBAL_IPV6 = "global-ipv6"
    LINK_LOCAL = "link-local"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class CharDevice:
    """A character device an RDMA pod needs, e.g. ``uverbs0``.

    ``path`` is the path inside a container and on the host (``/dev/infiniband/uverbs0``);
    ``present`` says whether it exists under the ``dev_root`` discovery looked at.
    """

    name: str
    path: str
    present: bool


@dataclass(frozen=True, slots=True)
class Gid:
    index: int
    address: str  # as sysfs prints it, e.g. "0000:0000:0000:0000:0000:ffff:0a00:0001"
    type: str  # "IB/RoCE v1" or "RoCE v2" (empty when the kernel does not say)
    kind: GidKind
    netdev: str | None  # gid_attrs/ndevs/N: the netdev the GID belongs to (RoCE)
    ip: str | None  # the IP address it carries (RoCE), in normal text form

    @property
    def is_roce_v2(self) -> bool:
        return self.type == "RoCE v2"


@dataclass(frozen=True, slots=True)
class Port:
    number: int
    state: str  # "ACTIVE", "DOWN", "INIT", "ARMED" (the kernel's name for the number)
    phys_state: str  # "LinkUp", "Disabled", "Polling", ...; "UNKNOWN" when not known
    link_layer: LinkLayer
    rate: str  # as sysfs prints it, e.g. "400 Gb/sec (4X NDR)"
    rate_gbps: float | None
    netdevs: tuple[str, ...]
    gids: tuple[Gid, ...]
    umad: CharDevice | None = None
    issm: CharDevice | None = None
    lid: int | None = None  # InfiniBand only: the port's LID (sysfs "lid", hex)
    sm_lid: int | None = None  # InfiniBand only: the subnet manager's LID; 0 means no SM seen

    @property
    def is_up(self) -> bool:
        return self.state == "ACTIVE" and self.phys_state == "LinkUp"


@dataclass(frozen=True, slots=True)
class Hca:
    name: str
    driver: str | None
    node_guid: str | None
    fw_ver: str | None
    board_id: str | None
    hca_type: str | None
    pci_address: str | None
    pci_vendor: str | None  # "0x15b3"
    pci_device: str | None  # "0x101d"
    numa_node: int | None  # None when unknown (sysfs says -1 or has no file)
    ports: tuple[Port, ...]
    uverbs: CharDevice | None
    problems: tuple[str, ...] = field(default=())  # why it cannot be used, if it cannot
    # Where it sits on the PCI tree, as Kubernetes' standard DRA attributes name it:
    # resource.kubernetes.io/pciBusID ("0000:3b:00.0") and .../pcieRoot ("pci0000:3a").
    # None for a device that is not a PCI function (rxe, siw).
    pci_bus_id: str | None = None
    pcie_root: str | None = None

    @property
    def usable(self) -> bool:
        """Advertised only when its verbs device node exists and nothing else is wrong."""
        return self.uverbs is not None and self.uverbs.present and not self.problems

    @property
    def netdevs(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for port in self.ports:
            for n in port.netdevs:
                seen[n] = None
        return tuple(seen)

    @property
    def any_port_up(self) -> bool:
        return any(p.is_up for p in self.ports)

    @property
    def rate_bps(self) -> int | None:
        """Its fastest port's rate in bits per second (a bond's one port reports the
        bond's); None when no port says one."""
        rates = [p.rate_gbps for p in self.ports if p.rate_gbps is not None]
        # Rounded to whole bits: 13.64 Gb/s is 13640000000 b/s, not a float's neighbour.
        return round(max(rates) * 1e9) if rates else None

    def device_nodes(self) -> tuple[CharDevice, ...]:
        """The device nodes a container needs for this HCA: uverbs, and umad on IB ports."""
        nodes: list[CharDevice] = []
        if self.uverbs is not None:
            nodes.append(self.uverbs)
        for port in self.ports:
            if port.link_layer is LinkLayer.INFINIBAND and port.umad is not None:
                nodes.append(port.umad)
        return tuple(nodes)


@dataclass(frozen=True, slots=True)
class Gpu:
    """An NVIDIA GPU as a PCI function: only where it sits, so an HCA can be put beside
    the GPUs on its PCIe root (and beside their DCGM series, which name the bus ID)."""

    pci_address: str  # "0000:3b:00.0", as sysfs names it
    device: str | None  # "0x2330"
    numa_node: int | None
    pcie_root: str | None  # "pci0000:3a"

    @property
    def dcgm_bus_id(self) -> str:
        """The address as NVML and DCGM print it: 8-digit domain, upper case."""
        domain, _, rest = self.pci_address.partition(":")
        return f"{int(domain, 16):08X}:{rest.upper()}"


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """Everything discovery found in one pass over sysfs and /dev."""

    hcas: tuple[Hca, ...]
    rdma_cm: CharDevice | None
    netns_mode: str | None  # "shared", "exclusive", or None when the kernel does not say
    warnings: tuple[str, ...] = ()
    # Absolute paths of the files that did not answer within the deadline in this pass;
    # the HCAs they belong to read with their ports UNKNOWN.
    stalled: tuple[str, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    # Names of the HCAs whose ports flapped lately: they count as down until stable
    # (the daemon's flap hold fills it in; discovery leaves it empty).
    held: frozenset[str] = frozenset()
