"""One HCA's ports: state, physical state, link layer, rate, LIDs and GIDs."""

from __future__ import annotations

import os

from rdma_hca.node.gids import GidWalk
from rdma_hca.node.model import CharDevice, LinkLayer, Port
from rdma_hca.node.pci import Parent
from rdma_hca.node.sysfs_values import (
    MAX_LID,
    MAX_PORT,
    PHYS_STATE_NAMES,
    PORT_STATE_NAMES,
    UNKNOWN,
    attribute_text,
    parse_state,
    rate_gbps,
    shown,
)


class PortWalk(GidWalk):
    umad: dict[tuple[str, int], str]
    issm: dict[tuple[str, int], str]

    def ports(
        self, hca: str, hca_dir: str, parent: Parent, soft_parent: str | None
    ) -> tuple[Port, ...]:
        ports_dir = os.path.join(hca_dir, "ports")
        try:
            entries = self.listdir(ports_dir)
        except OSError as err:
            self.warn(f"cannot list {ports_dir} ({err.strerror}); {hca} shows no ports")
            return ()
        numbered = self.numbered(ports_dir, entries, "a port number", MAX_PORT)
        single = len(numbered) == 1
        ports: list[Port] = []
        for number, entry in numbered:
            # Which of the parent's netdevs belong to this port: all of them on a
            # single-port HCA; on a multi-port one, those whose dev_port says so.
            own = [n for n, dp in parent.netdevs if single or dp == number - 1]
            if soft_parent is not None and single:
                own.insert(0, soft_parent)
            port = self.port(hca, number, os.path.join(ports_dir, entry), own)
            if port is not None:
                ports.append(port)
        return tuple(ports)

    def port(self, hca: str, number: int, port_dir: str, netdevs: list[str]) -> Port | None:
        if not os.path.isdir(port_dir):
            self.warn(f"skipping port {port_dir}: it is not a directory")
            return None
        state_path = os.path.join(port_dir, "state")
        if not os.path.lexists(state_path):
            # A port directory with no state file is not a port (a half-made entry).
            self.warn(f"skipping port {port_dir}: it has no state file")
            return None
        state = self.state(state_path, PORT_STATE_NAMES, "4: ACTIVE", "state")
        phys_state = self.state(
            os.path.join(port_dir, "phys_state"), PHYS_STATE_NAMES, "5: LinkUp", "physical state"
        )
        link_layer = self.link_layer(os.path.join(port_dir, "link_layer"))
        rate, gbps = self.rate(os.path.join(port_dir, "rate"))
        gids, gid_netdevs = self.gids(port_dir, link_layer)
        lid = sm_lid = None
        if link_layer is LinkLayer.INFINIBAND:
            lid = self.number(os.path.join(port_dir, "lid"), MAX_LID + 1, "a LID like 0x5")
            sm_lid = self.number(os.path.join(port_dir, "sm_lid"), MAX_LID + 1, "a LID like 0x1")
        umad = self.umad.get((hca, number))
        issm = self.issm.get((hca, number))
        return Port(
            number=number,
            state=state,
            phys_state=phys_state,
            link_layer=link_layer,
            rate=rate,
            rate_gbps=gbps,
            netdevs=tuple(dict.fromkeys(netdevs + gid_netdevs)),
            gids=tuple(gids),
            umad=self._char(umad),
            issm=self._char(issm),
            lid=lid,
            sm_lid=sm_lid,
        )

    def _char(self, name: str | None) -> CharDevice | None:
        return self.char_device(name) if name else None

    def state(self, path: str, names: dict[int, str], example: str, what: str) -> str:
        """A ``state`` or ``phys_state`` file; UNKNOWN (with a warning) when it cannot be
        read or understood, so the port stays listed and counts as down."""
        try:
            raw = self.io.read(path)
        except OSError as err:
            self.warn(f"cannot read {path} ({self.os_error(err)}); {what} {UNKNOWN}")
            return UNKNOWN
        parsed = parse_state(raw, names)
        if parsed is None:
            self.warn(f"{path} holds {shown(raw)}, not a state like '{example}'; {what} {UNKNOWN}")
            return UNKNOWN
        name, said = parsed
        if name == UNKNOWN:
            self.warn(f"{path} holds {shown(raw)}, a number the kernel has no {what} for; "
                      f"{what} {UNKNOWN}")
        elif said is not None:
            self.warn(
                f"{path} holds {shown(raw)}: the number says {name}, the text says {said!r}; "
                f"taking {name} (the number is what the driver reported)"
            )
        return name

    def link_layer(self, path: str) -> LinkLayer:
        text = self.text(path)
        for layer in (LinkLayer.ETHERNET, LinkLayer.INFINIBAND):
            if text == layer.value:
                return layer
        if text is not None:
            self.warn(f"{path} holds {text!r}, not Ethernet or InfiniBand; link layer unknown")
        return LinkLayer.UNKNOWN

    def rate(self, path: str) -> tuple[str, float | None]:
        try:
            raw = self.io.read(path)
        except OSError as err:
            # Some drivers answer EINVAL while the link is down: no rate is normal then.
            self.os_error(err)
            return "", None
        text = attribute_text(raw)
        gbps = rate_gbps(text) if text is not None else None
        if text is None or gbps is None:
            self.warn(f"{path} holds {shown(raw)}, not a rate like '400 Gb/sec (4X NDR)'")
            return "", None
        return text, gbps
