"""The repository's own Python files as syntax trees, each parsed once per test process.

Why: the structure tests (a function's length, the packages' order, where the core's
events are wired, where an item's order is set, records built straight, the compiled
core's constants, the build's libraries) each walk whole packages' trees. Each parsing
them anew cost about 9 s of a run's CPU, a third of it the collector walking the young
trees again and again while they were built. Here a file is parsed once per process,
with the collector paused while it is, and its tree is then frozen (``gc.freeze``: a
full collection of the test process never walks it again).

What always holds: a tree is the file's text as it was when first asked for, and is
shared: a caller only walks it, never changes it.
"""

from __future__ import annotations

import ast
import functools
import gc
from pathlib import Path


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree (the file named in its nodes' errors as ``path``)."""
    source = path.read_text(encoding="utf-8")
    collecting = gc.isenabled()
    gc.disable()
    try:
        tree = ast.parse(source, str(path))
    finally:
        if collecting:
            gc.enable()
    gc.freeze()
    return tree
