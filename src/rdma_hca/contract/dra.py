"""What the driver publishes in its ResourceSlices: device kinds and names, attribute,
capacity and taint names, annotations, and how often it checks them.

Attribute, capacity, taint and annotation names without a domain are qualified with the
driver's name (:func:`qualified`); the ``resource.kubernetes.io`` attributes are the
standard ones GPU drivers publish too, which is what lets one claim put a GPU and an HCA
under the same PCIe root.

Two kinds of device, told apart by the ``kind`` attribute: one per HCA (``hca``), and in
shared mode one more for the node (``node``, named ``all-hcas``) that stands for every
usable HCA, as one ``rdma/hca`` slot of the device plugin does. A DeviceClass that
selects the driver without selecting ``kind`` matches both: see :func:`hca_selector`.
"""

from __future__ import annotations

from rdma_hca.contract.fabric import SWITCH, SWITCH_PORT

GROUP = "resource.k8s.io"  # the API group of ResourceSlices, ResourceClaims, DeviceClasses
GROUP_VERSION = f"{GROUP}/v1"
STANDARD = "resource.kubernetes.io"  # the standard attributes' domain

# Device kinds and the node-wide device's name.
KIND = "kind"  # attribute
KIND_HCA = "hca"
KIND_NODE = "node"
NODE_DEVICE = "all-hcas"  # the node-wide device, a name no HCA's device is given

# Attributes the driver publishes.
LINK_STATE = "linkState"  # every device: "up" or "down"
HCA_COUNT = "hcaCount"  # the node-wide device only: how many HCAs a claim of it gets
HCA_NAME = "hcaName"  # the HCA's name; the node-wide device has NODE_HCA_NAME
NODE_HCA_NAME = "all"  # no HCA's own name, so a selector by name never picks all-hcas
NETDEV = "netdev"
LINK_LAYER = "linkLayer"
RATE_GBPS = "rateGbps"
VENDOR = "vendor"
FIRMWARE = "firmware"
NODE_GUID = "nodeGUID"
ROCE_V2_IPV6 = "roceV2IPv6"
PCIE_ROOT = f"{STANDARD}/pcieRoot"
PCI_BUS_ID = f"{STANDARD}/pciBusID"
NUMA_NODE = f"{STANDARD}/numaNode"
# What a selector may name of a per-HCA device that the node-wide device may lack: a class
# naming one without selecting on ``kind`` fails allocation on the node-wide device
# ("CEL runtime error: no such key"). The node-wide device carries hcaName, linkLayer and
# rateGbps always, vendor and roceV2IPv6 only where every HCA agrees, and never one HCA's
# own identity or place (netdev, firmware, GUID, PCI, the switch it is cabled to).
HCA_ONLY_ATTRIBUTES = frozenset({NETDEV, VENDOR, FIRMWARE, NODE_GUID, ROCE_V2_IPV6, PCIE_ROOT,
                                 PCI_BUS_ID, NUMA_NODE, SWITCH, SWITCH_PORT})

# Consumable capacities.
BANDWIDTH = "bandwidth"  # per-HCA devices in shared mode: bits per second
SLOTS = "slots"  # the node-wide device: how many claims may hold it at once

# Taints: the key, and its value while the HCA is held down for flapping.
LINK_DOWN_TAINT = "link-down"
FLAPPING = "flapping"

# Annotations of each ResourceSlice.
DEVICES_HASH_ANNOTATION = "devices-hash"
SLICE_INDEX_ANNOTATION = "slice-index"

# How often (seconds) the driver reads its slices back and deletes its node's extra ones;
# the default of the setting dra.resyncSeconds.
RESYNC_SECONDS = 60.0


def request_name(request: str) -> str:
    """A result's request as the kubelet matches a container's ``request`` against it: a
    prioritized list's ``<request>/<subrequest>`` without the subrequest."""
    return request.split("/", 1)[0]


def qualified(driver: str, name: str) -> str:
    """``<driver>/<name>``: an attribute, capacity, taint or annotation of the driver."""
    return f"{driver}/{name}"


def hca_selector(driver: str) -> str:
    """The CEL a DeviceClass needs to select only per-HCA devices of ``driver``."""
    return f'device.attributes["{driver}"].{KIND} == "{KIND_HCA}"'
