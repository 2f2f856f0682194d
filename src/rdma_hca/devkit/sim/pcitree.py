"""The PCI side of a simulated node: root complexes, bridges, GPUs, ``bus/pci/devices``.

A PCI function's directory sits under its root complex (``devices/pci0000:3a``) behind
its bridges, as on real servers; Kubernetes' ``resource.kubernetes.io/pcieRoot`` is that
root complex, so tests can put HCAs and GPUs under known roots and check the answer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rdma_hca.devkit.sim.specs import HcaSpec, pci_parts, symlink, write_line


@dataclass(frozen=True)
class GpuSpec:
    """A GPU as a PCI function (an H100 by default): it only has to sit in the PCI tree,
    so DRA's pcieRoot of each HCA can be checked against the GPUs beside it."""

    pci_address: str
    pcie_root: str
    bridges: tuple[str, ...] = ()
    vendor: str = "0x10de"
    device: str = "0x2330"
    numa_node: int | None = None


def default_topology(address: str) -> tuple[str, tuple[str, ...]]:
    """Root complex and bridges of a PCI function whose spec does not say: one root
    complex per domain and one root port per bus, as on a simple server."""
    domain, bus, _ = pci_parts(address)
    if bus == 0:
        return f"pci{domain}:00", ()
    return f"pci{domain}:00", (f"{domain}:00:{bus % 0x1F + 1:02x}.0",)


def topology(spec: HcaSpec) -> tuple[str, tuple[str, ...]]:
    """(root complex, bridges from it down) of a PCI HCA."""
    assert spec.pci_address is not None
    root, bridges = default_topology(spec.pci_address)
    return (spec.pcie_root or root), (bridges if spec.bridges is None else spec.bridges)


class PciTree:
    """What SimNode does with PCI functions that are not HCAs (bridges, GPUs)."""

    specs: dict[str, HcaSpec]
    gpus: list[GpuSpec]

    def _s(self, *parts: str) -> str:
        raise NotImplementedError

    def expected_pcie_root(self, name: str) -> str | None:
        """The answer ``resource.kubernetes.io/pcieRoot`` must give for an HCA."""
        spec = self.specs[name]
        return None if spec.pci_address is None else topology(spec)[0]

    def gpus_by_root(self) -> dict[str, list[str]]:
        """PCI addresses of the GPUs under each root complex."""
        found: dict[str, list[str]] = {}
        for gpu in self.gpus:
            found.setdefault(gpu.pcie_root, []).append(gpu.pci_address)
        return found

    def _make_bridges(self, root: str, bridges: tuple[str, ...]) -> None:
        path = self._s("devices", root)
        for bridge in bridges:
            path = os.path.join(path, bridge)
            if not os.path.isdir(path):
                os.makedirs(path)
                write_line(os.path.join(path, "vendor"), "0x8086")
                write_line(os.path.join(path, "device"), "0x347a")
                write_line(os.path.join(path, "class"), "0x060400")
                self._bus_link(path)

    def _bus_link(self, function_dir: str) -> None:
        """``bus/pci/devices/<address>``: how Kubernetes finds a function's place."""
        link = self._s("bus", "pci", "devices", os.path.basename(function_dir))
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if os.path.lexists(link):
            os.unlink(link)
        symlink(function_dir, link)

    def add_gpu(self, gpu: GpuSpec) -> None:
        """A GPU function under ``gpu.pcie_root`` behind ``gpu.bridges``."""
        self._make_bridges(gpu.pcie_root, gpu.bridges)
        path = self._s("devices", gpu.pcie_root, *gpu.bridges, gpu.pci_address)
        os.makedirs(path)
        write_line(os.path.join(path, "vendor"), gpu.vendor)
        write_line(os.path.join(path, "device"), gpu.device)
        write_line(os.path.join(path, "class"), "0x030200")
        numa = -1 if gpu.numa_node is None else gpu.numa_node
        write_line(os.path.join(path, "numa_node"), str(numa))
        drv = self._s("bus", "pci", "drivers", "nvidia")
        os.makedirs(drv, exist_ok=True)
        symlink(drv, os.path.join(path, "driver"))
        self._bus_link(path)
        self.gpus.append(gpu)
