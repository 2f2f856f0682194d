"""Each HCA port's neighbour as the frames tell it: kept until its TTL runs out, and held
while it flaps.

A switch repeats its frame every 30 s or so: a frame that says what the last one said
is a refresh (the TTL starts over), not a change, and publishes nothing. A change (a
different chassis or port, a neighbour heard at last, one whose TTL ran out or that
said TTL 0) is published at once, unless the port's neighbour keeps changing: as the
link flap hold (``watch.flaps``), with its parameters, a port whose neighbour changed
``FLAP_CHANGES`` times within ``FLAP_WINDOW_SECONDS`` keeps its last published neighbour
until what it hears has stayed the same for the hold time (``flapHoldSeconds``). A cable
swapped between two switches is then one change, not one per frame.

On a bond the port's frames come in on each member: the port's neighbour is that of
its first member (in natural order) that hears one, so the choice does not move
between frames.

Pure bookkeeping over an injected clock; the listener feeds it frames and asks it what
to publish.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rdma_hca.contract.fabric import PortNeighbour
from rdma_hca.daemon.watch.flaps import FLAP_CHANGES, FLAP_WINDOW_SECONDS, Churn
from rdma_hca.node.lldp import LldpFrame

PortKey = tuple[str, int]  # (HCA name, port number)


@dataclass(slots=True)
class _Heard:
    neighbour: PortNeighbour
    expires: float


@dataclass(slots=True)
class _Track:
    current: PortNeighbour | None = None  # what the port hears now
    published: PortNeighbour | None = None
    churn: Churn = field(default_factory=Churn)
    stable_since: float = 0.0  # when ``current`` last changed


class NeighbourTable:
    def __init__(self, hold_seconds: float, *, changes: int = FLAP_CHANGES,
                 window: float = FLAP_WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_seconds = hold_seconds
        self.changes = changes
        self.window = window
        self.clock = clock
        self.holds_total = 0  # times a port's neighbour was held for churn
        self._ports: dict[str, PortKey] = {}  # netdev -> the port it carries
        self._members: dict[PortKey, tuple[str, ...]] = {}
        self._heard: dict[str, _Heard] = {}  # netdev -> its live neighbour
        self._last_frame: dict[str, float] = {}  # netdev -> when its last frame came
        self._tracks: dict[PortKey, _Track] = {}

    def set_ports(self, ports: Mapping[str, PortKey]) -> None:
        """The netdevs listened on now (netdev -> HCA port); the others are forgotten."""
        self._ports = dict(ports)
        members: dict[PortKey, list[str]] = {}
        for netdev, key in self._ports.items():
            members.setdefault(key, []).append(netdev)
        self._members = {k: tuple(v) for k, v in members.items()}
        for gone in [n for n in self._heard if n not in self._ports]:
            del self._heard[gone]
        for gone in [n for n in self._last_frame if n not in self._ports]:
            del self._last_frame[gone]
        for key in [k for k in self._tracks if k not in self._members]:
            del self._tracks[key]

    def heard(self, netdev: str, frame: LldpFrame) -> None:
        """A well-formed frame came in on ``netdev``."""
        key = self._ports.get(netdev)
        if key is None:
            return
        now = self.clock()
        self._last_frame[netdev] = now
        if frame.ttl == 0:
            self._heard.pop(netdev, None)
            return
        hca, port = key
        self._heard[netdev] = _Heard(
            PortNeighbour(hca, port, netdev, frame.chassis_id, frame.port_id,
                          frame.system_name, frame.port_description),
            now + frame.ttl)

    def settle(self) -> tuple[PortNeighbour, ...]:
        """Expire what is out of date, follow changes and holds; what to publish now."""
        now = self.clock()
        for netdev in [n for n, h in self._heard.items() if h.expires <= now]:
            del self._heard[netdev]
        for key, netdevs in self._members.items():
            current = next((self._heard[n].neighbour for n in netdevs if n in self._heard),
                           None)
            track = self._tracks.setdefault(key, _Track(stable_since=now))
            if current != track.current:
                track.current = current
                track.stable_since = now
                if track.churn.changed(now, count=self.changes, window=self.window):
                    self.holds_total += 1
            track.churn.settled(now, track.stable_since, self.hold_seconds)
            if not track.churn.held:
                track.published = track.current
        return self.published()

    def published(self) -> tuple[PortNeighbour, ...]:
        found = (t.published for t in self._tracks.values())
        return tuple(sorted((n for n in found if n is not None),
                            key=lambda n: (n.hca, n.port)))

    def held(self) -> frozenset[PortKey]:
        """The ports whose neighbour is held for churn now."""
        return frozenset(k for k, t in self._tracks.items() if t.churn.held)

    def next_deadline(self) -> float | None:
        """When a neighbour expires or a hold ends if nothing else happens (on the clock)."""
        times = [h.expires for h in self._heard.values()]
        times += [t.stable_since + self.hold_seconds for t in self._tracks.values()
                  if t.churn.held]
        return min(times) if times else None

    def last_frames(self) -> dict[PortKey, float]:
        """Each port's latest frame (on the clock), for the ports that had one."""
        out: dict[PortKey, float] = {}
        for netdev, at in self._last_frame.items():
            key = self._ports[netdev]
            out[key] = max(at, out.get(key, at))
        return out
