"""The core mints a fresh run id from the shell's source and by the shell's predicate, and
stays deterministic for what it is given: a placement tags the id (``{placement}`` and
the drawn hex digits, whatever the predicate says: its slot is the placement's), an id
without one is drawn again until the predicate (``placeable``: its slot is this
shard's) takes it, and a replay of the records gives the same runs."""

from __future__ import annotations

from collections.abc import Iterator

from rsproto import Op
from tests.support.core import CoreDriver


def drawn() -> Iterator[str]:
    for n in range(1000):
        yield f"{n:024x}"


def test_ids_are_drawn_until_placeable_and_placements_tag_them() -> None:
    ids = drawn()
    core = CoreDriver(scope_ids=lambda: next(ids))
    core.scope_book.placeable = lambda scope_id: int(scope_id, 16) % 3 == 2
    first = core.call(Op.SCOPE_CREATE, {})
    second = core.call(Op.SCOPE_CREATE, {})
    assert (first["scope"], second["scope"]) == (f"{2:024x}", f"{5:024x}")
    placed = core.call(Op.SCOPE_CREATE, {"placement": "acme"})
    assert placed == {"scope": "{acme}" + f"{6:024x}", "created": True}
    core.drain()
    replayed = core.replay()
    assert set(replayed.scopes) == set(core.scopes)


def test_a_placement_is_checked_before_anything_changes() -> None:
    core = CoreDriver()
    core.drain()
    before = (len(core.records), set(core.scopes))
    for args, says in (({"placement": "x" * 65}, "1 to 64 UTF-8 bytes (got 65)"),
                       ({"placement": "a}b"}, "must not contain"),
                       ({"placement": ["a"]}, "must be a string"),
                       ({"placement": "a", "scope": "s2"}, "not both")):
        error = core.refused(Op.SCOPE_CREATE, args)
        assert error.code == "INVALID_ARGUMENT" and says in error.message, error.message
    core.drain()
    assert (len(core.records), set(core.scopes)) == before
