"""protocol.md's "Slots and shards" states the rules every client routes by as rsproto
declares them: its test vectors are ``SLOT_VECTORS``, its route table is ``ROUTE`` (each
op's route and the fields whose slot decides it), row for row."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rsproto import Op
from rsproto.sdkrules import ROUTE
from rsproto.slots import DEFAULT_SLOTS, MAX_PLACEMENT_BYTES, MAX_SLOTS, SLOT_VECTORS

DOC = Path(__file__).resolve().parent.parent / "protocol.md"


def rows(heading: str, columns: list[str]) -> list[list[str]]:
    """The rows of the first table under ``heading`` (its cells as written)."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    assert lines.count(heading) == 1, f"protocol.md must have one heading {heading!r}"
    table: list[list[str]] = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif table:
            break
    assert table and table[0] == columns, f"the table under {heading!r}: {table[:1]}"
    return table[2:]


def test_the_test_vectors_are_slot_vectors() -> None:
    doc = [(json.loads(key.strip("`")), int(slots), int(slot))
           for key, slots, slot in rows("### Slot test vectors", ["key", "slots", "slot"])]
    assert tuple(doc) == SLOT_VECTORS


def test_the_route_table_is_route() -> None:
    doc = {}
    for code, name, route, fields in rows("### Routes",
                                          ["code", "name", "route", "decided by"]):
        assert Op[name] == int(code), f"{name} is op {int(Op[name])}, not {code}"
        doc[Op[name]] = (route, tuple(re.findall(r"`([^`]+)`", fields)))
    assert doc == {op: (rule.route.value, rule.fields) for op, rule in ROUTE.items()}


def test_the_numbers_are_rsprotos() -> None:
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    assert f"`--slots`, default {DEFAULT_SLOTS}, 1 to {MAX_SLOTS}" in text
    assert f"`placement` (1 to {MAX_PLACEMENT_BYTES} UTF-8 bytes" in text
