"""The fabric part of ``doctor``: what each node's daemon heard by LLDP, judged fleet-wide.

Every node with ``fabric.lldp`` on carries the annotation ``rdma-hca.io/fabric-neighbours``
(each listened RoCE port and the switch port at the other end of its cable; an entry with
an empty chassis ID heard nothing) and the label ``rdma-hca.io/fabric-block``. Per block
the doctor reports:

- silent ports: listened on, link up, yet no LLDP heard (the switch does not send it, or
  the HCA's firmware LLDP agent keeps the frames from the host);
- crossed or misplugged cables: on a rail-optimized fabric HCA *i* of every node of a
  scalable unit reaches the same leaf switch; a node whose HCA *i* reaches another switch
  than that of most nodes is named, with the switch seen and the one expected. Nodes are
  compared across blocks whose switches overlap, so a cable plugged into a foreign switch
  (which changes the node's block) is found too;
- split blocks: two blocks whose switch sets overlap without being equal (a node with a
  port silent or plugged elsewhere lands in a block of its own).

A pure function of the Node objects' labels and annotations: no I/O here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rdma_hca.contract.fabric import (
    FABRIC_BLOCK_LABEL,
    NEIGHBOURS_ANNOTATION,
    NeighboursError,
    PortNeighbour,
    decode_neighbours,
)
from rdma_hca.tools.doctor.result import Check

NO_BLOCK = "<none>"
SUBJECT = "cluster"
OFF_NOTE = (f"fabric (LLDP): off: no node carries {NEIGHBOURS_ANNOTATION} (fabric.lldp is "
            "false, the chart's default, or no daemon has heard LLDP yet); set fabric.lldp: "
            "true to publish each RoCE port's switch and the nodes' fabric blocks "
            "(docs/fabric.md)")
OFF_IN_DAEMONSET = (f"fabric (LLDP): off: the DaemonSet's daemons do not hold NET_RAW "
                    "(fabric.lldp is false, the chart's default), so no node carries "
                    f"{NEIGHBOURS_ANNOTATION}; set fabric.lldp: true to publish each RoCE "
                    "port's switch and the nodes' fabric blocks (docs/fabric.md)")
ON_UNPUBLISHED = (f"fabric (LLDP): on (the DaemonSet adds NET_RAW), yet no node carries "
                  f"{NEIGHBOURS_ANNOTATION}: a daemon writes it within 2 minutes of its start; "
                  "if it stays so, `rdma-hca doctor --node` in a daemon's pod says what is off "
                  "and its log names the cause (\"the Node label ... is off\", a 403)")
SILENT_FIX = ("make the switch send LLDP on that port (e.g. `lldp transmit` on the interface), "
              "and let the frames reach the host: ConnectX firmware may run its own LLDP agent "
              "(for DCBX) that keeps them (docs/fabric.md, \"What the switch must send\")")
CABLE_FIX = ("check the cables of that node: HCA i of every node of a scalable unit must go "
             "to leaf switch i; swap or re-plug the cable, then the label follows within one "
             "LLDP interval")


@dataclass(frozen=True, slots=True)
class FabricNode:
    """One node as the daemon published it."""

    name: str
    block: str  # the label's value; "" when absent
    neighbours: tuple[PortNeighbour, ...]
    problem: str | None = None  # the annotation could not be read


@dataclass(frozen=True, slots=True)
class BlockRow:
    block: str
    nodes: tuple[str, ...]
    switches: tuple[str, ...]
    ok: bool


@dataclass(frozen=True, slots=True)
class Miscabled:
    node: str
    hca: str
    port: int
    seen: str  # the switch this port reaches
    expected: str  # the switch the same port of most nodes reaches
    agreeing: int  # how many nodes reach the expected one
    of: int  # how many nodes have that port heard


@dataclass(frozen=True, slots=True)
class FabricReport:
    note: str | None  # what is off, when nothing was published
    blocks: tuple[BlockRow, ...]
    miscabled: tuple[Miscabled, ...]
    silent: tuple[tuple[str, PortNeighbour], ...]  # (node, port that heard nothing)
    checks: tuple[Check, ...]


def read_node(name: str, labels: Mapping[str, str],
              annotations: Mapping[str, str]) -> FabricNode | None:
    """The node's published fabric, or None when it published none."""
    text = annotations.get(NEIGHBOURS_ANNOTATION)
    block = labels.get(FABRIC_BLOCK_LABEL, "")
    if text is None:
        return FabricNode(name, block, ()) if block else None
    try:
        return FabricNode(name, block, decode_neighbours(text))
    except NeighboursError as exc:
        return FabricNode(name, block, (), str(exc))


def _switches(node: FabricNode) -> frozenset[str]:
    return frozenset(n.switch for n in node.neighbours if n.heard)


def evaluate(nodes: Sequence[FabricNode], net_raw: bool | None = None) -> FabricReport:
    """Judge what the nodes published; an empty ``nodes`` is a note of what is off, told
    apart by ``net_raw`` (whether the DaemonSet's daemons hold it; None: no DaemonSet)."""
    if not nodes:
        note = {None: OFF_NOTE, False: OFF_IN_DAEMONSET, True: ON_UNPUBLISHED}[net_raw]
        return FabricReport(note, (), (), (), ())
    checks: list[Check] = []
    by_block: dict[str, list[FabricNode]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        by_block.setdefault(node.block or NO_BLOCK, []).append(node)
    for node in nodes:
        if node.problem is not None:
            checks.append(Check(node.name, "fabric neighbours", False, node.problem,
                                "the annotation is the daemon's: remove it (kubectl annotate "
                                f"node {node.name} {NEIGHBOURS_ANNOTATION}-) and the daemon "
                                "writes it again"))
    block_switches = {b: frozenset().union(*(_switches(n) for n in members))
                      for b, members in by_block.items()}
    silent = tuple((n.name, p) for n in sorted(nodes, key=lambda n: n.name)
                   for p in n.neighbours if not p.heard)
    miscabled = tuple(m for group in _groups(by_block, block_switches)
                      for m in _miscabled(group))
    split = _split(by_block, block_switches)
    bad_blocks = {b for pair in split for b in pair}
    bad_nodes = {name for name, _ in silent} | {m.node for m in miscabled} | {
        n.name for n in nodes if n.problem is not None}
    rows = tuple(BlockRow(b, tuple(n.name for n in members),
                          tuple(sorted(block_switches[b])),
                          b not in bad_blocks and b != NO_BLOCK
                          and not any(n.name in bad_nodes for n in members))
                 for b, members in sorted(by_block.items()))
    checks += _silent_checks(silent)
    checks += [_miscabled_check(m) for m in miscabled]
    checks += [_split_check(a, b, by_block, block_switches) for a, b in split]
    unlabelled = [n.name for n in by_block.get(NO_BLOCK, []) if n.problem is None]
    if unlabelled:
        checks.append(Check(SUBJECT, "fabric blocks", False,
                            f"nodes that heard no switch on any port (no {FABRIC_BLOCK_LABEL} "
                            f"label): {', '.join(unlabelled)}", SILENT_FIX))
    if not checks:
        checks.append(Check(SUBJECT, "fabric (LLDP)", True,
                            f"{len(nodes)} nodes in {len(by_block)} fabric blocks, every "
                            "listened port hears a switch, no crossed cable, no split block"))
    return FabricReport(None, rows, miscabled, silent, tuple(checks))


def _groups(by_block: Mapping[str, list[FabricNode]],
            block_switches: Mapping[str, frozenset[str]]) -> list[list[FabricNode]]:
    """The nodes of blocks whose switch sets overlap, each group together."""
    parent = {b: b for b in by_block}

    def root(b: str) -> str:
        while parent[b] != b:
            b = parent[b]
        return b

    names = sorted(by_block)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if block_switches[a] & block_switches[b]:
                parent[root(b)] = root(a)
    groups: dict[str, list[FabricNode]] = {}
    for b in names:
        groups.setdefault(root(b), []).extend(by_block[b])
    return list(groups.values())


def _miscabled(nodes: list[FabricNode]) -> list[Miscabled]:
    """Ports whose switch differs from the one the same port of most nodes reaches."""
    seen: dict[tuple[str, int], dict[str, str]] = {}
    for node in nodes:
        for n in node.neighbours:
            if n.heard:
                seen.setdefault((n.hca, n.port), {})[node.name] = n.switch
    out = []
    for (hca, port), switches in sorted(seen.items()):
        counts = Counter(switches.values()).most_common()
        expected, agreeing = counts[0]
        # A majority of at least two, and no tie: with fewer nodes no one is "most".
        if agreeing < 2 or (len(counts) > 1 and counts[1][1] == agreeing):
            continue
        for name, switch in sorted(switches.items()):
            if switch != expected:
                out.append(Miscabled(name, hca, port, switch, expected, agreeing,
                                     len(switches)))
    return out


def _split(by_block: Mapping[str, list[FabricNode]],
           block_switches: Mapping[str, frozenset[str]]) -> list[tuple[str, str]]:
    names = sorted(b for b in by_block if b != NO_BLOCK)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if block_switches[a] & block_switches[b]]


def _silent_checks(silent: Sequence[tuple[str, PortNeighbour]]) -> list[Check]:
    by_node: dict[str, list[PortNeighbour]] = {}
    for name, port in silent:
        by_node.setdefault(name, []).append(port)
    return [Check(name, "LLDP neighbours", False,
                  "ports that heard no LLDP: " + ", ".join(
                      f"{p.hca} port {p.port} ({p.netdev})" for p in ports),
                  SILENT_FIX)
            for name, ports in sorted(by_node.items())]


def _miscabled_check(m: Miscabled) -> Check:
    return Check(m.node, f"cable of {m.hca} port {m.port}", False,
                 f"reaches switch {m.seen}, but {m.hca} port {m.port} of {m.agreeing} of "
                 f"{m.of} nodes reaches {m.expected}: a crossed or misplugged cable",
                 CABLE_FIX)


def _split_check(a: str, b: str, by_block: Mapping[str, list[FabricNode]],
                 block_switches: Mapping[str, frozenset[str]]) -> Check:
    small, large = sorted((a, b), key=lambda x: (len(by_block[x]), x))
    shared = sorted(block_switches[a] & block_switches[b])
    return Check(SUBJECT, f"fabric blocks {a} and {b}", False,
                 f"share the switches {', '.join(shared)}: they look like one block split "
                 f"(block {small}: {', '.join(n.name for n in by_block[small])}; block "
                 f"{large}: {len(by_block[large])} nodes)",
                 f"a node of block {small} reaches a switch the others do not, or misses one "
                 "(a port silent, down or plugged elsewhere): see its checks, fix the cable")
