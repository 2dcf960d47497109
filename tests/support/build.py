"""Which build is running: the modules mypyc compiles (pyproject.toml's
``[tool.rsd.mypyc]``, read as setup.py reads it) and whether each was imported compiled.

A compiled module is an extension module beside its ``.py``, and it wins at import time:
``stale()`` names those whose source changed after they were built (``make`` rebuilds).
"""

from __future__ import annotations

import importlib
import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def setup_module_of_the_checkout() -> ModuleType:
    """setup.py as a module (its ``setup()`` runs only as ``__main__``)."""
    spec = importlib.util.spec_from_file_location("rsd_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled(module: ModuleType) -> bool:
    """Whether ``module`` runs compiled (an extension module, not its ``.py``)."""
    return not str(getattr(module, "__file__", "")).endswith(".py")


def compiled_sources() -> list[str]:
    """The files the build compiles, as setup.py lists them (``rsd/core/machine.py``, ...)."""
    with open(REPO / "pyproject.toml", "rb") as file:
        config = tomllib.load(file)["tool"]["rsd"]["mypyc"]
    kept = set(config["python"])
    return sorted(
        path.relative_to(REPO).as_posix()
        for pattern in config["compile"]
        for path in REPO.glob(pattern)
        if path.relative_to(REPO).as_posix() not in kept
    )


def module_name(source: str) -> str:
    return source.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def imported() -> dict[str, ModuleType]:
    """Each compiled-to-be module, imported here (from wherever sys.path finds it)."""
    return {source: importlib.import_module(module_name(source)) for source in compiled_sources()}


def stale() -> list[str]:
    """The sources newer than the extension module built from them (beside them)."""
    out = []
    for source in compiled_sources():
        path = REPO / source
        built = list(path.parent.glob(f"{path.stem}.*.so"))
        if built and max(b.stat().st_mtime for b in built) < path.stat().st_mtime:
            out.append(source)
    return out
