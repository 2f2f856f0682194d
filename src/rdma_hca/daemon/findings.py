"""Node facts that decide whether non-hostNetwork pods can use RDMA.

The install switch "allow RDMA for non-hostNetwork pods" only takes effect where the
compute network is IPv6: a pod in its own network namespace reaches the HCA through
a RoCE v2 GID of its own address, and only global IPv6 GIDs can be that. The kernel's
RDMA netns mode matters too: in exclusive mode an HCA is visible only in the
namespace it belongs to, so pods outside the host namespace see none. These checks
never stop the daemon: hostNetwork pods keep working, and the operator is told once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from rdma_hca.daemon.deviceplugin.runtime import PoolRuntime
from rdma_hca.node.model import Hca, NodeInventory
from rdma_hca.node.roce import ipv6_missing
from rdma_hca.settings.model import Settings

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
