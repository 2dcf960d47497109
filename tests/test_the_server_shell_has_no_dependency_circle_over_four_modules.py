"""No dependency circle of more than four modules among the server shell's modules (``rsd/*.py``).

Each part of the shell gets what it uses (collaborators passed in at construction, or a
narrow ``typing.Protocol`` declared beside the part) instead of the whole ``Server``,
and server.py wires them together; a part that imports ``Server``, even only for a type,
closes a circle through every part the server imports. Imports count whether they run
or are for types only (under ``if TYPE_CHECKING:``), and wherever they stand in a module
(a function-level import is still a dependency).

``rsd/core/`` counts as one node here, its imports from the shell the union of its
modules' (``policy.py``'s values), so a circle through it is still seen. The circle among
the core's own modules is not this test's subject: it is issue 20's other half, left
out for now.
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
