"""No dependency circle of more than four modules, among the server shell's modules
(``rsd/*.py``) or among the core's (``rsd/core/*.py``).

Each part of the shell gets what it uses (collaborators passed in at construction, or a
narrow ``typing.Protocol`` declared beside the part) instead of the whole ``Server``,
and server.py wires them together; a part that imports ``Server``, even only for a type,
closes a circle through every part the server imports. In the core, the books are made
bottom up (machine.py), each given only the books below it, and a part that must react
to another's change hears a named event (events.py) instead of importing it. Imports
count whether they run or are for types only (under ``if TYPE_CHECKING:``), and wherever
they stand in a module (a function-level import is still a dependency).

For the shell, ``rsd/core/`` counts as one node, its imports from the shell the union of
its modules' (``policy.py``'s values), so a circle through it is still seen.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rsd"
MAX_CIRCLE = 4
CORE = "core"  # the package rsd/core/, one node


def _imported(tree: ast.Module, package: str) -> set[str]:
    """Every ``rsd.<name>`` (or ``rsd.core``) a module imports, as ``<name>``; ``package``
    is the dotted package the module is in (for relative imports)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base)
                module = f"{prefix}.{node.module}" if node.module else prefix
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        for target in targets:
            parts = target.split(".")
            if parts == ["rsd"]:
                found.add("__init__")  # the package itself: rsd/__init__.py
            elif parts[0] == "rsd":
                found.add(parts[1])
    return found


def _core_edges() -> dict[str, set[str]]:
    """Core module -> the core modules it imports (``rsd.core.<name>``, relative or not)."""
    folder = ROOT / CORE
    modules = {path.stem for path in folder.glob("*.py")}
    edges: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    names = [node.module] if node.module else [a.name for a in node.names]
                    found |= {name.split(".")[0] for name in names}
                elif node.level == 0 and (node.module or "").startswith("rsd.core."):
                    found.add((node.module or "").split(".")[2])
            elif isinstance(node, ast.Import):
                found |= {
                    alias.name.split(".")[2] for alias in node.names
                    if alias.name.startswith("rsd.core.")
                }
        edges[path.stem] = {m for m in found if m in modules and m != path.stem}
    return edges


def _edges() -> dict[str, set[str]]:
    """Module -> the shell modules (and ``core``) it imports."""
    modules = {path.stem: path for path in ROOT.glob("*.py")}
    nodes = set(modules) | {CORE}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        edges[name] = {m for m in _imported(tree, "rsd") if m in nodes and m != name}
    edges[CORE] = set()
    for path in (ROOT / CORE).rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        package = ".".join(("rsd", *path.relative_to(ROOT).parent.parts))
        edges[CORE] |= {m for m in _imported(tree, package) if m in nodes and m != CORE}
    return edges


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_edge_collection_sees_type_only_and_relative_imports() -> None:
    edges = _edges()
    assert "server" in edges and len(edges) > 20  # it read the shell
    assert CORE in edges["server"]  # ``from .core import Core``
    assert "logfile_v1" in edges["logfile"]  # an import inside a function
    assert "connection" in edges["clientbudget"]  # under ``if TYPE_CHECKING:``
    assert "policy" in edges[CORE]  # ``from ..policy import Policy`` in the core


def test_the_circle_finder_finds_a_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _circles(edges) == [["a", "b", "c"]]


def test_no_dependency_circle_of_more_than_four_modules_in_the_shell() -> None:
    too_big = [circle for circle in _circles(_edges()) if len(circle) > MAX_CIRCLE]
    assert not too_big, f"dependency circles over {MAX_CIRCLE} modules in rsd/: {too_big}"


def test_no_part_of_the_shell_depends_on_the_server() -> None:
    """server.py wires the parts together; none of them reaches back for it (only the
    entry points that start one do)."""
    edges = _edges()
    entry_points = {"cli", "__main__"}
    reaching = sorted(m for m, targets in edges.items() if "server" in targets)
    assert set(reaching) <= entry_points, f"modules that import rsd.server: {reaching}"


def test_the_core_edge_collection_sees_type_only_imports() -> None:
    edges = _core_edges()
    assert "machine" in edges and len(edges) > 40  # it read the core
    assert "events" in edges["tables"]  # ``from .events import Events``
    assert "claim" in edges["scope"]  # under ``if TYPE_CHECKING:``


def test_no_dependency_circle_of_more_than_four_modules_in_the_core() -> None:
    too_big = [circle for circle in _circles(_core_edges()) if len(circle) > MAX_CIRCLE]
    assert not too_big, f"dependency circles over {MAX_CIRCLE} modules in rsd/core/: {too_big}"


def test_no_book_of_the_core_depends_on_the_core_that_wires_them() -> None:
    """machine.py makes the books and wires who hears which event; none reaches back
    (the package's face exports the Core; restore.py drives one in recovery)."""
    reaching = sorted(m for m, targets in _core_edges().items() if "machine" in targets)
    assert reaching == ["__init__", "restore"], f"modules that import machine.py: {reaching}"
