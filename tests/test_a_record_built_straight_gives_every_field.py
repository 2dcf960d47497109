"""The records a task's every cycle writes are made with ``built(Kind, (...))``
(rsd/core/records/itemrecords.py): the tuple made straight, without the NamedTuple's
Python-level ``__new__``, which fills a field left out with its default and which mypy
checks against the declaration. So every such call in rsd/ gives a tuple of exactly
its kind's fields, written out (no ``*``), and what it makes is what the class makes:
the same fields, the same type, the same bytes in the journal."""

from __future__ import annotations

import ast
from pathlib import Path

from support.sources import parsed

import rsd
import rsproto as wire
from rsd.core.records import Rec, itemrecords
from rsd.core.records.itemrecords import Delivered, Finished, built

ROOT = Path(rsd.__file__).parent


def _calls_of_built() -> list[tuple[str, ast.Call]]:
    calls = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(parsed(path)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "built"):
                calls.append((f"{path.relative_to(ROOT.parent)}:{node.lineno}", node))
    return calls


def test_every_record_built_straight_gives_each_of_its_fields() -> None:
    calls = _calls_of_built()
    assert len(calls) >= 3, calls  # ITEM_ENQUEUED, DELIVERED, FINISHED at least
    wrong = []
    for where, call in calls:
        kind, fields = call.args
        assert isinstance(kind, ast.Name), where
        declared = getattr(itemrecords, kind.id)._fields
        if (not isinstance(fields, ast.Tuple) or len(fields.elts) != len(declared)
                or any(isinstance(elt, ast.Starred) for elt in fields.elts)):
            wrong.append(f"{where}: {kind.id} has {len(declared)} fields")
    assert not wrong, "built(Kind, (every field, in order)):\n" + "\n".join(wrong)


def test_a_record_built_straight_is_the_one_its_class_builds() -> None:
    delivered = (Rec.DELIVERED, "t-1", b"h" * 24, 1, "worker", 30.0, False)
    finished = (Rec.FINISHED, "t-1", "COMPLETED", {"n": 1}, None, 1.7e9, False, "complete", 9)
    for kind, fields in ((Delivered, delivered), (Finished, finished)):
        record = built(kind, fields)
        assert type(record) is kind
        assert record == kind(*fields)
        assert record._asdict() == kind(*fields)._asdict()
        assert wire.pack_from_rsd(record) == wire.pack_from_rsd(kind(*fields))
