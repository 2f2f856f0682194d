"""Who holds how much of each HCA, for ``doctor --node``: the DRA driver's checkpoint.

The checkpoint lists the claims prepared on this node and, per device, the shares the
scheduler allocated with the bandwidth each consumed (DRAConsumableCapacity). A claim of
the node-wide device (``rdma/hca`` through DRA) holds no one HCA and no bandwidth: it is
listed apart, with the HCAs it was given.

The scheduler keeps the bandwidth held under each port's rate, but it counts only claims
that ask: a claim holding a share of 0 (or none) and every node-wide claim use the HCA
all the same. So each HCA is shown with what is held of it *and* the claims on it that
hold nothing, which is what an operator needs to see before trusting "never more than
the port's rate". It is read
with the driver's own format reader (``contract/checkpoint``), bounded by the read
deadline like every read of the machine: a file on a hung disk is a failed check, not a
doctor that never ends.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rdma_hca.contract.checkpoint import CHECKPOINT_FILE, CheckpointError, Claims, load_checkpoint
from rdma_hca.contract.dra import NODE_DEVICE
from rdma_hca.kit.offloop import OffLoop, Stalled
from rdma_hca.node.model import Hca
from rdma_hca.tools.doctor.result import Check
from rdma_hca.tools.doctor.slices import NODE_WIDE

SUBJECT = "node"


def checkpoint_path(plugins_dir: str, driver: str) -> Path:
    """``<plugins dir>/<driver name>/checkpoint.json``, where the driver keeps it."""
    return Path(plugins_dir) / driver / CHECKPOINT_FILE


@dataclass(frozen=True, slots=True)
class Holder:
    namespace: str
    name: str
    uid: str
    bandwidth: int  # bits per second, summed over the claim's shares of the HCA
    shares: tuple[str, ...]  # the shareIDs
    admin: bool = False  # given with admin access: it sees the HCA and holds none of it


@dataclass(frozen=True, slots=True)
class NodeWideHolder:
    """A claim of the node-wide device: the HCAs it was given at Prepare."""

    namespace: str
    name: str
    uid: str
    hcas: tuple[str, ...]
    shares: tuple[str, ...]  # the shareIDs
    admin: bool = False  # given with admin access


@dataclass(frozen=True, slots=True)
class HcaShares:
    hca: str
    rate: int | None  # the HCA's rate in bits per second, None when unknown
    holders: tuple[Holder, ...]  # the claims of the HCA's own device, holding bandwidth or not
    node_wide: tuple[NodeWideHolder, ...] = ()  # node-wide claims given this HCA

    @property
    def held(self) -> int:
        return sum(h.bandwidth for h in self.holders)

    @property
    def holding_bandwidth(self) -> tuple[Holder, ...]:
        return tuple(h for h in self.holders if h.bandwidth)

    @property
    def holding_none(self) -> tuple[Holder, ...]:
        """Claims of the HCA's device holding a share of 0, or no share: not counted.
        A claim with admin access holds nothing by design (a monitor's): not among them."""
        return tuple(h for h in self.holders if not h.bandwidth and not h.admin)

    @property
    def admin(self) -> tuple[Holder, ...]:
        """Claims given the HCA's device with admin access."""
        return tuple(h for h in self.holders if h.admin)

    @property
    def uncounted(self) -> int:
        """Claims using the HCA that the scheduler's sum of bandwidth does not count."""
        return len(self.holding_none) + sum(not w.admin for w in self.node_wide)


@dataclass(frozen=True, slots=True)
class Shares:
    path: Path
    hcas: tuple[HcaShares, ...]  # every HCA of the node, and any a claim holds that is gone
    claims: int
    node_wide: tuple[NodeWideHolder, ...] = ()


def _load(path: Path) -> Claims | None:
    if not os.path.exists(path):
        return None
    claims, _ = load_checkpoint(str(path))
    return claims


def _read(path: Path, deadline: float) -> Claims | None:
    async def bounded() -> Claims | None:
        return await OffLoop(deadline).run(f"reading {path}", lambda: _load(path))

    return asyncio.run(bounded())


def read_shares(path: Path, hcas: Sequence[Hca], deadline: float
                ) -> tuple[Shares | None, Check | None]:
    """The shares in the checkpoint at ``path``; no file: nothing (the DRA driver is off
    here, or has prepared nothing yet). A file that cannot be read is a failed check."""
    try:
        claims = _read(path, deadline)
    except Stalled:
        return None, Check(SUBJECT, "DRA checkpoint", False,
                           f"{path} did not answer within {deadline:g} s",
                           "check the disk holding the kubelet's plugins directory (dmesg)")
    except CheckpointError as exc:
        return None, Check(SUBJECT, "DRA checkpoint", False, str(exc),
                           "the DRA driver moves a damaged checkpoint aside and rebuilds it "
                           "from its CDI specs when it starts: restart its pod")
    if claims is None:
        return None, None
    rates = {h.name: h.rate_bps for h in hcas}
    held: dict[str, list[Holder]] = {h.name: [] for h in hcas}
    wide: list[NodeWideHolder] = []
    for uid, claim in sorted(claims.items(), key=lambda c: (c[1].namespace, c[1].name)):
        by_hca: dict[str, list[str]] = {}
        bits: dict[str, int] = {}
        admin: set[str] = set()
        for d in claim.devices:
            if d.device == NODE_DEVICE:
                # Its ``hca`` lists every HCA it gave, e.g. "mlx5_0,mlx5_1": none is held.
                wide.append(NodeWideHolder(claim.namespace, claim.name, uid,
                                           tuple(n for n in d.hca.split(",") if n),
                                           tuple(s.share_id for s in d.shares),
                                           d.admin_access))
                continue
            if not d.bandwidth and d.hca not in held:
                continue  # an HCA gone from the node whose claim holds none of it
            by_hca.setdefault(d.hca, []).extend(s.share_id for s in d.shares)
            bits[d.hca] = bits.get(d.hca, 0) + d.bandwidth
            if d.admin_access:
                admin.add(d.hca)
        for hca, shares in by_hca.items():
            held.setdefault(hca, []).append(
                Holder(claim.namespace, claim.name, uid, bits[hca], tuple(shares),
                       hca in admin))
    on = {name: tuple(w for w in wide if name in w.hcas) for name in held}
    out = tuple(HcaShares(name, rates.get(name), tuple(hs), on[name])
                for name, hs in held.items())
    return Shares(path, out, len(claims), tuple(wide)), None


def gbps(bits: int | None) -> str:
    return "-" if bits is None else f"{bits / 1e9:g}G"


def shares_rows(shares: Shares) -> list[list[str]]:
    rows = []
    for h in shares.hcas:
        who = ", ".join(f"{c.namespace}/{c.name} "
                        + ("(admin access)" if c.admin else gbps(c.bandwidth))
                        for c in h.holders)
        rows.append([h.hca, gbps(h.held), gbps(h.rate), str(len(h.holders)), who or "-"])
    return rows


def uncounted_rows(shares: Shares) -> list[list[str]]:
    """Per HCA: the claims holding bandwidth against those on it holding none (a share of
    0 or none, and node-wide claims); empty when every claim on every HCA holds some."""
    if not any(h.uncounted for h in shares.hcas):
        return []
    rows = []
    for h in shares.hcas:
        who = [f"{c.namespace}/{c.name}" for c in h.holding_none]
        who += [f"{c.namespace}/{c.name} (node-wide)" for c in h.node_wide if not c.admin]
        rows.append([h.hca, str(len(h.holding_bandwidth)), str(len(h.holding_none)),
                     str(sum(not c.admin for c in h.node_wide)), ", ".join(who) or "-"])
    return rows


UNCOUNTED_HEADERS = ("HCA", "HOLDING BANDWIDTH", "HOLDING NONE", "NODE-WIDE",
                     "NOT COUNTED AGAINST THE RATE")


def _ref(c: Holder | NodeWideHolder) -> dict[str, str]:
    return {"namespace": c.namespace, "name": c.name, "uid": c.uid}


def shares_json(shares: Shares) -> dict[str, Any]:
    return {
        "checkpoint": str(shares.path),
        "claims": shares.claims,
        "hcas": [
            {"name": h.hca, "heldBitsPerSecond": h.held, "rateBitsPerSecond": h.rate,
             "claims": [{"namespace": c.namespace, "name": c.name, "uid": c.uid,
                         "bandwidthBitsPerSecond": c.bandwidth, "shareIDs": list(c.shares),
                         "adminAccess": c.admin}
                        for c in h.holders],
             "claimsHoldingNone": [_ref(c) for c in h.holding_none],
             "nodeWideClaims": [_ref(c) for c in h.node_wide]}
            for h in shares.hcas
        ],
        "nodeDevice": None if not shares.node_wide else {
            "name": NODE_DEVICE,
            "claims": [{"namespace": c.namespace, "name": c.name, "uid": c.uid,
                        "hcaCount": len(c.hcas), "hcas": list(c.hcas),
                        "shareIDs": list(c.shares), "adminAccess": c.admin}
                       for c in shares.node_wide],
        },
    }


def shares_check(shares: Shares) -> Check:
    """Passes unless claims hold more of an HCA than its rate (its rate fell since)."""
    over = [h for h in shares.hcas if h.rate is not None and h.held > h.rate]
    if over:
        return Check(SUBJECT, "DRA bandwidth", False,
                     "; ".join(f"{h.hca}: {gbps(h.held)} held of {gbps(h.rate)}"
                               for h in over),
                     "the port runs slower than when the claims were placed: check its "
                     "link (ibstat), or move a claim's pod to another node")
    holding = sum(1 for h in shares.hcas if h.held)
    wide = ""
    if shares.node_wide:
        wide = (f"; {NODE_WIDE} held by {len(shares.node_wide)} claim(s): "
                + ", ".join(f"{c.namespace}/{c.name} "
                            + ("(admin access)" if c.admin else f"(hcaCount {len(c.hcas)})")
                            for c in shares.node_wide))
    return Check(SUBJECT, "DRA bandwidth", True,
                 f"{shares.claims} prepared claim(s); {holding} HCA(s) with bandwidth held"
                 + wide + _admin(shares) + _uncounted(shares))


def _admin(shares: Shares) -> str:
    """Claims that see HCAs with admin access (monitors): they hold nothing, by design."""
    who = sorted({f"{c.namespace}/{c.name}" for h in shares.hcas for c in h.admin}
                 | {f"{c.namespace}/{c.name}" for c in shares.node_wide if c.admin})
    if not who:
        return ""
    return f"; with admin access, holding nothing: {', '.join(who)}"



def _uncounted(shares: Shares) -> str:
    """What the port's rate is not guarded against: claims on an HCA holding none of it."""
    on = [h for h in shares.hcas if h.uncounted]
    if not on:
        return ""
    none = sum(len(h.holding_none) for h in on)
    wide = sum(not c.admin for c in shares.node_wide)
    return (f"; not counted against the rate: {none} claim(s) holding no bandwidth and "
            f"{wide} node-wide claim(s), on "
            + ", ".join(f"{h.hca} ({h.uncounted})" for h in on)
            + " (the scheduler counts only claims that ask for bandwidth)")
