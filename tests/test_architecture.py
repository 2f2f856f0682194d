"""The folder tree is the architecture: which wing may import which, and no import cycles.

| wing     | may import                                 |
|----------|--------------------------------------------|
| kit      | nothing of the package                     |
| contract | kit                                        |
| node     | kit                                        |
| settings | contract, node, kit                        |
| kube     | kit                                        |
| daemon   | settings, contract, kube, node, kit        |
| tools    | settings, contract, kube, node, kit        |
| devkit   | anything                                   |
| top      | anything (``rdma_hca.cli``)                |

``contract`` is the DRA driver's wire format (device kinds and names, attribute, capacity,
taint and annotation names, the checkpoint's format, the CDI specs' names): the daemon
writes it and ``doctor`` reads it, and ``tools`` may not import the daemon, so it lives
below both. ``settings`` reads the defaults it holds (the resync period).

Inside the daemon, the rooms: the composition root (``daemon/*.py``) may use every room;
the device plugin and the DRA driver are two front ends over ``watch`` and ``offer`` and never
import each other; ``watch``, ``offer`` and ``observe`` know no front end.

Inside the DRA room, the kubelet plugin helper (``dra/kubeletplugin``, with its sockets,
and the slice publisher beside it, ``dra/resourceslice``, as upstream has them) and the
driver proper meet at one seam (``kubeletplugin/plugin.py``): the driver proper imports
nothing else of the helper, and the helper imports nothing of the driver proper. The
publisher reads the offer's device records (``dra/devices.py``); those know nothing of
the publisher.

No module re-exports: a name is imported from the module that defines it, never through
an ``__all__`` (or a ``*`` import) of another that imported it.

Every import counts, including those inside functions and under TYPE_CHECKING: a lazy
import is still a dependency, and so is a module the CLI loads by name (``cli._command``),
which is what lets the node image ship without the devkit.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "rdma_hca"
WINGS = ("kit", "contract", "node", "settings", "kube", "daemon", "tools", "devkit")
ALLOWED: dict[str, set[str]] = {
    "kit": set(),
    "contract": {"kit"},
    "node": {"kit"},
    "settings": {"contract", "node", "kit"},
    "kube": {"kit"},
    "daemon": {"settings", "contract", "kube", "node", "kit"},
    "tools": {"settings", "contract", "kube", "node", "kit"},
    "devkit": set(WINGS),
    "": set(WINGS),  # rdma_hca/__init__.py, rdma_hca/cli.py
}
ROOMS = ("watch", "offer", "deviceplugin", "dra", "observe", "fabric", "_proto")
# Which other rooms of the daemon a room may import; the composition root takes any.
ROOM_ALLOWED: dict[str, set[str]] = {
    "watch": set(),
    "offer": set(),
    "observe": set(),
    "fabric": {"watch"},
    "_proto": set(),
    "deviceplugin": {"watch", "offer", "_proto"},
    "dra": {"watch", "offer", "_proto"},
    "": set(ROOMS),
}
ROOT_MODULE_LIMIT = 6


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str:
    """The module an imported name lives in (`a.b.C` -> `a.b`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                prefix = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            # `from pkg import mod` depends on pkg.mod, `from mod import name` on mod.
            names = [f"{prefix}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "_command"):
            # The CLI's table: `_command("serve", "rdma_hca.daemon.main", "serve")`.
            names = [a.value for a in node.args
                     if isinstance(a, ast.Constant) and isinstance(a.value, str)
                     and a.value.startswith(PACKAGE + ".")]
        else:
            continue
        for name in names:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                target = _resolve(name)
                if target and target != module:
                    found.add(target)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items() if "_pb2" not in p.name}


def _wing(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WINGS else ""


def test_every_module_is_in_a_wing() -> None:
    stray = [m for m in MODULES if m not in (PACKAGE, f"{PACKAGE}.cli") and _wing(m) == ""]
    assert stray == [], f"modules outside the wings {WINGS}: {stray}"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_follow_the_wings(module: str) -> None:
    wing = _wing(module)
    bad = []
    for target in sorted(GRAPH[module]):
        other = _wing(target)
        if other in ("", wing) or other in ALLOWED[wing]:
            continue
        bad.append(target)
    assert bad == [], f"{module} ({wing or 'top'}) may not import {bad}"


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 3 and parts[1] == "daemon" and parts[2] in ROOMS:
        return parts[2]
    return ""


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _wing(m) == "daemon"))
def test_daemon_rooms_import_one_way(module: str) -> None:
    room = _room(module)
    bad = [t for t in sorted(GRAPH[module])
           if _wing(t) == "daemon" and _room(t) not in (room, *ROOM_ALLOWED[room])]
    assert bad == [], f"{module} (daemon room {room or 'root'}) may not import {bad}"


def test_every_daemon_module_is_in_a_room_or_the_root() -> None:
    daemon = SRC / PACKAGE / "daemon"
    rooms = sorted(p.name for p in daemon.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert rooms == sorted(ROOMS), f"daemon packages {rooms} are not the rooms {ROOMS}"
    root = sorted(p.name for p in daemon.glob("*.py") if p.name != "__init__.py")
    assert len(root) <= ROOT_MODULE_LIMIT, f"the daemon's root holds {root}"


DRA = f"{PACKAGE}.daemon.dra"
HELPER = f"{DRA}.kubeletplugin"  # the kubelet plugin helper
PUBLISHER = f"{DRA}.resourceslice"  # the slice publisher, the helper's too
# What the driver proper may use of the helper: the seam it implements.
HELPER_SEAM = {f"{HELPER}.plugin"}
# Modules both sides stand on: the claim's typed edge (with its status entries), the
# configuration, the records, the offer's wire format (the devices the publisher writes)
# and the API layer. Every other module of the DRA room outside the helper, but the
# composition (``driver``), is the driver proper.
DRA_SHARED = {f"{DRA}.{m}" for m in ("claims", "claimrecords", "config", "checkpoint",
                                     "devices", "kubeapi")}


def _helper_module(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in (HELPER, PUBLISHER))


DRIVER_PROPER = {m for m in GRAPH if m.startswith(DRA + ".") and not _helper_module(m)
                 and m not in DRA_SHARED and m != f"{DRA}.driver"}


def test_the_driver_proper_sees_the_helper_only_through_its_seam() -> None:
    assert f"{DRA}.prepare" in DRIVER_PROPER and all(m in GRAPH for m in HELPER_SEAM)
    bad = {m: sorted(t for t in GRAPH[m] if _helper_module(t) and t not in HELPER_SEAM)
           for m in sorted(DRIVER_PROPER)}
    bad = {m: ts for m, ts in bad.items() if ts}
    assert bad == {}, f"the driver proper reaches into the helper: {bad}"


def test_the_helper_does_not_import_the_driver_proper() -> None:
    helper = sorted(m for m in GRAPH if _helper_module(m))
    assert f"{HELPER}.helper" in helper
    bad = {m: sorted(t for t in GRAPH[m] if t in DRIVER_PROPER or t == f"{DRA}.driver")
           for m in helper}
    bad = {m: ts for m, ts in bad.items() if ts}
    assert bad == {}, f"the helper imports the driver proper: {bad}"


def test_the_offered_devices_know_nothing_of_the_publisher() -> None:
    # One direction: the publisher reads the device records, never the other way round.
    assert f"{PUBLISHER}.publisher" in GRAPH and f"{DRA}.devices" in GRAPH[f"{PUBLISHER}.slices"]
    bad = sorted(t for t in GRAPH[f"{DRA}.devices"] if _helper_module(t))
    assert bad == [], f"dra.devices imports the helper or the publisher: {bad}"


def test_no_import_cycles() -> None:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(GRAPH.get(m, ())):
            if state.get(t) == 1:
                cycles.append([*stack[stack.index(t):], t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _reexports(path: Path) -> list[str]:
    """Names a module hands on from elsewhere: listed in ``__all__`` but imported, or ``*``."""
    tree = ast.parse(path.read_text(), str(path))
    imported: set[str] = set()
    star = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    star.append(f"{getattr(node, 'module', '')}.*")
                imported.add(a.asname or a.name.partition(".")[0])
    listed: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            value = node.value
            if not isinstance(value, (ast.List, ast.Tuple)):
                return ["__all__ (not a literal list)", *star]
            listed += [e.value for e in value.elts
                       if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return sorted({*star, *(n for n in listed if n in imported)})


@pytest.mark.parametrize("module", sorted(m for m, p in MODULES.items()
                                          if "_pb2" not in p.name and "._proto" not in m))
def test_no_module_re_exports_what_it_imports(module: str) -> None:
    # One name, one home: importers name the module that defines it.
    bad = _reexports(MODULES[module])
    assert bad == [], f"{module} re-exports {bad}: import them from where they are defined"


def test_the_checker_sees_a_re_export(tmp_path: Path) -> None:
    mod = tmp_path / "mod.py"
    mod.write_text("from a import B\n\ndef c() -> None: ...\n\n__all__ = ['B', 'c']\n")
    assert _reexports(mod) == ["B"]
    mod.write_text("from a import *  # noqa\n")
    assert _reexports(mod) == ["a.*"]
    mod.write_text("def c() -> None: ...\n\n__all__ = ['c']\n")
    assert _reexports(mod) == []


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from rdma_hca.devkit.sim import nodes\n")
    assert "rdma_hca.devkit.sim.nodes" in _imports("rdma_hca.node.bad", bad)
    rel = tmp_path / "__init__.py"
    rel.write_text("from ..daemon import wiring\n")
    assert "rdma_hca.daemon.wiring" in _imports("rdma_hca.tools", rel)
    table = tmp_path / "cli.py"
    table.write_text('x = _command("demo", "rdma_hca.devkit.commands", "demo")\n')
    assert "rdma_hca.devkit.commands" in _imports("rdma_hca.tools.cli", table)


def test_the_checker_sees_a_front_end_reaching_into_the_other() -> None:
    module = "rdma_hca.daemon.dra.driver"
    room = _room(module)
    assert _room("rdma_hca.daemon.deviceplugin.pool") not in (room, *ROOM_ALLOWED[room])
