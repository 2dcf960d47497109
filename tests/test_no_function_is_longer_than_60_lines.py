"""No production function (rsd/, rsproto/, rsclient/, rsctl/) is longer than 60 lines:
a function is read in one sitting; a module may be long where it is one concept.

A function's length is ``end_lineno - lineno + 1`` of its ``def`` (its decorators
aside), nested functions counted within their enclosing one and on their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

from support.sources import parsed

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rsd", "rsproto", "rsclient", "rsctl")
MAX_LINES = 60

def _long_functions() -> dict[str, int]:
    """``path::name`` -> lines, for every production function over MAX_LINES."""
    found: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(parsed(path)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    assert node.end_lineno is not None
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        found[f"{path.relative_to(ROOT).as_posix()}::{node.name}"] = lines
    return found


def test_no_production_function_is_longer_than_60_lines() -> None:
    long = _long_functions()
    assert not long, (
        f"functions over {MAX_LINES} lines (split them into well-named helpers): "
        + ", ".join(f"{name} ({lines})" for name, lines in sorted(long.items()))
    )

