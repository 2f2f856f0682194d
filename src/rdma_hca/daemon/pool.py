"""Which HCAs a resource offers, under which device IDs, and what Allocate returns.

A pool is pure computation over a :class:`NodeInventory`: no file is read here, so
the same code answers for real nodes, simulated nodes and benchmarks.

Shared mode offers ``rdmaHcaMax`` interchangeable IDs (slots) that all stand for the
whole set of HCAs; their health is one verdict for the pool. Exclusive mode offers
one ID per HCA with its own health and NUMA node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rdma_hca.daemon._proto import api_pb2
from rdma_hca.daemon.config import Mode, PoolConfig, UnhealthyWhen
from rdma_hca.node.model import CharDevice, Hca, NodeInventory

CDI_VENDOR_CLASS = "rdma-hca.io/hca"


class UnknownDeviceIds(ValueError):
    """Allocate named device IDs this pool never advertised."""

    def __init__(self, resource: str, ids: Sequence[str]) -> None:
        shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        super().__init__(f"unknown device IDs for {resource}: {shown}")
        self.ids = tuple(ids)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One advertised device as the kubelet sees it, before it becomes a protobuf."""

    id: str
    healthy: bool
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool's HCAs at one moment, and the verdicts derived from them."""

    config: PoolConfig
    hcas: tuple[Hca, ...]  # every selected HCA, usable or not
    rdma_cm: CharDevice | None
    nccl_env: bool = False
    cdi: bool = False
    # Allocate answers by HCA set. A view never changes, so neither do its answers, and
    # in shared mode every ID gets the same one: build it once, not on every call.
    _answers: dict[tuple[str, ...], api_pb2.ContainerAllocateResponse] = field(
        default_factory=dict, compare=False, repr=False)

    @property
    def usable(self) -> tuple[Hca, ...]:
        return tuple(h for h in self.hcas if h.usable)

    def problems(self) -> list[str]:
        """Why the pool is (partly) unhealthy, in words an operator can act on."""
        out: list[str] = []
        if not self.hcas:
            out.append("no RDMA HCA matches this pool's selectors")
        if self.rdma_cm is None or not self.rdma_cm.present:
            out.append("/dev/infiniband/rdma_cm is missing (is the rdma_ucm module loaded?)")
        for h in self.hcas:
            out.extend(f"{h.name}: {p}" for p in h.problems)
            if h.uverbs is None and not h.problems:
                out.append(f"{h.name}: no uverbs device (is ib_uverbs loaded?)")
            elif h.uverbs is not None and not h.uverbs.present and not h.problems:
                out.append(f"{h.name}: device node {h.uverbs.path} is missing")
            if not h.any_port_up:
                out.append(f"{h.name}: no port is up ({_port_summary(h)})")
        return out

    def shared_healthy(self) -> bool:
        if not self.hcas or self.rdma_cm is None or not self.rdma_cm.present:
            return False
        ok = [h.usable and h.any_port_up for h in self.hcas]
        if self.config.unhealthy_when is UnhealthyWhen.ALL:
            return any(ok)
        return all(ok)

    def hca_healthy(self, hca: Hca) -> bool:
        return (
            hca.usable and hca.any_port_up and self.rdma_cm is not None and self.rdma_cm.present
        )

    # --- what ListAndWatch advertises ------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        if self.config.mode is Mode.EXCLUSIVE:
            ids = exclusive_ids(self.hcas)
            return [
                DeviceInfo(ids[h.name], self.hca_healthy(h),
                           (h.numa_node,) if h.numa_node is not None else ())
                for h in self.hcas
            ]
        healthy = self.shared_healthy()
        numa = _single_numa(self.hcas)
        return [DeviceInfo(i, healthy, numa) for i in shared_ids(self.config.rdma_hca_max)]

    # --- Allocate ----------------------------------------------------------------------

    def hcas_for(self, ids: Sequence[str]) -> tuple[Hca, ...]:
        """The HCAs a container gets for these IDs; unknown IDs raise UnknownDeviceIds."""
        if self.config.mode is Mode.EXCLUSIVE:
            by_id = {v: k for k, v in exclusive_ids(self.hcas).items()}
            unknown = [i for i in ids if i not in by_id]
            if unknown:
                raise UnknownDeviceIds(self.config.resource_name, unknown)
            wanted = {by_id[i] for i in ids}
            return tuple(h for h in self.hcas if h.name in wanted and h.usable)
        valid = _shared_id_set(self.config.rdma_hca_max)
        unknown = [i for i in ids if i not in valid]
        if unknown:
            raise UnknownDeviceIds(self.config.resource_name, unknown)
        return self.usable

    def allocate(self, ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        """The answer for one container; callers must not modify it (it is shared)."""
        hcas = self.hcas_for(ids)
        key = tuple(h.name for h in hcas)
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = self._build_answer(hcas)
        return answer

    def _build_answer(self, hcas: Sequence[Hca]) -> api_pb2.ContainerAllocateResponse:
        names = [h.name for h in hcas]
        resp = api_pb2.ContainerAllocateResponse()
        resp.envs["RDMA_HCA_DEVICES"] = ",".join(names)
        if self.nccl_env and names:
            # "=" makes NCCL match names exactly, so mlx5_1 never also selects mlx5_10.
            resp.envs["NCCL_IB_HCA"] = "=" + ",".join(names)
        if self.cdi:
            resp.cdi_devices.extend(
                api_pb2.CDIDevice(name=f"{CDI_VENDOR_CLASS}={cdi_name(h.name)}") for h in hcas
            )
            return resp
        for node in self.device_nodes(hcas):
            resp.devices.append(
                api_pb2.DeviceSpec(container_path=node.path, host_path=node.path,
                                   permissions="rw")
            )
        return resp

    def device_nodes(self, hcas: Iterable[Hca]) -> list[CharDevice]:
        nodes: list[CharDevice] = []
        if self.rdma_cm is not None:
            nodes.append(self.rdma_cm)
        for h in hcas:
            nodes.extend(h.device_nodes())
        return nodes

    # --- GetPreferredAllocation --------------------------------------------------------

    def preferred(self, available: Sequence[str], must_include: Sequence[str],
                  size: int) -> list[str]:
        """Pick ``size`` IDs: ``must_include`` first, then the fewest NUMA nodes."""
        avail = list(dict.fromkeys(available))
        chosen = list(dict.fromkeys(must_include))
        if size <= len(chosen):
            return chosen
        rest = [i for i in avail if i not in set(chosen)]
        if self.config.mode is not Mode.EXCLUSIVE:
            return chosen + sorted(rest, key=natural_key)[: size - len(chosen)]
        ids = exclusive_ids(self.hcas)
        numa_of = {v: self._numa_by_name().get(k) for k, v in ids.items()}
        name_of = {v: k for k, v in ids.items()}
        groups: dict[int | None, list[str]] = {}
        # Within a NUMA node, HCAs in name order (mlx5_2 before mlx5_10): IDs are PCI
        # addresses, whose hex digits sort badly as numbers.
        for i in sorted(rest, key=lambda i: natural_key(name_of.get(i) or i)):
            groups.setdefault(numa_of.get(i), []).append(i)
        need = size - len(chosen)
        preferred_nodes = {numa_of.get(i) for i in chosen}
        # Same NUMA nodes as the must-include ones first, in node order.
        for node in sorted((n for n in groups if n in preferred_nodes), key=_numa_order):
            take = groups.pop(node)[:need]
            chosen += take
            need -= len(take)
            if need == 0:
                return chosen
        # One node that fits the rest (the lowest-numbered), else the largest nodes first.
        fitting = sorted((n for n in groups if len(groups[n]) >= need), key=_numa_order)
        order = fitting[:1] or sorted(groups, key=lambda n: (-len(groups[n]), _numa_order(n)))
        for node in order:
            take = groups[node][:need]
            chosen += take
            need -= len(take)
            if need == 0:
                break
        return chosen

    def _numa_by_name(self) -> dict[str, int | None]:
        return {h.name: h.numa_node for h in self.hcas}


def _numa_order(node: int | None) -> tuple[int, int]:
    return (1, 0) if node is None else (0, node)


def _port_summary(h: Hca) -> str:
    if not h.ports:
        return "no ports found"
    return ", ".join(f"port {p.number} {p.state}/{p.phys_state}" for p in h.ports)


def _single_numa(hcas: Sequence[Hca]) -> tuple[int, ...]:
    # A multi-node hint would make the Topology Manager reject pods under the
    # single-numa-node policy, so shared mode only gives a hint when it is one node.
    nodes = {h.numa_node for h in hcas}
    if len(nodes) == 1:
        (only,) = nodes
        if only is not None:
            return (only,)
    return ()


def select(config: PoolConfig, inventory: NodeInventory, *, nccl_env: bool = False,
           cdi: bool = False) -> PoolView:
    hcas = tuple(h for h in inventory.hcas if config.selectors.matches(h))
    return PoolView(config, hcas, inventory.rdma_cm, nccl_env=nccl_env, cdi=cdi)


def shared_ids(count: int) -> list[str]:
    """Slot IDs, the same on every start so the kubelet's checkpoint stays valid."""
    width = max(4, len(str(count - 1)))
    return [f"hca-{i:0{width}d}" for i in range(count)]


_SHARED_CACHE: dict[int, frozenset[str]] = {}


def _shared_id_set(count: int) -> frozenset[str]:
    cached = _SHARED_CACHE.get(count)
    if cached is None:
        cached = _SHARED_CACHE[count] = frozenset(shared_ids(count))
    return cached


def exclusive_ids(hcas: Iterable[Hca]) -> dict[str, str]:
    """HCA name -> device ID: its PCI address, or its name where that is absent or shared.

    A PCI address survives renames (mlx5_0 may become another name after a driver
    reload); a bonded HCA or soft RoCE device has none of its own, so it keeps its name.
    """
    hcas = list(hcas)
    counts: dict[str, int] = {}
    for h in hcas:
        if h.pci_address:
            counts[h.pci_address] = counts.get(h.pci_address, 0) + 1
    return {
        h.name: h.pci_address if h.pci_address and counts[h.pci_address] == 1 else h.name
        for h in hcas
    }


def cdi_name(hca_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", hca_name)


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort mlx5_2 before mlx5_10."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", text) if p)
