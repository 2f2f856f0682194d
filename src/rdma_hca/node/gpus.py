"""The node's NVIDIA GPUs as PCI functions, for joining HCAs with GPU metrics.

DCGM names a GPU by its PCI bus ID and knows nothing of the PCI tree; the HCA that serves
a GPU best (GPUDirect RDMA) is one on the same PCIe root. Reading the GPUs' place here
lets /metrics say which root and NUMA node each GPU is on. Quiet: a function that cannot be
read is left out (these are not the plugin's devices, and their oddities are not the
HCAs' warnings).
"""

from __future__ import annotations

import os

from rdma_hca.kit.text import natural_key
from rdma_hca.node.file_reads import ReadStalled, check_exhausted
from rdma_hca.node.model import Gpu
from rdma_hca.node.sysfs_values import HEX_ID, MAX_NUMA_NODE, PCI_BUS_ID, attribute_text, pcie_root
from rdma_hca.node.sysfs_walk import Walk

NVIDIA = "0x10de"
DISPLAY_CLASS = "0x03"  # PCI base class 03: display controllers (3D controller: 0x0302)


def _attr(walk: Walk, path: str) -> str | None:
    try:
        text = attribute_text(walk.io.read(path))
    except ReadStalled:
        return None
    except OSError as err:
        check_exhausted(err)
        return None
    return text


def node_gpus(walk: Walk) -> tuple[Gpu, ...]:
    """NVIDIA display-class functions under ``bus/pci/devices``, by address."""
    base = walk.path("bus", "pci", "devices")
    walk.io.working_on(None)  # a GPU's stuck file is no HCA's
    try:
        entries = walk.listdir(base)
    except OSError:
        return ()
    found: list[Gpu] = []
    for entry in sorted(entries, key=natural_key):
        if PCI_BUS_ID.fullmatch(entry) is None:
            continue
        function = os.path.join(base, entry)
        vendor = _attr(walk, os.path.join(function, "vendor"))
        if vendor is None or vendor.lower() != NVIDIA:
            continue
        cls = _attr(walk, os.path.join(function, "class"))
        if cls is None or not cls.lower().startswith(DISPLAY_CLASS):
            continue  # NVIDIA's other functions: audio, USB, NVSwitch bridges
        device = _attr(walk, os.path.join(function, "device"))
        numa_text = _attr(walk, os.path.join(function, "numa_node"))
        numa = None
        if numa_text is not None and numa_text.isdecimal() and int(numa_text) < MAX_NUMA_NODE:
            numa = int(numa_text)
        real = os.path.realpath(function)
        found.append(Gpu(
            pci_address=entry,
            device=device.lower() if device and HEX_ID.fullmatch(device) else None,
            numa_node=numa,
            pcie_root=pcie_root(walk.real_sys, real)))
    return tuple(found)
