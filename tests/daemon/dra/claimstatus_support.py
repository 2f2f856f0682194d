"""What the claim status writer's queue and retry tests share: a small node, claims on the
fake API server with the checkpoint's view of them, the writer built over both, and its
waits recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dra_support import DRIVER, NODE

from rdma_hca.contract.checkpoint import PreparedClaim, PreparedDevice
from rdma_hca.daemon.dra.claims import ClaimRef
from rdma_hca.daemon.dra.claimstatus import ClaimStatusWriter
from rdma_hca.daemon.dra.devices import DeviceOffer
from rdma_hca.daemon.dra.kubeapi import SliceApi
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.node.inventory import discover_node
from rdma_hca.settings.model import Mode


class Sleeps:
    """The writer's waits, recorded; each passes at once unless ``held``."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.held = False
        self._go = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.held:
            await self._go.wait()
        await asyncio.sleep(0)

    def release(self) -> None:
        self.held = False
        self._go.set()


def small_node(tmp_path: Path) -> SimNode:
    return sim.gpu_node(tmp_path / "n", hcas=2, bond=False, gid_table_size=4)


def device(name: str = "mlx5-1") -> tuple[PreparedDevice, ...]:
    return (PreparedDevice(("hca",), NODE, name, name.replace("-", "_"), (f"x/y={name}",)),)


class Claims:
    """Claims on the fake server, and which of them the driver holds prepared (the
    checkpoint's view)."""

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        self.refs: dict[str, ClaimRef] = {}
        self.prepared: dict[str, PreparedClaim] = {}

    def add(self, name: str) -> ClaimRef:
        uid = self.api.add_claim("ns", name, [
            {"request": "hca", "driver": DRIVER, "pool": NODE, "device": "mlx5-1"}])
        ref = ClaimRef("ns", uid, name)
        self.refs[name] = ref
        return ref

    def prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        self.prepared[ref.uid] = PreparedClaim(ref.namespace, ref.name, device())
        return device()

    def entries(self, name: str) -> list[dict[str, Any]]:
        return list(self.api.claim("ns", name)["status"].get("devices") or [])


def writer(client: SliceApi, node: SimNode, claims: Claims, **kw: Any) -> ClaimStatusWriter:
    inventory = discover_node(node.sysfs_root, node.dev_root)
    offer = DeviceOffer.build(inventory.hcas, DRIVER, Mode.SHARED, True, inventory.rdma_cm)
    return ClaimStatusWriter(client, DRIVER, sysfs_root=str(node.sysfs_root),
                             hca_of=offer.hcas.get, files=OffLoop(5.0), prepared=claims.prepared,
                             **kw)


def status_patches(api: FakeApiServer, name: str) -> int:
    """Status writes of the claim the server answered: applies are PATCHes."""
    return api.count("PATCH", f"/resourceclaims/{name}/status")
