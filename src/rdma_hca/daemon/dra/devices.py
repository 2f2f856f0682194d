"""From HCAs to ResourceSlice devices: names, attributes, taints, health. Pure, no I/O.

Attribute names without a domain are the driver's own; the ``resource.kubernetes.io``
ones are the standard attributes GPU drivers publish too, which is what lets one claim
put a GPU and an HCA under the same PCIe root.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rdma_hca.daemon.offer.health import hca_healthy, hca_up
from rdma_hca.node.model import CharDevice, Hca
from rdma_hca.settings.config import Mode

STANDARD = "resource.kubernetes.io"
LINK_DOWN_TAINT = "link-down"  # qualified with the driver name
FLAPPING = "flapping"  # the taint's value while the HCA is held for flapping
DEVICES_HASH_ANNOTATION = "devices-hash"  # qualified with the driver name
MAX_DNS_LABEL = 63


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
        label = plain[n]
        if counts[label] > 1:
            suffix = hashlib.sha256(n.encode()).hexdigest()[:8]
            label = f"{label[: MAX_DNS_LABEL - 9].rstrip('-')}-{suffix}"
        out[n] = label
    return out


def _label(name: str) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:MAX_DNS_LABEL].strip("-")
    return label or "hca"




def link_state(hca: Hca, held: Collection[str]) -> str:
    """Held for flapping, it reads down: the slice stays as it is while the port flaps."""
    return "up" if hca_up(hca, held) else "down"


def _rate_gbps(hca: Hca) -> int | None:
    rates = [p.rate_gbps for p in hca.ports if p.rate_gbps is not None]
    return int(max(rates)) if rates else None


def _link_layer(hca: Hca) -> str | None:
    layers = sorted({p.link_layer.value for p in hca.ports})
    return ",".join(layers) if layers else None


def attributes(hca: Hca, driver: str,
               held: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    attrs: dict[str, dict[str, Any]] = {}

    def put(key: str, kind: str, value: object) -> None:
        if value is not None and value != "":
            attrs[key] = {kind: value}

    put(f"{STANDARD}/pcieRoot", "string", hca.pcie_root)
    put(f"{STANDARD}/pciBusID", "string", hca.pci_bus_id)
    if hca.numa_node is not None and hca.numa_node >= 0:
        put(f"{STANDARD}/numaNode", "int", hca.numa_node)
    put(f"{driver}/hcaName", "string", hca.name)
    put(f"{driver}/netdev", "string", hca.netdevs[0] if hca.netdevs else None)
    put(f"{driver}/linkLayer", "string", _link_layer(hca))
    put(f"{driver}/rateGbps", "int", _rate_gbps(hca))
    put(f"{driver}/vendor", "string", hca.pci_vendor)
    put(f"{driver}/firmware", "string", hca.fw_ver)
    put(f"{driver}/nodeGUID", "string", hca.node_guid)
    put(f"{driver}/roceV2IPv6", "bool", any(
        g.is_roce_v2 and g.kind.value == "global-ipv6" for p in hca.ports for g in p.gids))
    put(f"{driver}/linkState", "string", link_state(hca, held))
    return attrs


def device(hca: Hca, name: str, driver: str, mode: Mode, taints: bool,
           held: Collection[str] = ()) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "attributes": attributes(hca, driver, held)}
    if mode is Mode.SHARED:
        entry["allowMultipleAllocations"] = True
    # The taint says the link is down (or the HCA unusable); a missing rdma_cm is the
    # node's, not the device's, and shows in the health stream instead.
    if taints and not (hca.usable and hca_up(hca, held)):
        value = FLAPPING if hca.name in held else link_state(hca, held)
        entry["taints"] = [{"key": f"{driver}/{LINK_DOWN_TAINT}", "value": value,
                            "effect": "NoSchedule"}]
    return entry


@dataclass(frozen=True, slots=True)
class Offer:
    """What the driver offers at one moment: devices by name, and the slice's device list."""

    hcas: Mapping[str, Hca]  # device name -> HCA
    devices: Sequence[dict[str, Any]]
    digest: str
    rdma_cm: CharDevice | None = None
    held: frozenset[str] = field(default=frozenset())  # HCAs held for flapping

    @classmethod
    def build(cls, hcas: Sequence[Hca], driver: str, mode: Mode, taints: bool,
              rdma_cm: CharDevice | None, held: frozenset[str] = frozenset()) -> Offer:
        names = device_names(h.name for h in hcas)
        by_device = {names[h.name]: h for h in sorted(hcas, key=lambda h: names[h.name])}
        devices = [device(h, n, driver, mode, taints, held) for n, h in by_device.items()]
        return cls(by_device, devices, digest(devices), rdma_cm, held)

    def health(self) -> dict[str, bool]:
        """Each device's health as the device plugin judges its HCA (``offer.health``)."""
        return {n: hca_healthy(h, self.rdma_cm, self.held) for n, h in self.hcas.items()}


def digest(devices: Sequence[Mapping[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(devices, sort_keys=True).encode()).hexdigest()[:16]
