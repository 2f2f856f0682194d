"""Checks of settings against each other and against the machine.

Whether the device-plugin pools and the DRA driver could offer the same HCA (known from the
config alone, or after discovery), the union of what they select, and whether a sysfs or
/dev root is plausible. ``rdma_hca.settings.config`` runs the checks the config alone
answers while it loads; the daemon runs the others after discovery.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from rdma_hca.node.model import Hca
from rdma_hca.settings.coerce import RawValue
from rdma_hca.settings.decl import BY_KEY
from rdma_hca.settings.model import ConfigError, Mode, PoolConfig, Selectors, Settings, norm_hex


def _names_meet(a: Sequence[str], b: Sequence[str]) -> bool:
    """True when some pattern of ``a`` and one of ``b`` surely select a common name."""
    return any(x == y or fnmatchcase(x, y) or fnmatchcase(y, x) for x in a for y in b)


def _exact_disjoint(a: Sequence[str], b: Sequence[str], norm: Any = str.lower) -> bool:
    return bool(a) and bool(b) and not {norm(x) for x in a} & {norm(y) for y in b}


def surely_shared(a: Selectors, b: Selectors) -> bool:
    """Known without looking at the node: both selectors take some same HCA.

    Either takes every HCA, or both name the same HCAs (literally or by a glob that matches
    the other's pattern) and no other list tells them apart.
    """
    if a.takes_all or b.takes_all:
        return True
    if not (a.names and b.names and _names_meet(a.names, b.names)):
        return False
    return not (
        _exact_disjoint(a.drivers, b.drivers)
        or _exact_disjoint(a.link_layers, b.link_layers)
        or _exact_disjoint(a.pci_vendors, b.pci_vendors, norm_hex)
        or _exact_disjoint(a.pci_devices, b.pci_devices, norm_hex)
    )


def names_both_select(a: Selectors, b: Selectors) -> tuple[str, ...]:
    """The HCA names (or the narrower of two meeting patterns) both selectors surely take,
    as the config alone shows them; () when both take every HCA."""
    if a.takes_all:
        return tuple(b.names)
    if b.takes_all:
        return tuple(a.names)
    out: list[str] = []
    for x in a.names:
        for y in b.names:
            # The narrower side names what both hold: a literal a glob matches, or the glob
            # both spell alike.
            held = x if x == y or fnmatchcase(x, y) else y if fnmatchcase(y, x) else None
            if held is not None and held not in out:
                out.append(held)
    return tuple(out)


def held_text(names: Sequence[str]) -> str:
    """``the HCA mlx5_0``, ``the HCAs mlx5_0, mlx5_1``, or ``every HCA`` for ()."""
    if not names:
        return "every HCA"
    return ("the HCA " if len(names) == 1 else "the HCAs ") + ", ".join(names)


def overlapping_hcas(settings: Settings, hcas: Sequence[Hca]) -> dict[str, list[str]]:
    """HCA name -> its owners (``"pool rdma/hca"``, ``"dra"``) for every HCA more than one
    owner selects: the daemon checks this after discovery, where globs and drivers are known."""
    owners: dict[str, list[str]] = {}
    for pool in settings.pools:
        for h in hcas:
            if pool.selectors.matches(h):
                owners.setdefault(h.name, []).append(f"pool {pool.resource_name}")
    if settings.dra.enabled:
        for h in hcas:
            if settings.dra.selectors.matches(h):
                owners.setdefault(h.name, []).append("dra")
    return {name: who for name, who in owners.items() if len(who) > 1}


def pools_sharing(settings: Settings, hcas: Sequence[Hca]
                  ) -> list[tuple[str, PoolConfig, PoolConfig]]:
    """(HCA name, pool, later pool) for every HCA two device-plugin pools both hold."""
    out: list[tuple[str, PoolConfig, PoolConfig]] = []
    for h in hcas:
        holders = [p for p in settings.pools if p.selectors.matches(h)]
        out.extend((h.name, a, b) for i, a in enumerate(holders) for b in holders[i + 1:])
    return out


def exclusive_first(a: PoolConfig, b: PoolConfig) -> tuple[PoolConfig, PoolConfig] | None:
    """The pair with an exclusive pool first, or None when both are shared."""
    if a.mode is Mode.EXCLUSIVE:
        return a, b
    if b.mode is Mode.EXCLUSIVE:
        return b, a
    return None


def selected_hcas(settings: Settings, hcas: Sequence[Hca]) -> tuple[Hca, ...]:
    """The union of the pools' HCAs (and DRA's, when enabled), in the order given."""
    selectors = [p.selectors for p in settings.pools]
    if settings.dra.enabled:
        selectors.append(settings.dra.selectors)
    return tuple(h for h in hcas if any(s.matches(h) for s in selectors))


def kubelet_root_problem(path: str, what: str = "root") -> str | None:
    """Why ``path`` cannot be the kubelet's root (``what="root"``) or its device-plugins
    directory (``"device-plugins"``), or None.

    A missing one is fine (the kubelet may not have made it yet: the daemon waits); a file
    would be waited on forever.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        example = "/var/lib/kubelet" + ("/device-plugins" if what != "root" else "")
        return (f"{path} is not a directory: give the kubelet's {what} directory, e.g. "
                f"{example}")
    return None


def mount_dir_problem(path: str, what: str) -> str | None:
    """Why ``path`` cannot be the directory where ``what`` is mounted (missing, or not a
    directory), or None."""
    if not os.path.exists(path):
        return f"{path} does not exist: give the directory where {what} is mounted"
    if not os.path.isdir(path):
        return f"{path} is not a directory: give the directory where {what} is mounted"
    return None


def root_problem(kind: str, path: str) -> str | None:
    """Why ``path`` cannot be the sysfs (``kind="sysfs"``) or /dev (``"dev"``) root, or None.

    A root without class/infiniband is fine (a node without RDMA); a missing one, a file,
    or the directory above the real root (``/`` instead of ``/sys``) is not.
    """
    problem = mount_dir_problem(path, kind)
    if problem is not None:
        return problem
    sub, markers = ("sys", ("class",)) if kind == "sysfs" else ("dev", ("infiniband", "null"))
    inner = os.path.join(path, sub)
    if not any(os.path.exists(os.path.join(path, m)) for m in markers) and any(
            os.path.exists(os.path.join(inner, m)) for m in markers):
        return (f"{path} has no {markers[0]}/ but {inner} looks like the {kind} root: "
                f"did you mean {inner}?")
    return None


# The settings that say where things are on this machine, and what makes each unusable.
_ROOTS: dict[str, Callable[[str], str | None]] = {
    "sysfsRoot": lambda path: root_problem("sysfs", path),
    "devRoot": lambda path: root_problem("dev", path),
    "kubeletRoot": lambda path: kubelet_root_problem(path, "root"),
    "kubeletDir": lambda path: kubelet_root_problem(path, "device-plugins"),
}
ROOT_KEYS: tuple[str, ...] = tuple(_ROOTS)


def check_roots(settings: Settings, keys: Iterable[str] = ROOT_KEYS) -> None:
    """Refuse the first of these roots that cannot be used, naming the layer that gave it
    (:class:`ConfigError`); ``serve`` checks them all, a tool those it reads."""
    for key in keys:
        path = getattr(settings, BY_KEY[key].attr)
        why = _ROOTS[key](path)
        if why:
            raise ConfigError(key, path, why, setting_source(settings, key))


def setting_source(settings: Settings, key: str) -> str:
    """The layer that gave a setting its value, as errors name it."""
    if key in settings.sources:
        return settings.sources[key]
    if key == "kubeletDir":  # derived from kubeletRoot when not given
        return f"{BY_KEY[key].default_text}, kubeletRoot from " + setting_source(
            settings, "kubeletRoot")
    return "the default"


# --- the same HCA offered twice, known from the config alone ------------------------------


def check_static_overlap(settings: Settings, merged: Mapping[str, RawValue]) -> None:
    """Refuse settings that surely offer one HCA twice: by two pools, one exclusive, or by a
    pool and the DRA driver; ``merged`` names the layer that gave the value to change."""
    _check_exclusive_pools(settings, merged)
    if not settings.dra.enabled:
        return
    dra = settings.dra.selectors
    fix = ("give the pools and dra.selectors names that do not overlap (e.g. pools "
           "names: [mlx5_0, mlx5_1], dra names: [mlx5_2, mlx5_3]), or set "
           "devicePlugin.enabled: false (--no-device-plugin) to run DRA alone")
    for pool in settings.pools:
        if not surely_shared(pool.selectors, dra):
            continue
        if pool.selectors.takes_all:
            why = f"the pool {pool.resource_name} takes every HCA"
        elif dra.takes_all:
            why = ("dra.selectors is empty, so DRA takes every HCA, also those of "
                   f"{pool.resource_name}")
        else:
            why = f"the pool {pool.resource_name} and dra.selectors select the same HCA names"
        v = merged.get("dra.enabled", RawValue(True, ""))
        raise ConfigError("dra.enabled", v.value,
                          f"{why}, so it would be offered twice: {fix}", v.source)


def _check_exclusive_pools(settings: Settings, merged: Mapping[str, RawValue]) -> None:
    """Two pools known from the config alone to hold a same HCA, one of them exclusive.

    An exclusive pool hands each HCA to one pod; another pool would hand it out again.
    Shared pools may overlap (the daemon says so once, naming the HCAs, after discovery).
    """
    pools = settings.pools
    for i, a in enumerate(pools):
        for b in pools[i + 1:]:
            pair = exclusive_first(a, b)
            if pair is None or not surely_shared(a.selectors, b.selectors):
                continue
            ex, other = pair
            if ex.selectors.takes_all or other.selectors.takes_all:
                whole = ex if ex.selectors.takes_all else other
                why = f"the pool {whole.resource_name} takes every HCA"
            else:
                why = "both select the same HCA names"
            held = held_text(names_both_select(ex.selectors, other.selectors))
            v = merged.get("pools", RawValue(None, ""))
            raise ConfigError(
                "pools", f"{ex.resource_name}, {other.resource_name}",
                f"the exclusive pool {ex.resource_name} and the pool {other.resource_name} "
                f"would both hold {held} ({why}): an exclusive pool gives each HCA to one "
                "pod only; give the pools selectors that keep their HCAs apart", v.source)
