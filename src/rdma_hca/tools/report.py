"""What ``rdma-hca discover`` prints: tables for people, a stable JSON shape for scripts.

The tables answer the questions asked when RDMA does not work in a pod, in the order
they are usually asked: which HCAs are there and can they be offered, where they sit on
the PCI tree, are the links up, which addresses (RoCE v2 GIDs) exist, do the device
nodes exist, which files did not answer, and what looked wrong. Lines stay within 100
columns so the output reads in a terminal or a log viewer.

Whatever bytes sysfs holds, the output is valid UTF-8 (undecodable bytes show as
``\xff``) and the JSON holds no NaN or Infinity.

Exit status of ``rdma-hca discover``: 0 when discovery read every file, 1 when a file did
not answer within the read deadline (the output names it; the HCA it belongs to shows
its ports UNKNOWN), 2 on bad flags or when discovery could not run (a resource ran out).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections.abc import Sequence
from typing import TextIO

from rdma_hca.kit.exitcodes import EXIT_FAIL as EXIT_STALLED
from rdma_hca.kit.exitcodes import EXIT_OK, EXIT_USAGE
from rdma_hca.kit.text import text_table
from rdma_hca.node.deadline_reader import discover_bounded
from rdma_hca.node.file_reads import DiscoveryFailed
from rdma_hca.node.model import CharDevice, Gid, GidKind, Hca, LinkLayer, NodeInventory, Port
from rdma_hca.node.sysfs_values import printable, unusable_warning
from rdma_hca.tools.deadline import read_deadline

JSON_VERSION = 2
"""Bumped when a field of :func:`inventory_to_json` changes meaning or goes away.
2: ``pci_bus_id``, ``pcie_root`` per HCA and ``stalled`` (files that did not answer)."""

_WIDTH = 100
_MAX_CELL = 28  # one odd value (a long board id) must not push a table past the width
_NONE = "-"


def _cell(value: object) -> str:
    text = _NONE if value is None or value == "" else str(value)
    if len(text) > _MAX_CELL:
        return text[: _MAX_CELL - 1] + "…"
    return text


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    return text_table([list(headers), *([_cell(v) for v in row] for row in rows)])


def _device(dev: CharDevice | None) -> str:
    if dev is None:
        return _NONE
    return dev.name if dev.present else f"{dev.name} MISSING"


def _devices(devs: Sequence[CharDevice | None]) -> str:
    shown = [_device(d) for d in devs if d is not None]
    return ",".join(shown) if shown else _NONE


def _pci_id(hca: Hca) -> str | None:
    if hca.pci_vendor is None or hca.pci_device is None:
        return None
    return f"{hca.pci_vendor.removeprefix('0x')}:{hca.pci_device.removeprefix('0x')}"


def _lid(port: Port) -> str | None:
    if port.link_layer is not LinkLayer.INFINIBAND:
        return None
    lid = _NONE if port.lid is None else str(port.lid)
    sm = _NONE if port.sm_lid is None else str(port.sm_lid)
    return f"{lid}/{sm}"


def _roce_v2(port: Port) -> list[Gid]:
    return [g for g in port.gids if g.is_roce_v2]


def _has_global_v6(hca: Hca) -> bool:
    return any(g.kind is GidKind.GLOBAL_IPV6 for p in hca.ports for g in _roce_v2(p))


def _hca_section(hcas: Sequence[Hca]) -> list[str]:
    headers = ("HCA", "DRIVER", "PCI", "PCIE-ROOT", "NUMA", "ID", "FIRMWARE", "BOARD", "USABLE")
    rows = [
        (
            h.name,
            h.driver,
            h.pci_address,
            h.pcie_root,
            h.numa_node,
            _pci_id(h),
            h.fw_ver,
            h.board_id,
            "yes" if h.usable else "NO",
        )
        for h in hcas
    ]
    return _table(headers, rows)


def _port_section(hcas: Sequence[Hca]) -> list[str]:
    headers = ("HCA", "PORT", "STATE", "PHYS", "LINK", "RATE", "NETDEVS", "LID/SM")
    rows = [
        (
            h.name,
            p.number,
            p.state,
            p.phys_state,
            p.link_layer.value,
            p.rate,
            ",".join(p.netdevs),
            _lid(p),
        )
        for h in hcas
        for p in h.ports
    ]
    if not rows:
        return ["no ports found"]
    return _table(headers, rows)


def _gid_section(hcas: Sequence[Hca]) -> list[str]:
    rows = [
        (h.name, p.number, g.index, g.kind.value, g.ip, g.netdev)
        for h in hcas
        for p in h.ports
        for g in _roce_v2(p)
    ]
    if not rows:
        return ["no RoCE v2 GIDs (InfiniBand ports, or no addresses on the RoCE netdevs)"]
    lines = _table(("HCA", "PORT", "INDEX", "KIND", "IP", "NETDEV"), rows)
    with_v6 = sum(1 for h in hcas if _has_global_v6(h))
    lines.append(
        f"{with_v6} of {len(hcas)} HCAs have a global IPv6 RoCE v2 GID "
        "(pods without hostNetwork need one)"
    )
    return lines


def _device_section(inv: NodeInventory) -> list[str]:
    rows = [
        (
            h.name,
            _device(h.uverbs),
            _devices([p.umad for p in h.ports]),
            _devices([p.issm for p in h.ports]),
        )
        for h in inv.hcas
    ]
    lines = _table(("HCA", "UVERBS", "UMAD", "ISSM"), rows) if rows else []
    if inv.rdma_cm is None:
        lines.append("rdma_cm: not found (is the rdma_ucm module loaded?)")
    else:
        state = "present" if inv.rdma_cm.present else "MISSING"
        lines.append(f"rdma_cm: {inv.rdma_cm.path} ({state})")
    return lines


def _wrapped(items: Sequence[str], bullet: str = "- ") -> list[str]:
    lines: list[str] = []
    for item in items:
        lines.extend(
            textwrap.wrap(
                item,
                width=_WIDTH,
                initial_indent=bullet,
                subsequent_indent=" " * len(bullet),
                break_long_words=True,
                break_on_hyphens=False,
            )
        )
    return lines


def _netns_line(mode: str | None) -> str:
    if mode == "exclusive":
        return (
            "RDMA netns mode: exclusive (each HCA is visible in one network namespace only; "
            "pods without hostNetwork will not see HCAs left in the host namespace)"
        )
    if mode is None:
        return "RDMA netns mode: unknown (ib_core does not say)"
    return f"RDMA netns mode: {mode}"


def render_inventory(inv: NodeInventory) -> str:
    """Readable tables of everything discovery found, problems and warnings last."""
    usable = sum(1 for h in inv.hcas if h.usable)
    lines = [f"RDMA HCAs: {len(inv.hcas)} found, {usable} usable", _netns_line(inv.netns_mode)]
    if inv.hcas:
        sections = (
            ("HCAs", _hca_section(inv.hcas)),
            ("Ports", _port_section(inv.hcas)),
            ("RoCE v2 GIDs", _gid_section(inv.hcas)),
            ("Device nodes (/dev/infiniband)", _device_section(inv)),
        )
        for title, body in sections:
            lines += ["", title, *body]
    else:
        lines += ["", "No RDMA HCAs found.", *_device_section(inv)]
    unusable = [h for h in inv.hcas if not h.usable]
    if unusable:
        lines += ["", "Not offered to pods"]
        for hca in unusable:
            why = list(hca.problems) or ["no usable uverbs device"]
            lines += _wrapped([f"{hca.name}: {p}" for p in why])
    if inv.stalled:
        lines += ["", f"Did not answer within the read deadline ({len(inv.stalled)})"]
        lines += _wrapped(list(inv.stalled))
        lines += _wrapped(["the HCAs these files belong to show their ports UNKNOWN; a read "
                           "that hangs is usually a driver waiting on HCA firmware: check "
                           "dmesg"], bullet="  ")
    repeated = {unusable_warning(h.name, p) for h in unusable for p in h.problems}
    warnings = [w for w in inv.warnings if w not in repeated]
    if warnings:
        lines += ["", f"Warnings ({len(warnings)})", *_wrapped(warnings)]
    return printable_lines("\n".join(lines)) + "\n"


def printable_lines(text: str) -> str:
    """Text that encodes as UTF-8 whatever it was built from, line breaks kept."""
    return "\n".join(printable(line) for line in text.split("\n"))


def clean_json(value: object) -> object:
    """A JSON-ready structure with every string valid UTF-8 and no NaN or Infinity
    (``json.dumps`` would write those as bare words no JSON parser accepts)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clean_json(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


def _char_json(dev: CharDevice | None) -> dict[str, object] | None:
    if dev is None:
        return None
    return {"name": dev.name, "path": dev.path, "present": dev.present}


def _gid_json(gid: Gid) -> dict[str, object]:
    return {
        "index": gid.index,
        "address": gid.address,
        "type": gid.type,
        "kind": gid.kind.value,
        "ip": gid.ip,
        "netdev": gid.netdev,
    }


def _port_json(port: Port) -> dict[str, object]:
    return {
        "number": port.number,
        "state": port.state,
        "phys_state": port.phys_state,
        "up": port.is_up,
        "link_layer": port.link_layer.value,
        "rate": port.rate,
        "rate_gbps": port.rate_gbps,
        "netdevs": list(port.netdevs),
        "lid": port.lid,
        "sm_lid": port.sm_lid,
        "umad": _char_json(port.umad),
        "issm": _char_json(port.issm),
        "gids": [_gid_json(g) for g in port.gids],
    }


def _hca_json(hca: Hca) -> dict[str, object]:
    return {
        "name": hca.name,
        "usable": hca.usable,
        "problems": list(hca.problems),
        "driver": hca.driver,
        "pci_address": hca.pci_address,
        "pci_bus_id": hca.pci_bus_id,
        "pcie_root": hca.pcie_root,
        "pci_vendor": hca.pci_vendor,
        "pci_device": hca.pci_device,
        "numa_node": hca.numa_node,
        "node_guid": hca.node_guid,
        "fw_ver": hca.fw_ver,
        "board_id": hca.board_id,
        "hca_type": hca.hca_type,
        "netdevs": list(hca.netdevs),
        "uverbs": _char_json(hca.uverbs),
        "device_nodes": [d.path for d in hca.device_nodes()],
        "ports": [_port_json(p) for p in hca.ports],
    }


def inventory_to_json(inv: NodeInventory) -> dict[str, object]:
    """A plain structure (dicts, lists, str, int, float, bool, None) for ``json.dumps``.

    Keys are fixed and always present (None when unknown) so scripts can rely on them;
    ``version`` says which shape this is.
    """
    doc = {
        "version": JSON_VERSION,
        "summary": {
            "hcas": len(inv.hcas),
            "usable": sum(1 for h in inv.hcas if h.usable),
        },
        "netns_mode": inv.netns_mode,
        "rdma_cm": _char_json(inv.rdma_cm),
        "hcas": [_hca_json(h) for h in inv.hcas],
        "stalled": list(inv.stalled),
        "warnings": list(inv.warnings),
    }
    cleaned = clean_json(doc)
    assert isinstance(cleaned, dict)
    return cleaned


def run(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """``rdma-hca discover``: bounded discovery, then tables or JSON (exit codes above).

    Reads ``args.sysfs_root``, ``args.dev_root``, ``args.json`` and, when the command
    line has it, ``args.read_deadline_seconds`` (seconds; default 5).
    """
    stream = out if out is not None else sys.stdout
    deadline = read_deadline(args)
    try:
        inventory = discover_bounded(args.sysfs_root, args.dev_root, deadline=deadline)
    except DiscoveryFailed as exc:
        message = f"rdma-hca discover: {exc}; nothing was reported (raise the limit and retry)"
        if args.json:
            stream.write(json.dumps({"version": JSON_VERSION, "error": printable(message)})
                         + "\n")
        else:
            print(printable(message), file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        stream.write(json.dumps(inventory_to_json(inventory), indent=2, allow_nan=False) + "\n")
    else:
        stream.write(render_inventory(inventory) + "\n")
    return EXIT_STALLED if inventory.stalled else EXIT_OK
