"""RoCE facts about HCAs that the daemon's findings, the metrics and the doctor share."""

from __future__ import annotations

from collections.abc import Iterable

from rdma_hca.node.model import GidKind, Hca, LinkLayer


def has_global_ipv6_roce_v2(hca: Hca) -> bool:
    return any(
        g.is_roce_v2 and g.kind is GidKind.GLOBAL_IPV6 for p in hca.ports for g in p.gids
    )


def is_roce(hca: Hca) -> bool:
    return any(p.link_layer is LinkLayer.ETHERNET for p in hca.ports)


def ipv6_missing(hcas: Iterable[Hca]) -> list[str]:
    """RoCE HCAs without a RoCE v2 GID holding a global IPv6 address (IB is exempt)."""
    return [h.name for h in hcas if is_roce(h) and not has_global_ipv6_roce_v2(h)]
