"""Every library the modules mypyc compiles import, at any depth through rsd's and
rsproto's modules (also inside a function, or for types only: mypy reads those too), is
in pyproject's ``[build-system] requires``.

Why: mypyc type-checks the compiled modules and everything they import before it writes
any C, and `make` installs the project's other dependencies while it runs. A library the
check looks for before pip has put it in place is "not found", the compile fails, and the
build falls back to Python (setup.py), which the suite then refuses: seen once in a
CI-like run, when the batch runner, compiled, reached the TLS layer's ``import uvloop``
and uvloop was installed only with the other dependencies. Installed first, with the
build's own requirements, every library the check reads is in place whatever the timing.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

from support.build import REPO, compiled_sources
from support.sources import parsed

OURS = ("rsd", "rsproto")
# A requirement whose distribution name is not the module it gives the type check.
GIVES = {"msgpack-types": {"msgpack"}, "mypy": {"mypy", "mypy_extensions", "mypyc"}}


def _file_of(module: str) -> Path | None:
    """The source of one of our modules (``rsd.wire.connection``), None if it is none."""
    path = REPO.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports made absolute, each name imported
    from a module also as a possible submodule."""
    parts = path.relative_to(REPO).with_suffix("").parts
    package = list(parts[:-1])  # (an __init__ is in its package, as a module is)
    found: set[str] = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def libraries_read_by_the_compile() -> dict[str, str]:
    """Each library outside the standard one that the compiled modules reach -> one file
    of ours that imports it."""
    todo = [REPO / source for source in compiled_sources()]
    seen: set[Path] = set()
    libraries: dict[str, str] = {}
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _imports(path):
            top = module.partition(".")[0]
            if top in OURS:
                if (source := _file_of(module)) is not None:
                    todo.append(source)
            elif top and top not in sys.stdlib_module_names:
                libraries.setdefault(top, path.relative_to(REPO).as_posix())
    return libraries


def build_requirements() -> set[str]:
    """The modules ``[build-system] requires`` puts in place."""
    with open(REPO / "pyproject.toml", "rb") as file:
        requires = tomllib.load(file)["build-system"]["requires"]
    given: set[str] = set()
    for requirement in requires:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        assert name is not None, requirement
        distribution = name.group(0).lower()
        given |= GIVES.get(distribution, {distribution.replace("-", "_")})
    return given


def test_the_walk_finds_a_library_imported_inside_a_function_of_a_module_reached() -> None:
    # rsd/security/tls.py imports uvloop inside tls_layer; the compiled batch runner
    # reaches it through the connection
    assert libraries_read_by_the_compile().get("uvloop") == "rsd/security/tls.py"


def test_every_library_the_compiled_modules_reach_is_a_build_requirement() -> None:
    missing = {library: where for library, where in libraries_read_by_the_compile().items()
               if library not in build_requirements()}
    assert not missing, f"add to pyproject's [build-system] requires: {missing}"
