"""Which HCAs are held down for flapping: the live view's memory of port changes.

Followed change by change, a port that flaps every 100 ms would turn its devices
Unhealthy and Healthy ten times a second and rewrite the node's ResourceSlice as often
as the writes are let through, while no pod could use it anyway. A lone change (a port
going down, coming back) is followed at once; an HCA whose state (a port up, or none)
changed ``FLAP_CHANGES`` times within ``FLAP_WINDOW_SECONDS`` is held: it counts as down
from that moment until a port of it has been up for the hold time (``flapHoldSeconds``)
without a break. What is held travels with the inventory (``NodeInventory.held``), so
both front ends hand out the one verdict of ``offer.health``.

Pure bookkeeping over an injected clock: the watcher feeds it every inventory it
publishes and publishes again when a hold ends.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rdma_hca.node.model import NodeInventory

FLAP_CHANGES = 4  # changes of an HCA's state within the window that make it flapping
FLAP_WINDOW_SECONDS = 10.0


@dataclass(slots=True)
class Churn:
    """One thing's changes within the window, and whether they hold it: the one flap
    hold, for an HCA's link state here and a port's LLDP neighbour in ``fabric.table``."""

    changes: deque[float] = field(default_factory=deque)  # times, within the window
    held_since: float | None = None

    def changed(self, now: float, *, count: int, window: float) -> bool:
        """A change at ``now``; True when it starts a hold."""
        self.changes.append(now)
        while self.changes and self.changes[0] <= now - window:
            self.changes.popleft()
        if self.held_since is None and len(self.changes) >= count:
            self.held_since = now
            return True
        return False

    def settled(self, now: float, since: float | None, hold: float) -> None:
        """It has stayed as it is ``since`` then (None: not yet settled): a hold ends
        after ``hold`` seconds of that."""
        if self.held_since is not None and since is not None and now - since >= hold:
            self.held_since = None
            self.changes.clear()  # its next change is a lone one again

    @property
    def held(self) -> bool:
        return self.held_since is not None


@dataclass(slots=True)
class _Track:
    up: bool
    churn: Churn = field(default_factory=Churn)
    up_since: float | None = None  # when a port last came up (None while none is)


class FlapHold:
    def __init__(self, hold_seconds: float, *, changes: int = FLAP_CHANGES,
                 window: float = FLAP_WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_seconds = hold_seconds
        self.changes = changes
        self.window = window
        self.clock = clock
        self.holds_total = 0  # times an HCA was held
        self._tracks: dict[str, _Track] = {}

    def observe(self, inventory: NodeInventory) -> frozenset[str]:
        """Take the HCAs' state now; the HCAs held from now on."""
        now = self.clock()
        present = set()
        for hca in inventory.hcas:
            present.add(hca.name)
            up = hca.any_port_up
            track = self._tracks.get(hca.name)
            if track is None:
                self._tracks[hca.name] = _Track(up, up_since=now if up else None)
                continue
            if up == track.up:
                continue
            track.up = up
            track.up_since = now if up else None
            if track.churn.changed(now, count=self.changes, window=self.window):
                self.holds_total += 1
        # An HCA that went away is forgotten unless held (it may be back in a moment).
        for name in [n for n, t in self._tracks.items()
                     if n not in present and not t.churn.held]:
            del self._tracks[name]
        return self.held()

    def held(self) -> frozenset[str]:
        """The HCAs held now; a hold whose port stayed up long enough ends here."""
        now = self.clock()
        out = []
        for name, track in self._tracks.items():
            track.churn.settled(now, track.up_since, self.hold_seconds)
            if track.churn.held:
                out.append(name)
        return frozenset(out)

    def next_release(self) -> float | None:
        """When the earliest hold ends if nothing changes (on the clock), or None."""
        ends = [t.up_since + self.hold_seconds for t in self._tracks.values()
                if t.churn.held and t.up_since is not None]
        return min(ends) if ends else None

    def flaps_seen(self, name: str) -> int:
        """Changes of the HCA's state within the window (for the log line of a hold)."""
        track = self._tracks.get(name)
        return len(track.churn.changes) if track is not None else 0
