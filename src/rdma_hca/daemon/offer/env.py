"""The environment a container gets for its HCAs: one builder for both front ends.

The device plugin's Allocate and the DRA driver's per-claim CDI spec both hand a container
the same variables, computed here from the discovered records of exactly the HCAs it got:

- ``RDMA_HCA_DEVICES``: the HCA names, always (``rdma-hca check`` reads it);
- with ``ncclEnv`` ``hca`` or ``auto``: ``NCCL_IB_HCA`` in NCCL's exact-match form
  (``=mlx5_0:1,mlx5_3:1``: without ``=`` NCCL matches prefixes, so ``mlx5_1`` would also
  take ``mlx5_10``), listing only ports that are up;
- with ``auto`` also: the GID NCCL should use on RoCE (``NCCL_IB_GID_INDEX`` when every
  RoCE port has the wanted GID at one index, else ``NCCL_IB_ADDR_FAMILY`` with
  ``NCCL_IB_ROCE_VERSION_NUM=2``; nothing for InfiniBand), ``UCX_NET_DEVICES``, and on the
  host network ``NCCL_SOCKET_IFNAME`` (exact form) naming the RoCE netdevs that hold an
  IP address.

The wanted address family: IPv6 for non-hostNetwork pods (their RDMA network is IPv6);
on the host network IPv4 where every RoCE port has one, else IPv6 where every port has
that. Where no family covers every port, no GID variable is set (a guess would be right
on one node and wrong on the next) and a note says why: the front ends log it once.

Off the host network a RoCE port without a RoCE v2 IPv6 GID (a bond nobody gave an IPv6
address, beside HCAs that have one) cannot carry the pod's RDMA at all: it is left out of
``NCCL_IB_HCA`` and ``UCX_NET_DEVICES`` as a down port is, so the family is still set for
the others, and a note names it. Only while some other port remains: on a node where no
port has one, nothing would be left, and the GID variables are left unset instead.

A DRA claim's parameters (``HcaConfig``, ``contract/hcaconfig.py``) come last and win:
the GID asked for (by index, or the RoCE v2 GID of a family on every port) in
``NCCL_IB_GID_INDEX`` and ``UCX_IB_GID_INDEX``, the traffic class in ``NCCL_IB_TC`` and
``UCX_IB_TRAFFIC_CLASS``, the InfiniBand service level in ``NCCL_IB_SL`` and
``UCX_IB_SL``, whatever ``ncclEnv`` says (the claim asked). A GID the HCAs do not have is
an :class:`HcaConfigError` naming the port.

Pure computation: records and settings in, variables out. docs/nccl.md explains each
variable and how a pod overrides them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from rdma_hca.contract.hcaconfig import (
    GID_FAMILY,
    GID_INDEX,
    KIND,
    GidFamily,
    HcaConfig,
    HcaConfigError,
)
from rdma_hca.kit.sayonce import Once
from rdma_hca.node.model import GidKind, Hca, LinkLayer, Port
from rdma_hca.node.roce import AddrFamily, family_gid, gid_at
from rdma_hca.settings.model import NcclEnv, Settings

log = logging.getLogger(__name__)

RDMA_HCA_DEVICES = "RDMA_HCA_DEVICES"
NCCL_IB_HCA = "NCCL_IB_HCA"
NCCL_IB_GID_INDEX = "NCCL_IB_GID_INDEX"
NCCL_IB_ADDR_FAMILY = "NCCL_IB_ADDR_FAMILY"
NCCL_IB_ROCE_VERSION_NUM = "NCCL_IB_ROCE_VERSION_NUM"
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
UCX_NET_DEVICES = "UCX_NET_DEVICES"
UCX_IB_GID_INDEX = "UCX_IB_GID_INDEX"
NCCL_IB_TC = "NCCL_IB_TC"
UCX_IB_TRAFFIC_CLASS = "UCX_IB_TRAFFIC_CLASS"
NCCL_IB_SL = "NCCL_IB_SL"
UCX_IB_SL = "UCX_IB_SL"
_GID_VARIABLES = (NCCL_IB_GID_INDEX, NCCL_IB_ADDR_FAMILY, NCCL_IB_ROCE_VERSION_NUM,
                  UCX_IB_GID_INDEX)
_FAMILIES = {GidFamily.IPV4: AddrFamily.INET, GidFamily.IPV6: AddrFamily.INET6}

# GIDs that carry an IP address another node can reach.
_ROUTABLE = (GidKind.IPV4_MAPPED, GidKind.GLOBAL_IPV6)


@dataclass(frozen=True, slots=True)
class EnvSettings:
    """The settings the env depends on. ``non_host_network`` is the daemon's switch: on,
    pods are expected off the host network (their own eth0, an IPv6 RDMA network)."""

    nccl: NcclEnv = NcclEnv.OFF
    non_host_network: bool = False


@dataclass(frozen=True, slots=True)
class ContainerEnv:
    """The variables, in a stable order, and why some were left out (one line each)."""

    variables: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, str]:
        return dict(self.variables)


def _up_ports(hcas: Sequence[Hca]) -> list[tuple[Hca, Port]]:
    return [(h, p) for h in hcas for p in h.ports if p.is_up]


def _port_name(hca: Hca, port: Port) -> str:
    return f"{hca.name}:{port.number}"


def _without_ipv6(ports: Sequence[tuple[Hca, Port]]) -> list[tuple[Hca, Port]]:
    """The RoCE ports that have no RoCE v2 GID with a global IPv6 address."""
    return [(h, p) for h, p in ports
            if p.link_layer is LinkLayer.ETHERNET and family_gid(p, AddrFamily.INET6) is None]


def _gid_variables(ports: Sequence[tuple[Hca, Port]],
                   settings: EnvSettings) -> tuple[list[tuple[str, str]], list[str]]:
    roce = [(h, p) for h, p in ports if p.link_layer is LinkLayer.ETHERNET]
    if not roce:
        return [], []  # InfiniBand (or nothing up): NCCL needs no GID choice
    if settings.non_host_network:
        families = [AddrFamily.INET6]
    else:
        families = [AddrFamily.INET, AddrFamily.INET6]
    for family in families:
        gids = [family_gid(p, family) for _, p in roce]
        if all(g is not None for g in gids):
            indices = {g.index for g in gids if g is not None}
            # One index fits every version of NCCL (before 2.21 there is no automatic
            # choice); it is only safe when every port is RoCE: NCCL applies it to all.
            if len(indices) == 1 and len(roce) == len(ports):
                return [(NCCL_IB_GID_INDEX, str(indices.pop()))], []
            return [(NCCL_IB_ADDR_FAMILY, family.value), (NCCL_IB_ROCE_VERSION_NUM, "2")], []
    wanted = families[0]
    missing = [_port_name(h, p) for h, p in roce if family_gid(p, wanted) is None]
    if settings.non_host_network:
        why = (f"no RoCE v2 GID with a global IPv6 address on {', '.join(missing)}: "
               "non-hostNetwork pods need one (an IPv6 compute network); "
               f"{NCCL_IB_ADDR_FAMILY} and {NCCL_IB_GID_INDEX} are not set")
    else:
        why = (f"no address family has a RoCE v2 GID on every allocated port (no IPv4 GID "
               f"on {', '.join(missing)}, and not IPv6 on all either); "
               f"{NCCL_IB_ADDR_FAMILY} and {NCCL_IB_GID_INDEX} are not set")
    return [], [why]


def _asked_gid(hcas: Sequence[Hca], asked: HcaConfig) -> list[tuple[str, str]]:
    """The GID variables for the GID a claim asked for, checked against the ports that
    carry its traffic (those up; all of them when none is)."""
    ports = _up_ports(hcas) or [(h, p) for h in hcas for p in h.ports]
    if asked.gid_index is not None:
        for h, p in ports:
            if gid_at(p, asked.gid_index) is None:
                raise HcaConfigError(
                    f'{KIND} field "{GID_INDEX}": {asked.gid_index} is not accepted here: '
                    f"{_port_name(h, p)} has no GID at index {asked.gid_index} (its GIDs: "
                    f"{', '.join(str(g.index) for g in p.gids) or 'none'})")
        return [(NCCL_IB_GID_INDEX, str(asked.gid_index)),
                (UCX_IB_GID_INDEX, str(asked.gid_index))]
    assert asked.gid_family is not None
    family = _FAMILIES[asked.gid_family]
    roce = [(h, p) for h, p in ports if p.link_layer is LinkLayer.ETHERNET]
    if not roce:
        raise HcaConfigError(
            f'{KIND} field "{GID_FAMILY}": "{asked.gid_family}" is not accepted here: it '
            f"chooses a RoCE v2 GID, and {', '.join(h.name for h in hcas)} "
            "has no RoCE port (InfiniBand needs no GID choice: leave the field out)")
    indices = set()
    for h, p in roce:
        gid = family_gid(p, family)
        if gid is None:
            raise HcaConfigError(
                f'{KIND} field "{GID_FAMILY}": "{asked.gid_family}" is not accepted here: '
                f"{_port_name(h, p)} has no RoCE v2 GID with an {asked.gid_family} address "
                "(give its netdev one, or ask for the other family)")
        indices.add(gid.index)
    if len(indices) == 1 and len(roce) == len(ports):
        index = str(indices.pop())
        return [(NCCL_IB_GID_INDEX, index), (UCX_IB_GID_INDEX, index)]
    # The GID of the family sits at different indices: NCCL finds it per port itself.
    return [(NCCL_IB_ADDR_FAMILY, family.value), (NCCL_IB_ROCE_VERSION_NUM, "2")]


def _asked(hcas: Sequence[Hca], variables: list[tuple[str, str]],
           asked: HcaConfig) -> list[tuple[str, str]]:
    """``variables`` with what a claim asked for in place of the daemon's choice."""
    own: list[tuple[str, str]] = []
    if asked.gid_index is not None or asked.gid_family is not None:
        own += _asked_gid(hcas, asked)
        variables = [(k, v) for k, v in variables if k not in _GID_VARIABLES]
    if asked.traffic_class is not None:
        own += [(NCCL_IB_TC, str(asked.traffic_class)),
                (UCX_IB_TRAFFIC_CLASS, str(asked.traffic_class))]
    if asked.service_level is not None:
        own += [(NCCL_IB_SL, str(asked.service_level)), (UCX_IB_SL, str(asked.service_level))]
    return variables + own


def build(hcas: Sequence[Hca], settings: EnvSettings,
          asked: HcaConfig | None = None) -> ContainerEnv:
    """The variables a container gets for ``hcas`` (the ones it was allocated), and what
    its claim ``asked`` for (HcaConfigError when the HCAs cannot give it)."""
    env = _build(hcas, settings)
    if asked is None or asked.empty:
        return env
    return ContainerEnv(tuple(_asked(hcas, list(env.variables), asked)), env.notes)


def _build(hcas: Sequence[Hca], settings: EnvSettings) -> ContainerEnv:
    names = [h.name for h in hcas]
    variables: list[tuple[str, str]] = [(RDMA_HCA_DEVICES, ",".join(names))]
    notes: list[str] = []
    if settings.nccl is NcclEnv.OFF or not hcas:
        return ContainerEnv(tuple(variables))
    ports = _up_ports(hcas)
    if not ports:
        notes.append(f"no port is up on {', '.join(names)}: {NCCL_IB_HCA} is not set")
        return ContainerEnv(tuple(variables), tuple(notes))
    if settings.non_host_network and settings.nccl is NcclEnv.AUTO:
        left_out = _without_ipv6(ports)
        if left_out and len(left_out) < len(ports):
            ports = [hp for hp in ports if hp not in left_out]
            notes.append(
                f"{', '.join(_port_name(h, p) for h, p in left_out)} left out of "
                f"{NCCL_IB_HCA} and {UCX_NET_DEVICES}: no RoCE v2 GID with a global IPv6 "
                "address, which non-hostNetwork pods need (their RDMA goes over the node's "
                "IPv6 network); the other HCAs get the IPv6 GID")
    listed = ",".join(_port_name(h, p) for h, p in ports)
    variables.append((NCCL_IB_HCA, "=" + listed))
    if settings.nccl is NcclEnv.HCA:
        return ContainerEnv(tuple(variables), tuple(notes))
    gid_vars, gid_notes = _gid_variables(ports, settings)
    variables.extend(gid_vars)
    notes.extend(gid_notes)
    variables.append((UCX_NET_DEVICES, listed))
    if not settings.non_host_network:
        # On the host network the HCAs' own netdevs carry NCCL's bootstrap and socket
        # traffic; off it the pod's eth0 is the right interface and NCCL finds it itself.
        # Only netdevs known to hold an IP address (a RoCE GID carries it): naming one
        # without (an IPoIB netdev nobody configured) would leave NCCL no interface at all.
        netdevs = list(dict.fromkeys(
            g.netdev for _, p in ports if p.link_layer is LinkLayer.ETHERNET
            for g in p.gids if g.netdev and g.kind in _ROUTABLE))
        if netdevs:
            variables.append((NCCL_SOCKET_IFNAME, "=" + ",".join(netdevs)))
    return ContainerEnv(tuple(variables), tuple(notes))


# Notes already logged: a note repeats on every Allocate of the same HCAs.
_SAID = Once(limit=1024)


def container_env(hcas: Sequence[Hca], settings: EnvSettings,
                  asked: HcaConfig | None = None) -> dict[str, str]:
    """:func:`build`, with each note logged once per process."""
    env = build(hcas, settings, asked)
    for note in env.notes:
        if _SAID.first(note):
            log.warning("container env: %s", note)
    return env.as_dict()


def env_settings(settings: Settings) -> EnvSettings:
    """The part of the daemon's settings the env depends on."""
    return EnvSettings(nccl=settings.nccl_env, non_host_network=settings.non_host_network)


# Only RDMA_HCA_DEVICES: what a record built without settings (tests, tools) hands out.
NO_NCCL_ENV = EnvSettings()
