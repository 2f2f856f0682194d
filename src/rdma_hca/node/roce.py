"""RoCE facts about HCAs that the daemon's findings, the metrics and the doctor share."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from rdma_hca.node.model import Gid, GidKind, Hca, LinkLayer, Port


def has_global_ipv6_roce_v2(hca: Hca) -> bool:
    return any(
        g.is_roce_v2 and g.kind is GidKind.GLOBAL_IPV6 for p in hca.ports for g in p.gids
    )


def is_roce(hca: Hca) -> bool:
    return any(p.link_layer is LinkLayer.ETHERNET for p in hca.ports)


def ipv6_missing(hcas: Iterable[Hca]) -> list[str]:
    """RoCE HCAs without a RoCE v2 GID holding a global IPv6 address (IB is exempt)."""
    return [h.name for h in hcas if is_roce(h) and not has_global_ipv6_roce_v2(h)]


class AddrFamily(StrEnum):
    """The address families NCCL_IB_ADDR_FAMILY names, as NCCL spells them."""

    INET = "AF_INET"
    INET6 = "AF_INET6"


_FAMILY_KIND = {AddrFamily.INET: GidKind.IPV4_MAPPED, AddrFamily.INET6: GidKind.GLOBAL_IPV6}


def family_gid(port: Port, family: AddrFamily) -> Gid | None:
    """The lowest-index RoCE v2 GID of ``family`` on ``port``, the one NCCL's own choice
    (NCCL_IB_ADDR_FAMILY, NCCL_IB_ROCE_VERSION_NUM=2) would take.

    Like NCCL, a link-local IPv6 GID does not count: it cannot be routed between nodes.
    """
    kind = _FAMILY_KIND[family]
    found = [g for g in port.gids if g.is_roce_v2 and g.kind is kind]
    return min(found, key=lambda g: g.index) if found else None


def gid_at(port: Port, index: int) -> Gid | None:
    for g in port.gids:
        if g.index == index:
            return g
    return None


def gid_family(gid: Gid) -> AddrFamily | None:
    for family, kind in _FAMILY_KIND.items():
        if gid.kind is kind:
            return family
    return None
