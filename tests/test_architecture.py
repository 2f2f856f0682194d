"""The folder tree is the architecture: which wing may import which, and no import cycles.

| wing    | may import                                   |
|---------|----------------------------------------------|
| kit     | nothing of the package                       |
| node    | kit                                          |
| daemon  | node, kit                                    |
| tools   | node, kit, and daemon's config types only    |
| devkit  | anything                                     |

Every import counts, including those inside functions and under TYPE_CHECKING: a lazy
import is still a dependency. The CLI reaches `serve` and the devkit commands by module
name (`tools.cli._command`), which is what lets the node image ship without the devkit.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "rdma_hca"
WINGS = ("kit", "node", "daemon", "tools", "devkit")
ALLOWED: dict[str, set[str]] = {
    "kit": set(),
    "node": {"kit"},
    "daemon": {"node", "kit"},
    "tools": {"node", "kit"},
    "devkit": set(WINGS),
    "": set(WINGS),  # rdma_hca/__init__.py
}
# What tools may take from the daemon: its settings, for `serve`'s flags and `doctor --node`.
TOOLS_MAY_USE_FROM_DAEMON = ("rdma_hca.daemon.config",)


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
    stray = [m for m in MODULES if m != PACKAGE and _wing(m) == ""]
    assert stray == [], f"modules outside the wings {WINGS}: {stray}"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_follow_the_wings(module: str) -> None:
    wing = _wing(module)
    bad = []
    for target in sorted(GRAPH[module]):
        other = _wing(target)
        if other in ("", wing) or other in ALLOWED[wing]:
            continue
        if wing == "tools" and other == "daemon" and target.startswith(TOOLS_MAY_USE_FROM_DAEMON):
            continue
        bad.append(target)
    assert bad == [], f"{module} ({wing or 'top'}) may not import {bad}"


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


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from rdma_hca.devkit.sim import nodes\n")
    assert "rdma_hca.devkit.sim.nodes" in _imports("rdma_hca.node.bad", bad)
    rel = tmp_path / "__init__.py"
    rel.write_text("from ..daemon import wiring\n")
    assert "rdma_hca.daemon.wiring" in _imports("rdma_hca.tools", rel)
