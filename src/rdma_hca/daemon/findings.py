"""Node facts that decide whether non-hostNetwork pods can use RDMA.

The install switch "allow RDMA for non-hostNetwork pods" only takes effect where the
compute network is IPv6: a pod in its own network namespace reaches the HCA through
a RoCE v2 GID of its own address, and only global IPv6 GIDs can be that. The kernel's
RDMA netns mode matters too: in exclusive mode an HCA is visible only in the
namespace it belongs to, so pods outside the host namespace see none. These checks
never stop the daemon: hostNetwork pods keep working, and the operator is told once.

:class:`NodeJudge` follows the node's inventories: the findings, the IPv6 gauge
(``rdma_hca_ipv6_ready``), and overlaps of pools that only a new HCA made.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rdma_hca.daemon.overlaps import PoolOverlaps
from rdma_hca.kit.workers import WORKERS
from rdma_hca.node.model import Gid, Hca, NodeInventory
from rdma_hca.node.roce import ipv6_missing
from rdma_hca.settings.model import Settings

if TYPE_CHECKING:
    # The pools' runtimes are read, never made here: the DRA driver alone has none and
    # loads nothing of the device plugin.
    from rdma_hca.daemon.deviceplugin.runtime import PoolRuntime

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeFindings:
    non_host_network: bool = False
    netns_mode: str | None = None
    ipv6_missing: tuple[str, ...] = ()

    @property
    def ipv6_ready(self) -> bool:
        return not self.ipv6_missing

    def messages(self) -> list[str]:
        out: list[str] = []
        if self.non_host_network and self.ipv6_missing:
            out.append(
                "non-hostNetwork RDMA is on, but these RoCE HCAs have no RoCE v2 GID with a "
                f"global IPv6 address: {', '.join(self.ipv6_missing)}. Non-hostNetwork pods "
                "cannot use RDMA over them (it needs an IPv6 compute network): where other "
                "HCAs have one, their NCCL_IB_HCA leaves these out; hostNetwork pods still "
                "can."
            )
        if self.non_host_network and self.netns_mode == "exclusive":
            out.append(
                "the kernel's RDMA netns mode is exclusive: HCAs are visible only in the host "
                "network namespace, so non-hostNetwork pods cannot see them. Switch to shared "
                "mode (`rdma system set netns shared`, or ib_core netns_mode=1) or use "
                "hostNetwork pods."
            )
        return out

    def log_changes(self, previous: NodeFindings) -> None:
        before = set(previous.messages())
        now = self.messages()
        for m in now:
            if m not in before:
                log.warning("%s", m)
        if before and not now:
            log.info("non-hostNetwork RDMA: the node is ready for it again")


def evaluate_node(
    inventory: NodeInventory, settings: Settings, runtimes: Sequence[PoolRuntime]
) -> NodeFindings:
    pool_hcas: dict[str, Hca] = {}
    for r in runtimes:
        for h in r.view.hcas:
            pool_hcas[h.name] = h
    return NodeFindings(
        non_host_network=settings.non_host_network,
        netns_mode=inventory.netns_mode,
        ipv6_missing=tuple(ipv6_missing(pool_hcas.values())) if settings.non_host_network
        else (),
    )


class NodeJudge:
    """The node's judgement, taken again for each inventory (a follower of the watcher's)."""

    def __init__(self, settings: Settings, runtimes: Sequence[PoolRuntime],
                 overlaps: PoolOverlaps) -> None:
        self.settings = settings
        self.runtimes = runtimes
        self.overlaps = overlaps
        self.findings = NodeFindings()
        self.ipv6_ready = False
        self._ipv6_gids: tuple[tuple[Gid, ...], ...] | None = None

    async def judge(self, inventory: NodeInventory) -> None:
        """The non-hostNetwork findings and the IPv6 gauge, from the pools' HCAs."""
        pool_hcas = {h.name: h for r in self.runtimes for h in r.view.hcas}
        # Judged from the pools' HCAs whether or not the switch is on: the node findings
        # only look when it is, and an operator reads the gauge to decide whether to
        # turn it on. Only GIDs decide it, and a port's GIDs are the very same tuple
        # until a discovery reads them again: every GID of every port is read once
        # per discovery, not once per port-state change.
        gids = tuple(p.gids for h in pool_hcas.values() for p in h.ports)
        seen = self._ipv6_gids
        if seen is None or len(seen) != len(gids) or any(
                a is not b for a, b in zip(seen, gids, strict=True)):
            self._ipv6_gids = gids
            # Tens of thousands of GIDs on a large node: judged on a worker thread.
            hcas = tuple(pool_hcas.values())
            self.ipv6_ready = not await WORKERS.run(lambda: ipv6_missing(hcas),
                                                    "rdma-hca-ipv6")
        self.overlaps.say_late(inventory.hcas)
        findings = evaluate_node(inventory, self.settings, self.runtimes)
        if findings != self.findings:
            findings.log_changes(self.findings)
            self.findings = findings
