"""How rsctl prints: aligned tables for people, JSON for scripts.

What always holds: ``--json`` output is one JSON document per command (``top``: one
per refresh, a line each), with bytes as hex and nothing left out; the human form
shows the same values, instants (``*_at``) as UTC times, nested maps flattened to
dotted names.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from rsproto import fanout

__all__ = ["MEMBER_KEYS", "UsageError", "counted", "flatten", "human", "print_json",
           "print_pairs", "print_table"]


class UsageError(Exception):
    """An option rsctl cannot act on (exit 2, like argparse's own refusals)."""

# A cluster member's fields rsctl shows (``rsctl cluster``: each shard's members too),
# as every view of the shards shows them.
MEMBER_KEYS = fanout.MEMBER_KEYS


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return repr(value)


def print_json(value: Any, out: TextIO | None = None, *, line: bool = False) -> None:
    """One JSON document (``line``: on one line, for streams such as ``top``)."""
    text = json.dumps(value, default=_default, indent=None if line else 2, sort_keys=False)
    print(text, file=out or sys.stdout, flush=True)


def human(name: str, value: Any) -> str:
    """One value as a table cell."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and (name == "at" or name.endswith("_at")) and value > 1e8:
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, list | dict):
        return json.dumps(value, default=_default)
    return str(value)


def counted(number: int, noun: str) -> str:
    """``number`` and ``noun`` as a sentence says them: "1 claim", "0 claims", "2 dead
    letters" (the nouns rsctl counts all take an s)."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def print_table(
    rows: Iterable[dict[str, Any]], columns: Sequence[str], out: TextIO | None = None
) -> int:
    """Rows as an aligned table under upper-cased column names. Returns the row count."""
    cells = [[human(col, row.get(col)) for col in columns] for row in rows]
    widths = [len(col) for col in columns]
    for line in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, line, strict=True)]
    stream = out or sys.stdout
    header = [col.upper().ljust(w) for col, w in zip(columns, widths, strict=True)]
    print("  ".join(header).rstrip(), file=stream)
    for line in cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(),
              file=stream)
    return len(cells)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested maps as one map of dotted names (lists and scalars are leaves)."""
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, inner in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(inner, dict) and inner:
            flat.update(flatten(inner, name))
        else:
            flat[name] = inner
    return flat


def print_pairs(pairs: dict[str, Any], out: TextIO | None = None) -> None:
    """``name  value`` lines, names aligned."""
    width = max((len(k) for k in pairs), default=0)
    stream = out or sys.stdout
    for key, value in pairs.items():
        print(f"{key.ljust(width)}  {human(key, value)}", file=stream)
