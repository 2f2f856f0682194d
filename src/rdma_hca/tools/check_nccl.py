"""``rdma-hca check --nccl``: would NCCL (and UCX) use the HCAs this container got?

NCCL falls back to TCP sockets without an error when it finds no usable HCA, and on RoCE
a GID of the wrong family or version connects nothing or runs over an unroutable
address. This reads the NCCL/UCX variables the container has, as NCCL reads them, and
checks each against what the container sees: every HCA ``NCCL_IB_HCA`` names exists here
with its device node and its port up; the GID that ``NCCL_IB_GID_INDEX`` or
``NCCL_IB_ADDR_FAMILY``/``NCCL_IB_ROCE_VERSION_NUM`` (or NCCL's defaults, AF_INET and 2)
selects is a RoCE v2 GID on every RoCE port NCCL would use; ``UCX_NET_DEVICES`` and
``NCCL_SOCKET_IFNAME`` name what exists.

A container off the host network is told apart by its sysfs: ``class/net`` shows the
interfaces of the container's own network namespace, so the HCAs' netdevs are missing
there. Such a pod needs the IPv6 family (its RDMA network is IPv6); an IPv4 GID choice is
a finding, as is a node with no RoCE v2 IPv6 GID at all, which the plugin refuses to guess
around.

On a mixed node the plugin leaves out of ``NCCL_IB_HCA`` a port this container got
(``RDMA_HCA_DEVICES``) that has no RoCE v2 IPv6 GID while IPv6 is the family: that is said
as a finding naming the port and why, not fatal (NCCL uses the others).

Each finding says whether it is ``fatal``: NCCL would not use RDMA at all (sockets, or
no connection). Those make the check exit 1; the others are printed with their fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rdma_hca.node.model import Hca, LinkLayer, NodeInventory, Port
from rdma_hca.node.roce import AddrFamily, family_gid, gid_at, gid_family

SUBJECT = "container"
NCCL_VARIABLES = (
    "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_NET", "UCX_NET_DEVICES",
)
ENV_FIX = ("let the plugin set it (ncclEnv: auto, the default) or remove it from the pod's "
           "env; docs/nccl.md lists what the plugin sets and why")


@dataclass(frozen=True, slots=True)
class Finding:
    """One NCCL verdict, in the same shape as every other check, and whether it is fatal."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None
    fatal: bool = False


@dataclass(frozen=True, slots=True)
class HcaList:
    """NCCL_IB_HCA as NCCL parses it: ``^`` excludes, ``=`` matches names exactly, each
    entry ``name[:port]``; without ``=`` every name is a prefix."""

    exclude: bool
    exact: bool
    entries: tuple[tuple[str, int | None], ...]


def parse_hca_list(raw: str) -> HcaList:
    text = raw.strip()
    exclude = text.startswith("^")
    text = text.removeprefix("^")
    exact = text.startswith("=")
    text = text.removeprefix("=")
    entries: list[tuple[str, int | None]] = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, sep, port = item.partition(":")
        entries.append((name, int(port) if sep and port.isdigit() else None))
    return HcaList(exclude, exact, tuple(entries))


def _here(hca: Hca) -> bool:
    """The container can open it: its verbs device node (and umad on IB) is here."""
    return hca.uverbs is not None and all(n.present for n in hca.device_nodes())


def _ports(hca: Hca, number: int | None) -> list[Port]:
    return [p for p in hca.ports if number is None or p.number == number]


def _hca_findings(raw: str | None, hcas: Sequence[Hca]) -> tuple[list[Finding],
                                                                  list[tuple[Hca, Port]]]:
    """Findings about NCCL_IB_HCA and the (HCA, port) pairs NCCL would use."""
    here = [h for h in hcas if _here(h)]
    if raw is None or not raw.strip():  # NCCL takes an empty list as no list
        used = [(h, p) for h in here for p in h.ports if p.is_up]
        finding = Finding("NCCL_IB_HCA", True,
                          "not set: NCCL uses every HCA this container can open ("
                          + (", ".join(f"{h.name}:{p.number}" for h, p in used) or "none")
                          + ")")
        return [finding], used
    parsed = parse_hca_list(raw)
    findings: list[Finding] = []
    if parsed.exclude:
        excluded = {n for n, _ in parsed.entries}
        used = [(h, p) for h in here for p in h.ports if p.is_up and not any(
            h.name == n if parsed.exact else h.name.startswith(n) for n in excluded)]
        return findings, used
    used = []
    problems: list[tuple[str, str, str]] = []
    for name, port in parsed.entries:
        shown = name if port is None else f"{name}:{port}"
        if parsed.exact:
            matched = [h for h in hcas if h.name == name]
        else:
            matched = [h for h in hcas if h.name.startswith(name)]
            others = [h.name for h in matched if h.name != name]
            if others:
                findings.append(Finding(
                    f"NCCL_IB_HCA {shown}", False,
                    f"without '=' NCCL matches prefixes: {name} also takes "
                    + ", ".join(others),
                    f"write NCCL_IB_HCA={'=' + raw.strip()} (exact names)"))
        if not matched:
            problems.append((shown, "no such HCA in this container's sysfs",
                             "request rdma/hca (or the DRA claim) for it, or drop it from "
                             "NCCL_IB_HCA"))
            continue
        for h in matched:
            if not _here(h):
                problems.append((shown, f"{h.name} exists but its device node is not in this "
                                 "container", "the HCA was not allocated to this container: "
                                 "name only the HCAs in RDMA_HCA_DEVICES"))
                continue
            ports = _ports(h, port)
            if not ports:
                problems.append((shown, f"{h.name} has no port {port}",
                                 f"ports of {h.name}: "
                                 + ", ".join(str(p.number) for p in h.ports)))
                continue
            up = [p for p in ports if p.is_up]
            if not up:
                problems.append((shown, "port down (" + ", ".join(
                    f"port {p.number} {p.state}/{p.phys_state}" for p in ports) + ")",
                    "check the cable and switch port, or drop it from NCCL_IB_HCA"))
            used.extend((h, p) for p in up)
    # Without any usable port NCCL finds no IB device and silently uses sockets.
    fatal = not used
    findings.extend(Finding(f"NCCL_IB_HCA {shown}", False, detail, fix, fatal=fatal)
                    for shown, detail, fix in problems)
    if used:
        findings.append(Finding("NCCL_IB_HCA", True, f"{raw.strip()}: NCCL uses "
                                + ", ".join(f"{h.name}:{p.number}" for h, p in used)))
    elif not problems:
        findings.append(Finding("NCCL_IB_HCA", False, f"{raw!r} names no HCA",
                                ENV_FIX, fatal=True))
    return findings, used


def _family(raw: str | None) -> AddrFamily | None:
    """As NCCL reads it: unset or empty is AF_INET; only the exact names count (NCCL
    silently takes anything else, " AF_INET6" or "af_inet6" too, as AF_INET)."""
    if not raw:
        return AddrFamily.INET
    for f in AddrFamily:
        if raw == f.value:
            return f
    return None


def _pod_network_finding(roce: Sequence[tuple[Hca, Port]], chose: str) -> Finding:
    missing = [f"{h.name}:{p.number}" for h, p in roce
               if family_gid(p, AddrFamily.INET6) is None]
    if missing:
        fix = ("the node has no RoCE v2 GID with a global IPv6 address on "
               + ", ".join(missing) + ": give its RDMA netdevs IPv6 addresses (an IPv6 "
               "compute network), or run the pod with hostNetwork: true")
    else:
        fix = "set NCCL_IB_ADDR_FAMILY=AF_INET6 (every port has a RoCE v2 IPv6 GID)"
    return Finding("RoCE GID", False,
                   f"{chose}, but this container is not on the host network: its RDMA "
                   "goes over the node's IPv6 network (a RoCE v2 IPv6 GID)", fix, fatal=True)


def _gid_findings(env: Mapping[str, str], used: Sequence[tuple[Hca, Port]],
                  pod_network: bool) -> list[Finding]:
    roce = [(h, p) for h, p in used if p.link_layer is LinkLayer.ETHERNET]
    if not roce:
        return []
    raw_index = env.get("NCCL_IB_GID_INDEX")
    index = int(raw_index) if raw_index is not None and raw_index.strip().lstrip(
        "-").isdigit() else None
    if raw_index is not None and index is None:
        return [Finding("NCCL_IB_GID_INDEX", False, f"{raw_index!r} is not a number",
                        ENV_FIX, fatal=True)]
    if index is not None and index >= 0:
        bad = []
        for h, p in roce:
            g = gid_at(p, index)
            if g is None or not g.is_roce_v2 or gid_family(g) is None:
                what = ("no GID" if g is None else
                        f"{g.type or 'untyped'} {g.kind.value} GID")
                better = family_gid(p, AddrFamily.INET6) or family_gid(p, AddrFamily.INET)
                hint = f" (a RoCE v2 GID is at index {better.index})" if better else ""
                bad.append(f"{h.name}:{p.number} has {what} at index {index}{hint}")
        if bad:
            return [Finding("RoCE GID", False, f"NCCL_IB_GID_INDEX={index}: " + "; ".join(bad),
                            "unset NCCL_IB_GID_INDEX and let NCCL_IB_ADDR_FAMILY choose (or use "
                            "the index shown on every port)", fatal=True)]
        families = {gid_family(g) for _, p in roce if (g := gid_at(p, index)) is not None}
        if pod_network and families != {AddrFamily.INET6}:
            return [_pod_network_finding(roce, f"NCCL_IB_GID_INDEX={index} is not IPv6")]
        return [Finding("RoCE GID", True, f"NCCL_IB_GID_INDEX={index} is a RoCE v2 GID on "
                        + ", ".join(f"{h.name}:{p.number}" for h, p in roce))]
    raw_family = env.get("NCCL_IB_ADDR_FAMILY")
    family = _family(raw_family)
    if family is None:
        return [Finding("NCCL_IB_ADDR_FAMILY", False,
                        f"{raw_family!r}: NCCL takes only AF_INET or AF_INET6, exactly, and "
                        "silently reads anything else as AF_INET", ENV_FIX, fatal=True)]
    version = (env.get("NCCL_IB_ROCE_VERSION_NUM") or "2").strip()
    findings: list[Finding] = []
    if version != "2":
        findings.append(Finding("NCCL_IB_ROCE_VERSION_NUM", False,
                                f"{version!r}: RoCE v1 is not routed between subnets",
                                "set NCCL_IB_ROCE_VERSION_NUM=2 (or unset it: 2 is the "
                                "default)", fatal=version != "1"))
        return findings
    said = family.value + ("" if raw_family else " (NCCL's default)")
    if pod_network and family is not AddrFamily.INET6:
        return [_pod_network_finding(roce, f"the GID family is {said}")]
    missing = [(h, p) for h, p in roce if family_gid(p, family) is None]
    if missing:
        other = AddrFamily.INET6 if family is AddrFamily.INET else AddrFamily.INET
        switch = all(family_gid(p, other) is not None for _, p in roce)
        fix = (f"set NCCL_IB_ADDR_FAMILY={other.value}: every port has a RoCE v2 GID of "
               "that family" if switch else
               "give these ports an address of the family (or, off the host network, the "
               "node an IPv6 compute network); no family has a RoCE v2 GID on every port")
        findings.append(Finding(
            "RoCE GID", False,
            f"{said}: no RoCE v2 GID of that family on "
            + ", ".join(f"{h.name}:{p.number}" for h, p in missing), fix, fatal=True))
        return findings
    shown = ", ".join(f"{h.name}:{p.number} index {g.index}" for h, p in roce
                      if (g := family_gid(p, family)) is not None)
    findings.append(Finding("RoCE GID", True, f"{said}, RoCE v2: {shown}"))
    return findings


def _wants_ipv6(env: Mapping[str, str], roce: Sequence[tuple[Hca, Port]],
                pod_network: bool) -> bool:
    """Whether the GID NCCL is told to use (or must use here) is IPv6."""
    if pod_network or env.get("NCCL_IB_ADDR_FAMILY") == AddrFamily.INET6.value:
        return True
    raw = (env.get("NCCL_IB_GID_INDEX") or "").strip()
    if not raw.isdigit() or not roce:
        return False
    return {gid_family(g) for _, p in roce if (g := gid_at(p, int(raw))) is not None} \
        == {AddrFamily.INET6}


def _left_out_findings(env: Mapping[str, str], hcas: Sequence[Hca],
                       used: Sequence[tuple[Hca, Port]], pod_network: bool) -> list[Finding]:
    """The ports this container got that NCCL is not told to use for want of an IPv6 GID."""
    if not (env.get("NCCL_IB_HCA") or "").strip():
        return []
    roce = [(h, p) for h, p in used if p.link_layer is LinkLayer.ETHERNET]
    if not _wants_ipv6(env, roce, pod_network):
        return []
    got = {n.strip() for n in env.get("RDMA_HCA_DEVICES", "").split(",") if n.strip()}
    named = {(h.name, p.number) for h, p in used}
    out = []
    for h in hcas:
        if h.name not in got or not _here(h):
            continue
        for p in h.ports:
            if (p.is_up and p.link_layer is LinkLayer.ETHERNET and (h.name, p.number)
                    not in named and family_gid(p, AddrFamily.INET6) is None):
                netdevs = ", ".join(p.netdevs) or "its netdev"
                out.append(Finding(
                    f"NCCL_IB_HCA {h.name}:{p.number}", False,
                    f"left out: {h.name}:{p.number} has no RoCE v2 GID with a global IPv6 "
                    "address, and the GID NCCL uses here is IPv6; NCCL uses the other HCAs",
                    f"give {netdevs} a global IPv6 address on the compute network to use it "
                    "(the plugin then lists it again)"))
    return out


def _ucx_findings(raw: str | None, hcas: Sequence[Hca]) -> list[Finding]:
    if raw is None:
        return []
    by_name = {h.name: h for h in hcas if _here(h)}
    bad = []
    for item in (i.strip() for i in raw.split(",")):
        name, sep, port = item.partition(":")
        if not sep:
            continue  # a netdev for UCX's TCP transport, not an HCA
        h = by_name.get(name)
        ports = [p for p in h.ports if str(p.number) == port] if h is not None else []
        if not ports or not ports[0].is_up:
            bad.append(item + (" (not in this container)" if h is None else " (port not up)"))
    if bad:
        return [Finding("UCX_NET_DEVICES", False, "names " + ", ".join(bad),
                        "UCX skips these: " + ENV_FIX)]
    return [Finding("UCX_NET_DEVICES", True, raw)]


def _netdevs_here(sysfs_root: Path) -> list[str] | None:
    """The interfaces of this container's network namespace (None: sysfs cannot say)."""
    try:
        return sorted(p.name for p in (sysfs_root / "class" / "net").iterdir())
    except OSError:
        return None


def _socket_findings(raw: str | None, present: list[str] | None) -> list[Finding]:
    if raw is None:
        return []
    text = raw.strip()
    if text.startswith("^"):
        return [Finding("NCCL_SOCKET_IFNAME", True, f"{text} (excludes)")]
    exact = text.startswith("=")
    wanted = [n.strip() for n in text.removeprefix("=").split(",") if n.strip()]
    if present is None:
        return []  # nothing to compare with: NCCL will say so itself
    matched = [n for n in present if any(n == w if exact else n.startswith(w) for w in wanted)]
    if not matched:
        return [Finding("NCCL_SOCKET_IFNAME", False,
                        f"{text}: no such interface here (this container has "
                        f"{', '.join(present) or 'none'})",
                        "NCCL cannot bootstrap: off the host network unset it (the pod's "
                        "eth0 is right); on it name the HCAs' netdevs", fatal=True)]
    return [Finding("NCCL_SOCKET_IFNAME", True, f"{text}: {', '.join(matched)}")]


def nccl_findings(inventory: NodeInventory, env: Mapping[str, str],
                  sysfs_root: Path) -> list[Finding]:
    """Every NCCL/UCX verdict for this container, in the order to fix them."""
    present = [f"{k}={env[k]}" for k in NCCL_VARIABLES if k in env]
    findings = [Finding("NCCL/UCX variables", True, ", ".join(present) or "none set")]
    if env.get("NCCL_IB_DISABLE", "").strip() not in ("", "0"):
        findings.append(Finding("NCCL_IB_DISABLE", False,
                                f"{env['NCCL_IB_DISABLE']}: NCCL uses TCP sockets", ENV_FIX,
                                fatal=True))
    net = env.get("NCCL_NET", "").strip()
    if net.lower() == "socket":
        findings.append(Finding("NCCL_NET", False, f"{net}: NCCL uses TCP sockets", ENV_FIX,
                                fatal=True))
    hca_findings, used = _hca_findings(env.get("NCCL_IB_HCA"), inventory.hcas)
    findings.extend(hca_findings)
    if not used and not env.get("NCCL_IB_HCA", "").strip():
        findings.append(Finding("NCCL IB devices", False,
                                "no HCA with a port up in this container: NCCL uses TCP "
                                "sockets", "request rdma/hca for this container and check "
                                "the node with rdma-hca doctor --node", fatal=True))
    netdevs = _netdevs_here(sysfs_root)
    roce_netdevs = {n for _, p in used if p.link_layer is LinkLayer.ETHERNET for n in p.netdevs}
    pod_network = netdevs is not None and bool(roce_netdevs) and not roce_netdevs & set(netdevs)
    findings.extend(_gid_findings(env, used, pod_network))
    findings.extend(_left_out_findings(env, inventory.hcas, used, pod_network))
    findings.extend(_ucx_findings(env.get("UCX_NET_DEVICES"), inventory.hcas))
    findings.extend(_socket_findings(env.get("NCCL_SOCKET_IFNAME"), netdevs))
    return findings
