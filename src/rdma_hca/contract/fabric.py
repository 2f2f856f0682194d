"""What the daemon publishes of the fabric (the switches its RoCE ports are cabled to) and
``doctor`` reads back: the node label, the Node annotation with every port's neighbour,
the DRA attribute names, and how a fabric block is named.

The daemon learns each port's neighbour from LLDP. Per HCA it publishes the switch (its
system name, else its chassis ID) and the switch's port; per node, the label
``rdma-hca.io/fabric-block``: a short name derived from the set of switches the node's
ports reach, equal on every node cabled to the same leaf switches (one scalable unit of a
rail-optimized fabric, or one rack under one ToR switch). ``doctor --cluster`` reads the
annotation of every node to find ports that hear nothing and cables that are crossed.

In the annotation, an entry with an empty ``chassisID`` is a port the daemon listened on
and heard nothing from (:func:`with_silent`); a port absent from it was not listened on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DOMAIN = "rdma-hca.io"

# The Node label: nodes that share it reach the same set of switches.
FABRIC_BLOCK_LABEL = f"{DOMAIN}/fabric-block"
# The Node annotation: every HCA port's neighbour, as JSON (see :func:`encode_neighbours`).
NEIGHBOURS_ANNOTATION = f"{DOMAIN}/fabric-neighbours"

# DRA device attributes of each HCA (qualified with the driver's name, as the others).
SWITCH = "switch"  # the switch's system name, else its chassis ID
SWITCH_PORT = "switchPort"  # the switch's port ID, else its port description

BLOCK_PREFIX = "fb-"
BLOCK_HASH_CHARS = 10  # 40 bits: no two blocks of one fleet collide in practice

# An annotation value is bounded by the object's 256 KiB of annotations; a node's ports
# never need more than this; past it the last ports are left out (the daemon says so).
MAX_NEIGHBOURS_ANNOTATION = 16 * 1024


@dataclass(frozen=True, slots=True)
class PortNeighbour:
    """What one HCA port's LLDP neighbour says of itself."""

    hca: str  # the HCA's name (mlx5_0)
    port: int  # the HCA's port number
    netdev: str  # the netdev the frames came in on (a bond's member for a bond)
    chassis_id: str
    port_id: str
    system_name: str = ""
    port_description: str = ""

    @property
    def switch(self) -> str:
        """The attribute value: the system name, else the chassis ID."""
        return self.system_name or self.chassis_id

    @property
    def switch_port(self) -> str:
        return self.port_id or self.port_description

    @property
    def heard(self) -> bool:
        """False for a port listened on that heard no LLDP (see :func:`with_silent`)."""
        return bool(self.chassis_id)


def with_silent(neighbours: Iterable[PortNeighbour],
                listened: Iterable[tuple[str, int, str]]) -> tuple[PortNeighbour, ...]:
    """``neighbours`` and, for every listened port ``(hca, port, netdev)`` none of them is
    of, an entry with an empty chassis ID: "listened, heard nothing".

    The annotation carries those entries so that ``doctor`` can tell a silent port (link
    up, LLDP blocked or off on the switch) from a port nobody listened on. A silent entry
    reaches no switch: it names no fabric block and no DRA attribute. Sorted by HCA and port.
    """
    out = {(n.hca, n.port): n for n in neighbours}
    for hca, port, netdev in listened:
        out.setdefault((hca, port), PortNeighbour(hca, port, netdev, "", ""))
    return tuple(out[k] for k in sorted(out))


def fabric_block(switches: Iterable[str]) -> str:
    """The block's name: ``fb-`` and 10 hex digits of the sorted set of switch names.

    A valid label value (≤ 63 characters, alphanumeric at both ends); the same set gives
    the same name on every node, whatever order its ports list them in. No switch: "".
    """
    names = sorted({s for s in switches if s})
    if not names:
        return ""
    import hashlib  # only where LLDP runs: it loads OpenSSL's digests (about 0.6 MiB)

    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
    return BLOCK_PREFIX + digest[:BLOCK_HASH_CHARS]


def encode_neighbours(neighbours: Iterable[PortNeighbour]) -> str:
    """The annotation's value: ``{"<hca>/<port>": {"netdev", "chassisID", "portID",
    "systemName", "portDescription"}}``, keys sorted, compact."""
    body = {f"{n.hca}/{n.port}": {"netdev": n.netdev, "chassisID": n.chassis_id,
                                   "portID": n.port_id, "systemName": n.system_name,
                                   "portDescription": n.port_description}
            for n in neighbours}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


class NeighboursError(ValueError):
    """The annotation does not hold what :func:`encode_neighbours` writes."""


def decode_neighbours(text: str) -> tuple[PortNeighbour, ...]:
    """The annotation's value read back; :class:`NeighboursError` names what is wrong."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise NeighboursError(f"{NEIGHBOURS_ANNOTATION} is not JSON: {exc}") from None
    if not isinstance(body, Mapping):
        raise NeighboursError(f"{NEIGHBOURS_ANNOTATION} is not a JSON object")
    out = []
    for key, value in body.items():
        hca, sep, port = str(key).rpartition("/")
        if not sep or not hca or not port.isdigit() or not isinstance(value, Mapping):
            raise NeighboursError(f"{NEIGHBOURS_ANNOTATION}: entry {key!r} is not "
                                  f"<hca>/<port> with an object")
        fields = {k: value.get(k, "") for k in ("netdev", "chassisID", "portID",
                                                 "systemName", "portDescription")}
        if not all(isinstance(v, str) for v in fields.values()):
            raise NeighboursError(f"{NEIGHBOURS_ANNOTATION}: entry {key!r} has a non-text "
                                  f"field")
        out.append(PortNeighbour(hca, int(port), fields["netdev"], fields["chassisID"],
                                 fields["portID"], fields["systemName"],
                                 fields["portDescription"]))
    return tuple(out)
