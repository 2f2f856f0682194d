"""HCAs that two offers select at once, judged on the node's live inventory.

Selectors name HCAs by pattern, so whether two offers overlap is only known once the
node's HCAs are: an HCA that both DRA and a device plugin pool offer, or that an
exclusive pool holds beside another pool, would be given to two pods that each believe
they have it alone. At start that refuses the config (exit status 2); an HCA that
appears later in both is said once, and the daemon keeps serving its pods.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rdma_hca.kit.sayonce import Once
from rdma_hca.node.model import Hca
from rdma_hca.settings.checks import exclusive_first, held_text, overlapping_hcas, pools_sharing
from rdma_hca.settings.model import ConfigError, Settings

log = logging.getLogger(__name__)


def _held_by(names: Sequence[str]) -> str:
    """``the HCA mlx5_0 is`` or ``the HCAs mlx5_0, mlx5_1 are``."""
    return held_text(names) + (" is" if len(names) == 1 else " are")


class PoolOverlaps:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # Overlaps of an HCA that came after start, already said.
        self._told = Once()
        self._checked = False

    def refuse_at_start(self, hcas: Sequence[Hca]) -> None:
        """Raise :class:`ConfigError` for an HCA offered twice where that cannot work: by
        DRA and a pool, or by an exclusive pool and another. Shared pools may hold a same
        HCA (their pods then share it): said once here."""
        twice = {name: who for name, who in overlapping_hcas(self.settings, hcas).items()
                 if "dra" in who}
        if twice:
            raise ConfigError(
                "dra.selectors",
                ", ".join(f"{n} ({' and '.join(w)})" for n, w in twice.items()),
                "an HCA is offered by DRA and by a device plugin pool at once; give "
                "dra.selectors and the pools' selectors HCAs apart, or set "
                "devicePlugin.enabled: false")
        for (exclusive, other), names in self._exclusive_overlaps(hcas).items():
            raise ConfigError(
                "pools", ", ".join(names), f"{_held_by(names)} in the exclusive pool "
                f"{exclusive} and in the pool {other}: an exclusive pool gives each HCA to one "
                "pod only; give the pools selectors that keep their HCAs apart")
        shared: dict[str, list[str]] = {}
        for name, a, b in pools_sharing(self.settings, hcas):
            for pool in (a, b):
                holders = shared.setdefault(name, [])
                if pool.resource_name not in holders:
                    holders.append(pool.resource_name)
        if shared:
            log.info("shared pools hold the same HCA(s), whose pods share them: %s",
                     "; ".join(f"{n} in {', '.join(p)}" for n, p in shared.items()))
        self._checked = True

    def say_late(self, hcas: Sequence[Hca]) -> None:
        """HCAs that appeared after start in an exclusive pool and another: said once each.

        At start that is a config error (status 2); a running daemon keeps serving its pods,
        and the next start refuses the config with the same words.
        """
        if not self._checked:
            return  # start checks them first, and refuses the config instead
        for (exclusive, other), names in self._exclusive_overlaps(hcas).items():
            new = [n for n in names if self._told.first(f"{n} {exclusive} {other}")]
            if new:
                log.error("%s in the exclusive pool %s and in the pool %s: an exclusive "
                          "pool gives each HCA to one pod only, so pods of both may share "
                          "it; give the pools selectors that keep their HCAs apart (a "
                          "restart refuses this config)", _held_by(new), exclusive, other)

    def _exclusive_overlaps(self, hcas: Sequence[Hca]) -> dict[tuple[str, str], list[str]]:
        """(exclusive pool, other pool) -> the HCAs both hold, for each such pair."""
        out: dict[tuple[str, str], list[str]] = {}
        for name, a, b in pools_sharing(self.settings, hcas):
            pair = exclusive_first(a, b)
            if pair is not None:
                held = out.setdefault((pair[0].resource_name, pair[1].resource_name), [])
                if name not in held:
                    held.append(name)
        return out
