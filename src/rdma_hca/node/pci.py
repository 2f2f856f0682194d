"""What an HCA's parent device says: PCI identity and place, NUMA node, driver, netdevs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rdma_hca.kit.text import natural_key
from rdma_hca.node.sysfs_values import (
    DIGITS,
    HEX_ID,
    MAX_NUMA_NODE,
    PCI_ADDRESS,
    PCI_BUS_ID,
    pcie_root,
)
from rdma_hca.node.sysfs_walk import Walk


@dataclass
class Parent:
    pci_address: str | None = None
    pci_bus_id: str | None = None
    pcie_root: str | None = None
    vendor: str | None = None
    device: str | None = None
    numa_node: int | None = None
    driver: str | None = None
    netdevs: list[tuple[str, int | None]] = field(default_factory=list)  # (name, dev_port)


class PciWalk(Walk):
    def parent(self, hca_dir: str) -> Parent:
        result = Parent()
        link = os.path.join(hca_dir, "device")
        if not os.path.lexists(link):
            return result  # Soft RoCE and friends have no parent device: normal
        real = os.path.realpath(link)
        if not os.path.isdir(real):
            self.warn(
                f"{link} points to {self.link_target(link)}, which does not exist; "
                "PCI address, NUMA node and driver are unknown"
            )
            return result
        driver = os.path.join(real, "driver")
        if os.path.lexists(driver):
            result.driver = os.path.basename(self.link_target(driver)) or None
        base = os.path.basename(real)
        if PCI_ADDRESS.fullmatch(base):
            result.pci_address = base.lower()
            if PCI_BUS_ID.fullmatch(result.pci_address):
                result.pci_bus_id = result.pci_address
                result.pcie_root = pcie_root(self.real_sys, real)
            hex_id = "a hex id like 0x15b3"
            vendor = self.matching(os.path.join(real, "vendor"), HEX_ID, hex_id)
            device = self.matching(os.path.join(real, "device"), HEX_ID, hex_id)
            result.vendor = vendor.lower() if vendor else None
            result.device = device.lower() if device else None
            result.numa_node = self.numa_node(os.path.join(real, "numa_node"))
        result.netdevs = self.pci_netdevs(os.path.join(real, "net"))
        return result

    def numa_node(self, path: str) -> int | None:
        text = self.text(path)
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            value = -2
        if value == -1:
            return None  # the platform does not know: no NUMA preference
        if not 0 <= value < MAX_NUMA_NODE:
            self.warn(f"{path} holds {text[:24]!r}, not a NUMA node number; NUMA node unknown")
            return None
        return value

    def pci_netdevs(self, net_dir: str) -> list[tuple[str, int | None]]:
        """Netdevs of the parent device, minus enslaved ones.

        A bond slave carries no addresses of its own: a bonded HCA (``mlx5_bond_0``)
        is reached through the bond, which its GIDs name, so the slave is left out.
        """
        try:
            names = self.listdir(net_dir)
        except OSError:
            return []
        found: list[tuple[str, int | None]] = []
        for name in sorted(names, key=natural_key):
            entry = os.path.join(net_dir, name)
            shown_name = self.netdev_name(entry, name)
            if shown_name is None:
                continue
            if os.path.lexists(os.path.join(entry, "master")):
                continue
            dev_port: int | None = None
            with_port = self.matching(os.path.join(entry, "dev_port"), DIGITS, "a number")
            if with_port is not None and len(with_port) <= 5:
                dev_port = int(with_port)
            found.append((shown_name, dev_port))
        return found
