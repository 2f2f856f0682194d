"""From HCAs to ResourceSlice devices: names, attributes, taints, health. Pure, no I/O.

Attribute names without a domain are the driver's own; the ``resource.kubernetes.io``
ones are the standard attributes GPU drivers publish too, which is what lets one claim
put a GPU and an HCA under the same PCIe root.

Two kinds of device (the ``kind`` attribute tells them apart for CEL): one per HCA
(``hca``), for claims that pick HCAs, and in shared mode one more for the node
(``node``, named ``all-hcas``), which stands for every usable HCA as one ``rdma/hca``
slot of the device plugin does. Only the extended-resource DeviceClass selects it, so a
pod's ``rdma/hca: 1`` (ONE device of that class) gets what the device plugin gave it.

A shared device also publishes its bandwidth as a consumable capacity
(``<driver>/bandwidth``, DRAConsumableCapacity): the scheduler then hands each claim the
share it asks for and never more than the port's rate in total. The policy's default is
``dra.defaultBandwidth`` (0 unless set), what a claim that asks for no bandwidth consumes;
on an HCA slower than it, the default is the HCA's whole rate (whole steps of it), so such
a claim still fits, alone. The step is 1G: link rates are whole Gb/s (10G to 800G, SDR's
2.5G aside), and a finer step would only let claims ask for precision no RDMA traffic
keeps to, a coarser one (25G) would round small asks up into waste.

The node-wide device holds no bandwidth: its allocations cannot consume the capacity of
the HCAs' own devices (a consumable capacity is one device's), so claims of it and claims
asking bandwidth share the ports uncounted; ``dra.nodeDevice: false`` leaves it out for
nodes where the bandwidth count must hold. It carries the driver's attributes a per-HCA
selector is likely to name, with what is true of every HCA it gives (``hcaName`` is
``all``, ``rateGbps`` the slowest, ``vendor`` and ``roceV2IPv6`` only when every HCA
agrees), so such a selector is false for it rather than an error; the standard
attributes (PCIe root, bus ID, NUMA node) and each HCA's own identities (netdev, GUID,
firmware) have no one value for several HCAs and are left out.

A device holds at most 32 attributes and capacities together (the API's
``ResourceSliceMaxAttributesAndCapacitiesPerDevice``); ours are far fewer, but the budget
is kept by design rather than by a cut that loses whatever came last. Should a device ever
have more, :func:`fit` leaves out the least useful first, in the documented order of
``KEEP_ORDER`` read backwards (names this module does not know, then ``firmware``,
``nodeGUID``, ...), and never one of ``NEVER_LEFT_OUT`` (the device's kind, HCA name and
link state, and the standard PCIe root, bus ID and NUMA node that align it with a GPU).
The offer records what it left out (``DeviceOffer.left_out``), which the driver says and
counts: a selector naming such an attribute no longer matches the device.

The records are typed (``Device`` and its parts, the API's field names); they become
JSON bodies only where the publisher sends them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from rdma_hca.contract.dra import (
    BANDWIDTH,
    FIRMWARE,
    FLAPPING,
    HCA_COUNT,
    HCA_NAME,
    KIND,
    KIND_HCA,
    KIND_NODE,
    LINK_DOWN_TAINT,
    LINK_LAYER,
    LINK_STATE,
    NETDEV,
    NODE_DEVICE,
    NODE_GUID,
    NODE_HCA_NAME,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    RATE_GBPS,
    ROCE_V2_IPV6,
    SLOTS,
    STANDARD,
    VENDOR,
)
from rdma_hca.contract.fabric import SWITCH, SWITCH_PORT, PortNeighbour
from rdma_hca.daemon.offer.health import hca_healthy, hca_up
from rdma_hca.daemon.offer.shared import any_healthy, every_usable
from rdma_hca.kit.quantity import format_whole
from rdma_hca.node.model import CharDevice, Hca
from rdma_hca.settings.model import BANDWIDTH_STEP, DEFAULT_RDMA_HCA_MAX, Mode

MAX_DNS_LABEL = 63
MAX_ATTRIBUTES_AND_CAPACITIES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
# Never left out: what tells the devices apart and what aligns them with a GPU.
NEVER_LEFT_OUT = frozenset({KIND, HCA_NAME, LINK_STATE, PCIE_ROOT, PCI_BUS_ID, NUMA_NODE})
# The rest, most useful first: the capacities (the scheduler's count of the bandwidth and
# the slots), the fabric (which leaf switch: topology-aware placement), then what
# selectors name the most down to what is there to read. Names not listed go first.
KEEP_ORDER = (BANDWIDTH, SLOTS, SWITCH, SWITCH_PORT, HCA_COUNT, RATE_GBPS, LINK_LAYER,
              ROCE_V2_IPV6, NETDEV, VENDOR, NODE_GUID, FIRMWARE)
MAX_STRING_VALUE = 64  # characters of a string attribute (DeviceAttributeMaxValueLength)
# As many pods at once as the device plugin's shared slots (its `1k`).
NODE_SLOTS = DEFAULT_RDMA_HCA_MAX



class Attribute(TypedDict, total=False):
    """A device attribute, as the API writes it: one typed value (``strings`` appears in
    the device metadata files only, never in a slice)."""

    string: str
    int: int
    bool: bool
    version: str
    strings: list[str]


Attributes = dict[str, Attribute]


class ValidRange(TypedDict):
    min: str
    step: str


class RequestPolicy(TypedDict):
    default: str
    validRange: ValidRange


class Capacity(TypedDict):
    value: str
    requestPolicy: NotRequired[RequestPolicy]


class Taint(TypedDict):
    key: str
    value: str
    effect: str


class Device(TypedDict):
    """One entry of a ResourceSlice's ``spec.devices``."""

    name: str
    attributes: Attributes
    allowMultipleAllocations: NotRequired[bool]
    capacity: NotRequired[dict[str, Capacity]]
    taints: NotRequired[list[Taint]]


def device_names(names: Iterable[str]) -> dict[str, str]:
    """HCA name -> a device name that is a DNS label, unique among them.

    ``mlx5_0`` becomes ``mlx5-0``. Two names that map to one label (``a_b``, ``a-b``)
    both get a suffix from a hash of the HCA name, so neither depends on the other.
    """
    names = sorted(set(names))
    plain = {n: _label(n) for n in names}
    counts: dict[str, int] = {}
    for label in plain.values():
        counts[label] = counts.get(label, 0) + 1
    out: dict[str, str] = {}
    for n in names:
        out[n] = _unused_label(n) if counts[plain[n]] > 1 else plain[n]
    return out


def _label(name: str) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:MAX_DNS_LABEL].strip("-")
    return label or "hca"


def _unused_label(name: str) -> str:
    """The label with a suffix from a hash of the name, for a label that is taken."""
    suffix = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{_label(name)[: MAX_DNS_LABEL - 9].rstrip('-')}-{suffix}"




def link_state(hca: Hca, held: Collection[str]) -> str:
    """Held for flapping, it reads down: the slice stays as it is while the port flaps."""
    return "up" if hca_up(hca, held) else "down"


def _rate_gbps(hca: Hca) -> int | None:
    rates = [p.rate_gbps for p in hca.ports if p.rate_gbps is not None]
    return int(max(rates)) if rates else None


def bandwidth_bps(hca: Hca) -> int | None:
    """The HCA's rate in bits per second, as ``rateGbps`` says it (its fastest port; a
    bond's one port reports the bond's rate); None when no port says a rate, or one
    below a step (the API wants room for one step in a capacity)."""
    bits = hca.rate_bps
    return bits if bits is not None and bits >= BANDWIDTH_STEP else None


def quantity_text(value: int) -> str:
    """A whole number as the API server prints it: 400000000000 is ``400G``."""
    return format_whole(value)


_STEP = quantity_text(BANDWIDTH_STEP)


def default_share(bits: int, default_bandwidth: int) -> int:
    """The request policy's default on an HCA of ``bits``: ``default_bandwidth``, or the
    whole steps of the rate when that is less (the API server would take a default above
    the capacity, and the scheduler would then fit no claim that asks nothing)."""
    return min(default_bandwidth, bits - bits % BANDWIDTH_STEP)


def capacity(hca: Hca, driver: str, default_bandwidth: int = 0) -> dict[str, Capacity]:
    """The device's consumable capacities: its bandwidth, when its rate is known."""
    bits = bandwidth_bps(hca)
    if bits is None:
        return {}
    default = quantity_text(default_share(bits, default_bandwidth))
    return {f"{driver}/{BANDWIDTH}": {
        "value": quantity_text(bits),
        "requestPolicy": {"default": default, "validRange": {"min": "0", "step": _STEP}}}}


def _link_layer(hca: Hca) -> str | None:
    layers = sorted({p.link_layer.value for p in hca.ports})
    return ",".join(layers) if layers else None


class _Attrs:
    """Attributes put one by one; a value that is not known is left out."""

    def __init__(self) -> None:
        self.out: Attributes = {}

    def text(self, key: str, value: str | None) -> None:
        if value:
            self.out[key] = {"string": value}

    def number(self, key: str, value: int | None) -> None:
        if value is not None:
            self.out[key] = {"int": value}

    def flag(self, key: str, value: bool) -> None:
        self.out[key] = {"bool": value}


def _roce_v2_ipv6(hca: Hca) -> bool:
    return any(g.is_roce_v2 and g.kind.value == "global-ipv6" for p in hca.ports for g in p.gids)


def attributes(hca: Hca, driver: str, held: Collection[str] = (),
               neighbour: PortNeighbour | None = None) -> Attributes:
    """``neighbour``: what LLDP says its first port is cabled to (fabric.lldp)."""
    put = _Attrs()
    put.text(PCIE_ROOT, hca.pcie_root)
    put.text(PCI_BUS_ID, hca.pci_bus_id)
    if hca.numa_node is not None and hca.numa_node >= 0:
        put.number(NUMA_NODE, hca.numa_node)
    put.text(f"{driver}/{KIND}", KIND_HCA)
    put.text(f"{driver}/{HCA_NAME}", hca.name)
    put.text(f"{driver}/{NETDEV}", hca.netdevs[0] if hca.netdevs else None)
    put.text(f"{driver}/{LINK_LAYER}", _link_layer(hca))
    put.number(f"{driver}/{RATE_GBPS}", _rate_gbps(hca))
    put.text(f"{driver}/{VENDOR}", hca.pci_vendor)
    put.text(f"{driver}/{FIRMWARE}", hca.fw_ver)
    put.text(f"{driver}/{NODE_GUID}", hca.node_guid)
    put.flag(f"{driver}/{ROCE_V2_IPV6}", _roce_v2_ipv6(hca))
    put.text(f"{driver}/{LINK_STATE}", link_state(hca, held))
    if neighbour is not None:
        # A longer value would have the API server refuse the whole slice.
        put.text(f"{driver}/{SWITCH}", neighbour.switch[:MAX_STRING_VALUE])
        put.text(f"{driver}/{SWITCH_PORT}", neighbour.switch_port[:MAX_STRING_VALUE])
    return put.out


def device(hca: Hca, name: str, driver: str, mode: Mode, taints: bool,
           held: Collection[str] = (), default_bandwidth: int = 0,
           neighbour: PortNeighbour | None = None) -> Device:
    entry: Device = {"name": name, "attributes": attributes(hca, driver, held, neighbour)}
    if mode is Mode.SHARED:
        entry["allowMultipleAllocations"] = True
        # Exclusive devices publish none: a request policy needs allowMultipleAllocations,
        # and a claim holding the whole HCA has nothing to share.
        if cap := capacity(hca, driver, default_bandwidth):
            entry["capacity"] = cap
    # The taint says the link is down (or the HCA unusable); a missing rdma_cm is the
    # node's, not the device's, and shows in the health stream instead.
    if taints and not (hca.usable and hca_up(hca, held)):
        value = FLAPPING if hca.name in held else link_state(hca, held)
        entry["taints"] = [{"key": f"{driver}/{LINK_DOWN_TAINT}", "value": value,
                            "effect": "NoSchedule"}]
    return entry


def _short(key: str) -> str:
    """An attribute's or capacity's name as the keep order names it: the standard ones
    whole, the driver's without its domain."""
    return key if key.startswith(STANDARD + "/") else key.rpartition("/")[2]


def _rank(key: str) -> int:
    """-1 for a name never left out; else its place in the keep order (unknown: last)."""
    name = _short(key)
    if name in NEVER_LEFT_OUT:
        return -1
    return KEEP_ORDER.index(name) if name in KEEP_ORDER else len(KEEP_ORDER)


@dataclass(frozen=True, slots=True)
class Fitted:
    device: Device
    left_out: tuple[str, ...] = ()  # attribute and capacity names, the least useful first


def fit(device: Device) -> Fitted:
    """The device within the API's 32 attributes and capacities, leaving out the least
    useful first (module docstring); ``left_out`` is empty when it fits as it is."""
    attrs = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    over = len(attrs) + len(capacity) - MAX_ATTRIBUTES_AND_CAPACITIES
    if over <= 0:
        return Fitted(device)
    candidates = sorted((k for k in (*attrs, *capacity) if _rank(k) >= 0),
                        key=lambda k: (-_rank(k), k))
    left_out = tuple(candidates[:over])
    out = device.copy()
    out["attributes"] = {k: v for k, v in attrs.items() if k not in left_out}
    kept = {k: v for k, v in capacity.items() if k not in left_out}
    if kept:
        out["capacity"] = kept
    else:
        out.pop("capacity", None)
    return Fitted(out, left_out)


def hca_device_names(names: Iterable[str], *, node_device: bool) -> dict[str, str]:
    """:func:`device_names`, keeping ``all-hcas`` free for the node-wide device (an HCA
    named ``all_hcas`` gets a hashed suffix instead)."""
    out = device_names(names)
    if node_device:
        out = {n: _unused_label(n) if label == NODE_DEVICE else label
               for n, label in out.items()}
    return out


def node_attributes(hcas: Sequence[Hca], driver: str, held: Collection[str] = ()) -> Attributes:
    """What is true of every usable HCA the node-wide device gives (module docstring)."""
    usable = every_usable(hcas)
    up = any(hca_up(h, held) for h in usable)
    put = _Attrs()
    put.text(f"{driver}/{KIND}", KIND_NODE)
    put.number(f"{driver}/{HCA_COUNT}", len(usable))
    put.text(f"{driver}/{LINK_STATE}", "up" if up else "down")
    if not usable:
        return put.out
    put.text(f"{driver}/{HCA_NAME}", NODE_HCA_NAME)
    layers = sorted({p.link_layer.value for h in usable for p in h.ports})
    put.text(f"{driver}/{LINK_LAYER}", ",".join(layers))
    rates = [_rate_gbps(h) for h in usable]
    put.number(f"{driver}/{RATE_GBPS}", None if None in rates else min(r or 0 for r in rates))
    vendors = {h.pci_vendor for h in usable}
    put.text(f"{driver}/{VENDOR}", vendors.pop() if len(vendors) == 1 else None)
    put.flag(f"{driver}/{ROCE_V2_IPV6}", all(_roce_v2_ipv6(h) for h in usable))
    return put.out


def node_device(hcas: Sequence[Hca], driver: str, taints: bool,
                held: Collection[str] = ()) -> Device:
    """The node-wide device: every usable HCA, for any number of pods at once.

    ``allowMultipleAllocations`` lets every pod's claim have it; the ``slots`` capacity
    (consumable capacity: each allocation takes its request policy's default, 1) bounds
    them to the device plugin's 1000. Tainted only when no HCA can carry traffic: one
    port down still leaves the others, as the device plugin's slots keep being given.
    """
    entry: Device = {
        "name": NODE_DEVICE, "attributes": node_attributes(hcas, driver, held),
        "allowMultipleAllocations": True,
        "capacity": {f"{driver}/{SLOTS}": {
            "value": str(NODE_SLOTS),
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}}}}}
    if taints and not any(h.usable and hca_up(h, held) for h in hcas):
        entry["taints"] = [{"key": f"{driver}/{LINK_DOWN_TAINT}", "value": "down",
                            "effect": "NoSchedule"}]
    return entry


@dataclass(frozen=True, slots=True)
class DeviceOffer:
    """What the driver offers at one moment: devices by name, and the slice's device list
    (the pool's desired devices, which the slice publisher takes)."""

    hcas: Mapping[str, Hca]  # per-HCA device name -> HCA
    devices: Sequence[Device]
    digest: str
    rdma_cm: CharDevice | None = None
    # Devices that stand for several HCAs (the node-wide one, in shared mode) -> every
    # selected HCA in the inventory's order, which is the device plugin's order too.
    groups: Mapping[str, tuple[Hca, ...]] = field(default_factory=dict)
    held: frozenset[str] = field(default=frozenset())  # HCAs held for flapping
    # Device name -> what :func:`fit` left out of it (only devices that lost something).
    left_out: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def build(cls, hcas: Sequence[Hca], driver: str, mode: Mode, taints: bool,
              rdma_cm: CharDevice | None, held: frozenset[str] = frozenset(), *,
              node_device_on: bool = True, default_bandwidth: int = 0,
              neighbours: Mapping[str, PortNeighbour] | None = None) -> DeviceOffer:
        """``node_device_on`` is ``dra.nodeDevice``, ``default_bandwidth`` is
        ``dra.defaultBandwidth`` in bits per second, ``neighbours`` each HCA's switch
        (by HCA name)."""
        heard = neighbours or {}
        # Exclusive mode keeps one HCA per unit: a device every pod shares has no place.
        node_wide = node_device_on and mode is Mode.SHARED and bool(hcas)
        names = hca_device_names((h.name for h in hcas), node_device=node_wide)
        by_device = {names[h.name]: h for h in sorted(hcas, key=lambda h: names[h.name])}
        devices = [device(h, n, driver, mode, taints, held, default_bandwidth,
                          heard.get(h.name))
                   for n, h in by_device.items()]
        groups: dict[str, tuple[Hca, ...]] = {}
        if node_wide:
            devices.append(node_device(hcas, driver, taints, held))
            groups[NODE_DEVICE] = tuple(hcas)
        fitted = [fit(d) for d in devices]
        devices = [f.device for f in fitted]
        left_out = {f.device["name"]: f.left_out for f in fitted if f.left_out}
        return cls(by_device, devices, digest(devices), rdma_cm, groups, held, left_out)

    def bandwidth(self) -> dict[str, int]:
        """Each HCA's published bandwidth (by HCA name), bits per second; 0 where its
        device publishes none (exclusive mode, or no rate known)."""
        published = {d["name"] for d in self.devices if d.get("capacity")}
        return {h.name: (bandwidth_bps(h) or 0) if n in published else 0
                for n, h in self.hcas.items()}

    def health(self) -> dict[str, bool]:
        """Each device's health as the device plugin judges its HCA (``offer.health``);
        the node-wide device is healthy while one of its HCAs is."""
        out = {n: hca_healthy(h, self.rdma_cm, self.held) for n, h in self.hcas.items()}
        out.update({n: any_healthy(hs, self.rdma_cm, self.held)
                    for n, hs in self.groups.items()})
        return out


def digest(devices: Sequence[Device]) -> str:
    return hashlib.sha256(json.dumps(devices, sort_keys=True).encode()).hexdigest()[:16]
