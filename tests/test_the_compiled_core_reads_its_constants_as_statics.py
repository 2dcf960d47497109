"""Every module constant a function of the compiled core (and of every other compiled
module: the shell's batch runner) reads is declared ``Final``.

Compiled by mypyc (the build `make` installs: pyproject's ``[tool.rsd.mypyc]``, the files
``support.build.compiled_sources()`` lists), a ``Final`` module constant is a C static, or
its value inlined; any other module-level name is looked up by name in the module's dict
at each use (``CPyDict_GetItem`` in the C under build/mypyc). Every submit, delivery and
settlement reads such constants (``Item.terminal``, ``PagedIndex.add``,
``canonical_digest``, ``view``, ...). The same holds for a constant imported from another
module: a ``Final`` one of a compiled module is that module's static; of a module run as
Python (rsproto, rsd.policy), only a ``Final`` literal (a number, a string) is inlined, and
anything else is looked up (a ``Final`` alias of it in the reading module is a static).

A constant here: a name bound once at module level (the source, read by ast) to a value
(the module, imported) that is a number, a string, bytes, None, an enum member, a plain
``object()`` sentinel, a function (an alias of one: ``_pack = pack_from_rsd``), or a
tuple, frozenset, list, dict or read-only mapping of those: not a class, a type alias or a
type variable. The exceptions are the constants a test lowers to try a bound
(``LOWERED_BY_TESTS``): a ``Final`` is inlined where it is read, out of the reach of
``monkeypatch.setattr``.

Nothing here measures time: the source is read as the build reads it.
"""

from __future__ import annotations

import ast
import enum
import importlib
import importlib.util
import types
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from support import build
from support.sources import parsed

# module source -> name -> the test that sets it (and why it is left a plain name).
LOWERED_BY_TESTS: dict[str, dict[str, str]] = {
    "rsd/core/ground/ids.py": {
        "BLOCK": "test_core_recovery: a block of 16 ids, crossed within a few submits",
        "_MARGIN": "test_core_recovery: the margin of a block of 16",
    },
    "rsd/core/work/parents.py": {
        "_MAX_CHILDREN": "test_core_a_cancelled_parent_ends_its_unfinished_subtree, "
                         "test_core_a_task_after_its_parents_...: 3 children a parent",
    },
    "rsd/core/work/workbook.py": {
        "_MAX_KEYS": "test_core_delayed_items_priorities_and_fair_shares: 3 keys a mailbox",
    },
    "rsd/core/runs/schedulebook.py": {
        "_PER_RUN": "test_core_schedules_fire_once_per_fire_time: 2 schedules a run",
        "_PER_TENANT": "test_core_schedules_fire_once_per_fire_time: 3 a tenant",
    },
    "rsd/core/transfer.py": {
        "DROPPED_PER_RECORD": "test_core_a_dropped_run_leaves_its_shard_...: 2 a record",
    },
}


PROJECT = {"rsd", "rsproto", "rsclient"}


@dataclass
class Binding:
    """A name bound at module level: how often, whether ``Final``, and to what."""

    line: int
    times: int = 1
    final: bool = False


def _is_final(annotation: ast.expr) -> bool:
    target = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return ((isinstance(target, ast.Name) and target.id == "Final")
            or (isinstance(target, ast.Attribute) and target.attr == "Final"))


def _bindings(
    tree: ast.Module, module: str, package: str,
) -> tuple[dict[str, Binding], dict[str, tuple[str, str]]]:
    """The module's own names (bound by assignment at its top level) and what it imports
    by name from the project's packages (local name -> (module, name))."""
    own: dict[str, Binding] = {}
    imported: dict[str, tuple[str, str]] = {}

    def bind(name: str, line: int, final: bool = False) -> None:
        if name in own:
            own[name].times += 1
        else:
            own[name] = Binding(line, final=final)

    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        bind(name.id, node.lineno)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.value is not None:
                bind(node.target.id, node.lineno, _is_final(node.annotation))
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            bind(node.target.id, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            if source.split(".")[0] in PROJECT:
                for alias in node.names:
                    imported[alias.asname or alias.name] = (source, alias.name)
    # A name a function rebinds (``global``) is no constant.
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            for name in node.names:
                if name in own:
                    own[name].times += 1
    return own, imported


def _constant(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str, bytes, enum.Enum)):
        return True
    if type(value) is object:  # a sentinel
        return True
    if isinstance(value, (types.BuiltinFunctionType, types.FunctionType)):
        return True  # bound by an assignment: an alias (a ``def`` is no binding here)
    if isinstance(value, (tuple, frozenset, list)):
        return all(_constant(item) for item in value)
    if isinstance(value, (dict, MappingProxyType)):
        return all(_constant(key) and _constant(item) for key, item in value.items())
    return False


def _literal(value: Any) -> bool:
    """What mypy folds to a ``Final``'s value, inlined wherever it is read."""
    return isinstance(value, (bool, int, float, str)) and not isinstance(value, enum.Enum)


def _reads(tree: ast.Module) -> list[tuple[str, int, str]]:
    """(function, line, name): each name read inside a function (its annotations aside:
    they are not run)."""
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        skipped = {id(node) for arg in ast.walk(function.args)
                   if isinstance(arg, ast.arg) and arg.annotation is not None
                   for node in ast.walk(arg.annotation)}
        if function.returns is not None:
            skipped |= {id(node) for node in ast.walk(function.returns)}
        for statement in ast.walk(function):
            if isinstance(statement, ast.AnnAssign):
                skipped |= {id(node) for node in ast.walk(statement.annotation)}
        # A name the function binds (not declared global) is its own, not the module's.
        declared = {name for node in ast.walk(function) if isinstance(node, ast.Global)
                    for name in node.names}
        local = {node.arg for node in ast.walk(function.args) if isinstance(node, ast.arg)}
        local |= {node.id for node in ast.walk(function)
                  if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
        local -= declared
        for node in ast.walk(function):
            if (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
                    and id(node) not in skipped and node.id not in local):
                found.append((function.name, node.lineno, node.id))
    return found


class Sources:
    """Each module's bindings, parsed once."""

    def __init__(self) -> None:
        self.compiled = {build.module_name(source): source for source in build.compiled_sources()}
        self.parsed: dict[str, tuple[dict[str, Binding], dict[str, tuple[str, str]]]] = {}

    def bindings(self, module: str) -> tuple[dict[str, Binding], dict[str, tuple[str, str]]]:
        if module not in self.parsed:
            found = importlib.import_module(module)
            path = found.__file__ or ""
            path = path if path.endswith(".py") else str(build.REPO / self.compiled[module])
            package = module if hasattr(found, "__path__") else module.rpartition(".")[0]
            self.parsed[module] = _bindings(parsed(Path(path)), module, package)
        return self.parsed[module]

    def origin(self, module: str, name: str) -> tuple[str, str] | None:
        """Where an imported name is bound (through the packages that pass it on), or
        None: a name bound by no assignment here (a class, a function, a module)."""
        for _ in range(8):
            own, imported = self.bindings(module)
            if name in own:
                return module, name
            if name not in imported:
                return None
            if (module, name) == imported[name]:
                return None
            module, name = imported[name]
        return None

    def looked_up(self, module: str, name: str) -> str | None:
        """Why a function of a compiled module looks ``name`` (its own or imported) up by
        name, or None: a static, inlined, or no constant."""
        own, imported = self.bindings(module)
        if name in imported:
            origin = self.origin(*imported[name])
            if origin is None:
                return None
            source_module, source_name = origin
            source_own, _ = self.bindings(source_module)
            binding = source_own.get(source_name)
            if binding is None or binding.times != 1:
                return None
            value = getattr(importlib.import_module(source_module), source_name, None)
            if not _constant(value):
                return None
            if source_module in self.compiled:
                return None if binding.final else f"{source_module}.{source_name} (not Final)"
            if binding.final and _literal(value):
                return None
            return f"{source_module}.{source_name} (of a module run as Python)"
        binding = own.get(name)
        if binding is None or binding.times != 1 or binding.final:
            return None
        if not _constant(getattr(importlib.import_module(module), name, None)):
            return None
        return "not Final"


def test_the_compiled_core_reads_its_constants_as_statics() -> None:
    sources = Sources()
    read_by_name = []
    for module, source in sorted(sources.compiled.items()):
        allowed = LOWERED_BY_TESTS.get(source, {})
        for function, line, name in _reads(parsed(build.REPO / source)):
            if name in allowed:
                continue
            why = sources.looked_up(module, name)
            if why is not None:
                read_by_name.append(f"{source}:{line} {function} reads {name}: {why}")
    assert not read_by_name, "\n".join(sorted(set(read_by_name)))


def test_the_constants_left_to_the_tests_are_still_theirs() -> None:
    """Each name of ``LOWERED_BY_TESTS`` is still a plain constant of its module (one made
    ``Final`` or gone would leave its entry here for nothing)."""
    sources = Sources()
    modules = {source: module for module, source in sources.compiled.items()}
    for source, names in LOWERED_BY_TESTS.items():
        own, _ = sources.bindings(modules[source])
        for name in names:
            assert name in own and not own[name].final, (source, name)
