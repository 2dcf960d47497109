"""The module constants a submit with links reads on its way (rsd/core/work/parents.py:
``link_args``, ``Parents.check``, ``_task``, ``adopt``, ``_link``) are declared ``Final``.
Compiled by mypyc (the build `make` installs), a ``Final`` module constant is a C static;
any other module-level name, and any constant imported from another module, is looked up
by name in the module's dict at each use: a dozen lookups a child, in the path the
fan-out's 1,000 children take (bench/fanout.py). The one exception is ``_MAX_CHILDREN``,
which the tests lower to try the bound (a ``Final`` would be out of their reach).

Nothing here measures time: the source is read (ast), as the build reads it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rsd

PARENTS = Path(rsd.__file__).parent / "core" / "work" / "parents.py"  # (the source, not the .so)
HOT = {"link_args", "check", "_task", "adopt", "_link"}
LOWERED_BY_TESTS = {"_MAX_CHILDREN"}


def _is_final(annotation: ast.expr) -> bool:
    target = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return isinstance(target, ast.Name) and target.id == "Final"


def _module_constants(tree: ast.Module) -> tuple[dict[str, bool], set[str]]:
    """The module's own constants (name -> declared Final) and the constants (ALL_CAPS
    names) it imports."""
    own: dict[str, bool] = {}
    imported: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    own[target.id] = False
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own[node.target.id] = _is_final(node.annotation)
        elif isinstance(node, ast.ImportFrom):
            imported |= {alias.asname or alias.name for alias in node.names
                         if (alias.asname or alias.name).isupper()}
    own.pop("__all__", None)
    return own, imported


def _hot_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in HOT:
            found.append(node)
    return found


def test_a_linked_submit_reads_its_constants_as_compiled_statics() -> None:
    tree = ast.parse(PARENTS.read_text(), str(PARENTS))
    own, imported = _module_constants(tree)
    functions = _hot_functions(tree)
    assert {function.name for function in functions} == HOT
    read_by_name = sorted({
        f"{function.name}:{node.lineno} reads {node.id}"
        for function in functions for node in ast.walk(function)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
        and node.id not in LOWERED_BY_TESTS
        and ((node.id in own and not own[node.id]) or node.id in imported)
    })
    assert not read_by_name, read_by_name
