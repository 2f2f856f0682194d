"""Which HCAs a resource offers, under which device IDs, and what Allocate returns.

A pool is pure computation over a :class:`NodeInventory`: no file is read here, so
the same code answers for real nodes, simulated nodes and benchmarks. It answers in
plain records (:class:`DeviceInfo`, :class:`Allocation`); the servicer (``plugin.py``)
turns them into protobuf messages, so nothing here knows the wire format.

Shared mode offers ``rdmaHcaMax`` interchangeable IDs (slots) that all stand for the
whole set of HCAs; their health is one verdict for the pool. Exclusive mode offers
one ID per HCA with its own health and NUMA node. A pool that selects no HCA (and
misses none) offers no device at all.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rdma_hca.daemon.deviceplugin.bounds import shorten_ids
from rdma_hca.daemon.offer.cdi import qualified_name
from rdma_hca.daemon.offer.env import NO_NCCL_ENV, EnvSettings, container_env
from rdma_hca.daemon.offer.health import hca_healthy, rdma_cm_ok
from rdma_hca.daemon.offer.shared import every_usable
from rdma_hca.kit.text import natural_key
from rdma_hca.node.model import CharDevice, Hca, NodeInventory
from rdma_hca.settings.model import Mode, PoolConfig, UnhealthyWhen

NO_MATCH = "no RDMA HCA matches this pool's selectors"
# An exclusive pool keeps the answers for this many distinct HCA sets (2^n are possible).
_ANSWER_CACHE = 256


class UnknownDeviceIds(ValueError):
    """Allocate named device IDs this pool never advertised."""

    def __init__(self, resource: str, ids: Sequence[str]) -> None:
        # The IDs come from the caller: show a few, each cut short, never all of them.
        super().__init__(f"unknown device IDs for {resource}: {shorten_ids(ids)}")
        self.ids = tuple(ids[:10])


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One advertised device as the kubelet sees it, before it becomes a protobuf."""

    id: str
    healthy: bool
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """A device node the container gets, at the same path as on the host."""

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one container gets for the IDs it was allocated."""

    hcas: tuple[str, ...]
    envs: tuple[tuple[str, str], ...]
    devices: tuple[DeviceSpec, ...] = ()
    mounts: tuple[Mount, ...] = ()
    cdi_devices: tuple[str, ...] = ()  # fully qualified CDI names
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool's HCAs at one moment, and the verdicts derived from them."""

    config: PoolConfig
    hcas: tuple[Hca, ...]  # every selected HCA, usable or not
    rdma_cm: CharDevice | None
    env: EnvSettings = NO_NCCL_ENV
    cdi: bool = False
    # HCAs this pool held earlier and that are gone now (driver unload, hot-unplug):
    # their last known records. They count as down until they come back.
    missing: tuple[Hca, ...] = ()
    # HCAs held down for flapping (``watch.flaps``): Unhealthy until stable.
    held: frozenset[str] = frozenset()
    # Allocate answers by HCA set. A view never changes, so neither do its answers, and
    # in shared mode every ID gets the same one: build it once, not on every call.
    _answers: dict[tuple[str, ...], Allocation] = field(
        default_factory=dict, compare=False, repr=False)

    @property
    def usable(self) -> tuple[Hca, ...]:
        return every_usable(self.hcas)

    @property
    def empty(self) -> bool:
        """Selects no HCA and misses none: nothing to advertise."""
        return not self.hcas and not self.missing

    def problems(self) -> list[str]:
        """Why the pool is (partly) unhealthy, in words an operator can act on."""
        out: list[str] = []
        if self.empty:
            out.append(NO_MATCH)
        out.extend(f"{h.name}: disappeared (driver unloaded or device removed?); counts as "
                   "down until it returns" for h in self.missing)
        if not rdma_cm_ok(self.rdma_cm):
            out.append("/dev/infiniband/rdma_cm is missing (is the rdma_ucm module loaded?)")
        for h in self.hcas:
            out.extend(f"{h.name}: {p}" for p in h.problems)
            if h.uverbs is None and not h.problems:
                out.append(f"{h.name}: no uverbs device (is ib_uverbs loaded?)")
            elif h.uverbs is not None and not h.uverbs.present and not h.problems:
                out.append(f"{h.name}: device node {h.uverbs.path} is missing")
            if not h.any_port_up:
                out.append(f"{h.name}: no port is up ({_port_summary(h)})")
            elif h.name in self.held:
                out.append(f"{h.name}: its ports flapped; counts as down until a port "
                           "stays up for flapHoldSeconds")
        return out

    def shared_healthy(self) -> bool:
        if not self.hcas:
            return False
        # A missing HCA is one more that is down.
        ok = [self.hca_healthy(h) for h in self.hcas] + [False] * len(self.missing)
        if self.config.unhealthy_when is UnhealthyWhen.ALL:
            return any(ok)
        return all(ok)

    def hca_healthy(self, hca: Hca) -> bool:
        return hca_healthy(hca, self.rdma_cm, self.held)

    # --- what ListAndWatch advertises ------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        if self.empty:
            return []
        if self.config.mode is Mode.EXCLUSIVE:
            ids = exclusive_ids(self.hcas + self.missing)
            present = [
                DeviceInfo(ids[h.name], self.hca_healthy(h),
                           (h.numa_node,) if h.numa_node is not None else ())
                for h in self.hcas
            ]
            gone = [DeviceInfo(ids[h.name], False,
                               (h.numa_node,) if h.numa_node is not None else ())
                    for h in self.missing]
            return present + gone
        return list(_shared_devices(self.config.rdma_hca_max, self.shared_healthy(),
                                    _single_numa(self.hcas)))

    # --- Allocate ----------------------------------------------------------------------

    def hcas_for(self, ids: Sequence[str]) -> tuple[Hca, ...]:
        """The HCAs a container gets for these IDs; unknown IDs raise UnknownDeviceIds."""
        if self.config.mode is Mode.EXCLUSIVE:
            by_id = {v: k for k, v in exclusive_ids(self.hcas + self.missing).items()}
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

    def allocate(self, ids: Sequence[str]) -> Allocation:
        """What one container gets for ``ids``."""
        hcas = self.hcas_for(ids)
        key = tuple(h.name for h in hcas)
        answer = self._answers.get(key)
        if answer is None:
            if len(self._answers) >= _ANSWER_CACHE:
                self._answers.clear()
            answer = self._answers[key] = self._build_answer(hcas)
        return answer

    def _build_answer(self, hcas: Sequence[Hca]) -> Allocation:
        names = tuple(h.name for h in hcas)
        envs = list(container_env(hcas, self.env).items())
        numa = tuple(sorted({h.numa_node for h in hcas if h.numa_node is not None}))
        if self.cdi:
            return Allocation(names, tuple(envs), numa_nodes=numa,
                              cdi_devices=tuple(qualified_name(n) for n in names))
        devices = tuple(DeviceSpec(node.path, node.path, "rw")
                        for node in self.device_nodes(hcas))
        return Allocation(names, tuple(envs), devices, numa_nodes=numa)

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
        """Pick ``size`` IDs: ``must_include`` first, then the fewest NUMA nodes.

        Linear in the input apart from one sort of the candidates: the kubelet may send
        every ID it knows (100,000 in shared mode) in both lists.
        """
        chosen = list(dict.fromkeys(must_include))
        if size <= len(chosen):
            return chosen
        taken = set(chosen)
        rest = [i for i in dict.fromkeys(available) if i not in taken]
        need = size - len(chosen)
        if self.config.mode is not Mode.EXCLUSIVE:
            return chosen + sorted(rest, key=natural_key)[:need]
        ids = exclusive_ids(self.hcas)
        numa_by_name = {h.name: h.numa_node for h in self.hcas}
        numa_of = {v: numa_by_name.get(k) for k, v in ids.items()}
        name_of = {v: k for k, v in ids.items()}
        groups: dict[int | None, list[str]] = {}
        # Within a NUMA node, HCAs in name order (mlx5_2 before mlx5_10): IDs are PCI
        # addresses, whose hex digits sort badly as numbers.
        for i in sorted(rest, key=lambda i: natural_key(name_of.get(i) or i)):
            groups.setdefault(numa_of.get(i), []).append(i)
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


def select(config: PoolConfig, inventory: NodeInventory, *, env: EnvSettings = NO_NCCL_ENV,
           cdi: bool = False, missing: Sequence[Hca] = ()) -> PoolView:
    hcas = tuple(h for h in inventory.hcas if config.selectors.matches(h))
    return PoolView(config, hcas, inventory.rdma_cm, env=env, cdi=cdi, missing=tuple(missing),
                    held=inventory.held & {h.name for h in hcas})


def shared_ids(count: int) -> list[str]:
    """Slot IDs, the same on every start so the kubelet's checkpoint stays valid."""
    width = max(4, len(str(count - 1)))
    return [f"hca-{i:0{width}d}" for i in range(count)]


@functools.lru_cache(maxsize=8)
def _shared_devices(count: int, healthy: bool, numa: tuple[int, ...]) -> tuple[DeviceInfo, ...]:
    # Every pool update builds the list again (each port-state change, each discovery):
    # a thousand records cost the event loop about 2.5 ms, the same on every node. The
    # records are frozen, so the same ones can serve every update with the same answer.
    return tuple(DeviceInfo(i, healthy, numa) for i in shared_ids(count))


@functools.lru_cache(maxsize=8)
def _shared_id_set(count: int) -> frozenset[str]:
    return frozenset(shared_ids(count))


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
