"""A pool at run time: its current view of the HCAs and the device state streams follow.

Discovery and the health watcher feed new inventories in; the gRPC servicer reads
the view (Allocate) and follows the state (ListAndWatch). Each change of verdict is
logged once, when it happens, never once per poll.

An HCA the pool held and that disappears (driver unload, hot-unplug) is remembered as
missing: it counts as down under ``unhealthyWhen`` until an HCA with the same name or
the same PCI address is selected again. Only this process remembers it, so a restart
of the daemon forgets it (the pool then holds what it finds).
"""

from __future__ import annotations

import logging
from dataclasses import fields

from rdma_hca.daemon.deviceplugin.pool import NO_MATCH, PoolView, select
from rdma_hca.daemon.deviceplugin.state import DeviceState
from rdma_hca.daemon.offer.env import NO_NCCL_ENV, EnvSettings
from rdma_hca.node.model import Hca, NodeInventory
from rdma_hca.settings.model import PoolConfig, Selectors

log = logging.getLogger(__name__)


class PoolRuntime:
    def __init__(self, config: PoolConfig, *, env: EnvSettings = NO_NCCL_ENV,
                 cdi: bool = False) -> None:
        self.config = config
        self.env = env
        self.cdi = cdi
        self.view = PoolView(config, (), None, env=env, cdi=cdi)
        self.state = DeviceState(self.view.devices())
        self._problems: tuple[str, ...] | None = None
        self._hca_names: tuple[str, ...] | None = None
        # Every HCA the pool has held, by name, as last seen.
        self._held: dict[str, Hca] = {}

    @property
    def resource_name(self) -> str:
        return self.config.resource_name

    @property
    def missing_hcas(self) -> tuple[str, ...]:
        """Names of HCAs the pool held that are gone now (for /metrics)."""
        return tuple(h.name for h in self.view.missing)

    @property
    def selected_hcas(self) -> tuple[str, ...]:
        """Names of the HCAs the pool's selectors match now (for /metrics)."""
        return tuple(h.name for h in self.view.hcas)

    @property
    def selected_hca_count(self) -> int:
        """HCAs the pool's selectors match now, usable or not (for /metrics)."""
        return len(self.view.hcas)

    async def update(self, inventory: NodeInventory) -> bool:
        """Take a new inventory; return True when the advertised list changed."""
        view = select(self.config, inventory, env=self.env, cdi=self.cdi)
        missing = self._missing(view.hcas)
        if missing:
            view = select(self.config, inventory, env=self.env, cdi=self.cdi, missing=missing)
        self.view = view
        self._log_changes(inventory)
        return await self.state.update(self.view.devices())

    def _missing(self, present: tuple[Hca, ...]) -> list[Hca]:
        names = {h.name for h in present}
        # One that comes back under a new name (a driver reload renames) is back: its
        # PCI address is that of an HCA the pool never held by that name.
        renamed = {h.pci_address for h in present if h.pci_address and h.name not in self._held}
        for old in [h for h in self._held.values()
                    if h.name not in names and h.pci_address and h.pci_address in renamed]:
            del self._held[old.name]
        for h in present:
            self._held[h.name] = h
        return [h for h in self._held.values() if h.name not in names]

    def _log_changes(self, inventory: NodeInventory) -> None:
        name = self.config.resource_name
        extra = {"resource": name}
        names = tuple(h.name for h in self.view.hcas)
        if names != self._hca_names:
            if names or self.view.missing:
                log.info("%s holds %d HCA(s): %s", name, len(names), ", ".join(names) or "none",
                         extra=extra)
            else:
                log.warning("%s selects no HCA, so it advertises no devices: %s", name,
                            why_empty(self.config.selectors, inventory), extra=extra)
            self._hca_names = names
        problems = tuple(self.view.problems())
        if problems == self._problems:
            return
        before = set(self._problems or ())
        held = {*names, *(h.name for h in self.view.missing)}

        def about(problem: str) -> dict[str, str]:
            # An HCA's problem starts with its name ("mlx5_3: no port is up").
            hca = problem.partition(":")[0]
            return {**extra, "hca": hca} if hca in held else extra

        for p in problems:
            if p not in before and p != NO_MATCH:
                log.warning("%s: %s", name, p, extra=about(p))
        for p in before - set(problems):
            log.info("%s: resolved: %s", name, p, extra=about(p))
        self._problems = problems
        devices = self.view.devices()
        healthy = sum(1 for d in devices if d.healthy)
        log.info("%s: %d of %d devices Healthy", name, healthy, len(devices), extra=extra)


def why_empty(selectors: Selectors, inventory: NodeInventory) -> str:
    """Which selectors matched nothing, in words an operator can act on."""
    if not inventory.hcas:
        return "the node has no RDMA HCA (check the drivers are loaded)"
    found = ", ".join(h.name for h in inventory.hcas)
    empty = [f.name for f in fields(Selectors) if getattr(selectors, f.name)
             and not any(Selectors(**{f.name: getattr(selectors, f.name)}).matches(h)
                         for h in inventory.hcas)]
    if empty:
        said = "; ".join(f"{n}={list(getattr(selectors, n))}" for n in empty)
        return f"selectors that match none of the node's HCAs ({found}): {said}"
    return f"each selector matches some of the node's HCAs ({found}) but none matches all"
