"""What the LLDP tests share: HCAs with RoCE ports, a clock to move, and sockets that
stand in for the raw ones (a socket pair per netdev: the test writes frames into one end,
the listener reads the other through the event loop, as it reads an AF_PACKET socket)."""

from __future__ import annotations

import errno
import socket

from rdma_hca.node.model import CharDevice, Hca, LinkLayer, NodeInventory, Port

SWITCH_A = bytes.fromhex("0c42a1000001")
SWITCH_B = bytes.fromhex("0c42a1000002")


def hca(name: str, *netdevs: str, layer: LinkLayer = LinkLayer.ETHERNET) -> Hca:
    ports = tuple(
        Port(number=i + 1, state="ACTIVE", phys_state="LinkUp", link_layer=layer,
             rate="400 Gb/sec (4X NDR)", rate_gbps=400.0, netdevs=(n,) if n else (), gids=())
        for i, n in enumerate(netdevs))
    return Hca(name=name, driver="mlx5_core", node_guid=None, fw_ver=None, board_id=None,
               hca_type=None, pci_address=None, pci_vendor=None, pci_device=None,
               numa_node=None, ports=ports,
               uverbs=CharDevice("uverbs0", "/dev/infiniband/uverbs0", True))


def inventory(*hcas: Hca) -> NodeInventory:
    return NodeInventory(hcas=hcas, rdma_cm=None, netns_mode="shared")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Wires:
    """An opener of socket pairs: ``send(netdev, frame)`` puts a frame on the wire."""

    def __init__(self, *, refuse: int | None = None, missing: tuple[str, ...] = ()) -> None:
        self.refuse = refuse
        self.missing = missing
        self.far: dict[str, socket.socket] = {}
        self.near: dict[str, socket.socket] = {}

    def __call__(self, netdev: str) -> socket.socket:
        if self.refuse is not None:
            raise PermissionError(self.refuse, "Operation not permitted")
        if netdev in self.missing:
            raise OSError(errno.ENODEV, "No such device")
        near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        near.setblocking(False)
        self.near[netdev], self.far[netdev] = near, far
        return near

    def send(self, netdev: str, frame: bytes) -> None:
        self.far[netdev].send(frame)

    def close(self) -> None:
        for s in (*self.far.values(), *self.near.values()):
            s.close()
