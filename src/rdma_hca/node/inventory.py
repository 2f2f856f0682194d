"""Discovery of a node's RDMA HCAs from sysfs and the dev tree.

Every file the daemon reads about HCAs is read by this pass (through ``file_reads``), so the
rules for trusting sysfs live in one place:

- Nothing raises on bad content. The kernel, a driver or a half-finished hot unplug can
  leave a dangling symlink, an unreadable attribute or junk behind; one broken entry must
  not take the whole node's RDMA offer down. Each one is skipped (or its field set to
  None) with one warning naming the path, kept in ``NodeInventory.warnings``.
- Running out of file descriptors or memory raises ``DiscoveryFailed``: "no HCAs" would
  be a wrong answer, not an incomplete one.
- A file that did not answer in time (``ReadStalled``) makes its HCA's state unknown: the
  HCA stays, its ports read UNKNOWN (so not up), and the path is listed in ``stalled``.
- Names are compared exactly, never by prefix: ``mlx5_1`` is not ``mlx5_10``.
- No vendor tables: any device under ``class/infiniband`` is an HCA (mlx5, erdma, irdma,
  bnxt_re, efa, rxe, siw ...).
"""

from __future__ import annotations

import os
from dataclasses import replace

from rdma_hca.node.file_reads import DiscoveryFailed, Reads
from rdma_hca.node.gpus import node_gpus
from rdma_hca.node.model import CharDevice, Hca, NodeInventory, Port
from rdma_hca.node.pci import PciWalk
from rdma_hca.node.ports import PortWalk
from rdma_hca.node.sysfs_values import (
    GUID,
    MAD,
    MAX_PORT,
    NETNS_MODES,
    UNKNOWN,
    UVERBS,
    display_name,
    is_number,
    printable,
    unusable_warning,
)
from rdma_hca.node.sysfs_walk import StrPath


def stalled_ports(ports: tuple[Port, ...]) -> tuple[Port, ...]:
    return tuple(replace(p, state=UNKNOWN, phys_state=UNKNOWN) for p in ports)


class Discovery(PortWalk, PciWalk):
    """One pass over sysfs; collects warnings as it goes."""

    def __init__(self, sysfs_root: StrPath, dev_root: StrPath, io: Reads | None = None) -> None:
        super().__init__(sysfs_root, dev_root, io)
        self.uverbs: dict[str, str] = {}
        self.umad: dict[tuple[str, int], str] = {}
        self.issm: dict[tuple[str, int], str] = {}

    def load_char_maps(self) -> None:
        for name, entry in self.class_dirs("infiniband_verbs"):
            if not UVERBS.fullmatch(name):
                continue
            ibdev = self.name_text(os.path.join(entry, "ibdev"))
            if ibdev is None:
                self.warn(f"{entry}/ibdev is missing or unreadable; cannot tell its HCA")
            elif ibdev in self.uverbs:
                self.warn(
                    f"{entry}/ibdev names {ibdev}, already served by {self.uverbs[ibdev]}; "
                    "ignoring the second one"
                )
            else:
                self.uverbs[ibdev] = name
        for name, entry in self.class_dirs("infiniband_mad"):
            m = MAD.fullmatch(name)
            if m is None:
                continue
            ibdev = self.name_text(os.path.join(entry, "ibdev"))
            port = self.number(os.path.join(entry, "port"), MAX_PORT, "a port number")
            if ibdev is None or port is None:
                self.warn(f"{entry} does not say which HCA port it serves; ignoring it")
                continue
            table = self.umad if m.group(1) == "umad" else self.issm
            table.setdefault((ibdev, port), name)

    # -- one HCA -----------------------------------------------------------------------

    def hca(self, raw_name: str, hca_dir: str) -> Hca:
        name = display_name(raw_name)
        stalls_before = len(self.io.stalled)
        self.io.working_on(name)
        parent = self.parent(hca_dir)
        guid = self.matching(
            os.path.join(hca_dir, "node_guid"), GUID, "a GUID like b859:9f03:00d4:3c22"
        )
        soft_parent = None
        parent_file = os.path.join(hca_dir, "parent")
        text = self.text(parent_file)
        if text is not None:
            soft_parent = self.netdev_name(parent_file, text)
        ports = self.ports(name, hca_dir, parent, soft_parent)
        fw_ver = self.text(os.path.join(hca_dir, "fw_ver"))
        board_id = self.text(os.path.join(hca_dir, "board_id"))
        hca_type = self.text(os.path.join(hca_dir, "hca_type"))
        stalled = self.io.stalled[stalls_before:]
        if stalled:
            ports = stalled_ports(ports)
            self.warn(
                f"{name}: {', '.join(stalled)} did not answer in time; its ports are taken "
                f"as {UNKNOWN} (not up) until every read of it answers again"
            )
        problems = self.problems(name, raw_name, hca_dir)
        uverbs: CharDevice | None = None
        uverbs_name = self.uverbs.get(name)
        if uverbs_name is not None:
            uverbs = self.char_device(uverbs_name)
        for problem in problems:
            self.warn(unusable_warning(name, problem))
        self.io.working_on(None)
        return Hca(
            name=name,
            driver=parent.driver,
            node_guid=guid.lower() if guid else None,
            fw_ver=fw_ver,
            board_id=board_id,
            hca_type=hca_type,
            pci_address=parent.pci_address,
            pci_vendor=parent.vendor,
            pci_device=parent.device,
            numa_node=parent.numa_node,
            ports=ports,
            uverbs=uverbs,
            problems=tuple(problems),
            pci_bus_id=parent.pci_bus_id,
            pcie_root=parent.pcie_root,
        )

    def problems(self, name: str, raw_name: str, hca_dir: str) -> list[str]:
        problems: list[str] = []
        if name != raw_name:
            # Containers get the name in RDMA_HCA_DEVICES and NCCL_IB_HCA; an escaped
            # form would name a device that does not exist there.
            problems.append(
                f"its name holds bytes that are not UTF-8 text ({printable(hca_dir)}, shown "
                "escaped); rename it (rdma dev set <name> name <new-name>)"
            )
        uverbs_name = self.uverbs.get(name)
        if uverbs_name is None:
            problems.append(
                f"no entry in {self.path('class', 'infiniband_verbs')} belongs to it "
                "(is the ib_uverbs module loaded?)"
            )
        else:
            uverbs = self.char_device(uverbs_name)
            if not uverbs.present:
                problems.append(
                    f"device node {uverbs.path} is missing under {printable(self.dev)} "
                    "(mount the host's /dev/infiniband there)"
                )
        return problems

    # -- node-wide -----------------------------------------------------------------------

    def netns_mode(self) -> str | None:
        path = self.path("module", "ib_core", "parameters", "netns_mode")
        text = self.text(path)
        if text is None:
            return None
        mode = NETNS_MODES.get(text)
        if mode is None:
            self.warn(f"{path} holds {text!r}, expected Y or N; RDMA netns mode unknown")
        return mode

    def rdma_cm(self) -> CharDevice | None:
        entry = self.path("class", "misc", "rdma_cm")
        if os.path.isdir(entry):
            return self.char_device("rdma_cm")
        if os.path.islink(entry):
            self.warn(f"{entry} is a dangling symlink (-> {self.link_target(entry)}); no rdma_cm")
        return None

    def run(self) -> NodeInventory:
        if not os.path.isdir(self.sys):
            self.warn(
                f"sysfs root {self.sys} does not exist or is not a directory; no HCAs can be "
                "found (mount the host's /sys there or pass the right sysfs root)"
            )
            return self.inventory((), None, None)
        self.load_char_maps()
        hcas = tuple(self.hca(name, path) for name, path in self.class_dirs("infiniband"))
        rdma_cm = self.rdma_cm()
        netns = self.netns_mode()
        gpus = node_gpus(self)
        self.io.checkpoint()
        return replace(self.inventory(hcas, rdma_cm, netns), gpus=gpus)

    def inventory(
        self, hcas: tuple[Hca, ...], rdma_cm: CharDevice | None, netns: str | None
    ) -> NodeInventory:
        stalled = tuple(sorted({printable(os.path.abspath(p)) for p in self.io.stalled}))
        return NodeInventory(
            hcas=hcas,
            rdma_cm=rdma_cm,
            netns_mode=netns,
            warnings=tuple(self.warnings),
            stalled=stalled,
        )


def discover_node(sysfs_root: StrPath, dev_root: StrPath) -> NodeInventory:
    """Everything about the node's HCAs in one pass, in the calling thread, with no
    deadline; never raises on bad sysfs content (DiscoveryFailed when a resource ran out).

    ``sysfs_root`` is normally ``/sys`` and ``dev_root`` normally ``/dev``. HCAs come
    back sorted by name (naturally: mlx5_2 before mlx5_10). Code that must not hang with
    a stuck file uses ``node.deadline_reader`` instead.
    """
    try:
        return Discovery(sysfs_root, dev_root).run()
    except MemoryError as err:
        raise DiscoveryFailed("discovery ran out of memory") from err


def is_port_entry(entry: str) -> bool:
    return is_number(entry) and int(entry) < MAX_PORT
