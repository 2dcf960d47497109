"""Item ids never collide across shards (ids.py, transfer.py): each shard of a sharded
cluster counts in namespaces of its own (``t-N.@SHARD``), a server alone keeps
``t-N``; a shard that imports runs takes their ids, so it never gives one of them; and
an import whose ids meet the target's own is refused whole."""

from __future__ import annotations

import pytest
from support.core import CoreDriver, on_disk
from support.twoshards import move, placed, shard, slot

from rsd.core import CoreError
from rsd.core.ground.ids import item_number
from rsproto import ErrorCode, Op

RUN = placed("m")


def submit(core: CoreDriver, run: str = "s", key: str | None = None) -> str:
    args = {"scope": run, "mailbox": "jobs", "data": 1, "key": key}
    task_id: str = core.call(Op.TASK_SUBMIT, args)["id"]
    return task_id


def test_a_server_alone_keeps_todays_ids_and_shards_have_their_own() -> None:
    assert submit(CoreDriver(recovered=True)) == "t-1"
    assert submit(shard("a", 1)) == "t-1.@a"
    assert submit(shard("b", 2)) == "t-1.@b"
    acme = shard("a", 1, tenants={1: ("acme", True)})
    assert submit(acme) == "t-1.acme@a"


def test_ids_moved_in_are_never_given_again_by_the_target() -> None:
    a, b = shard("a", 1), shard("b", 2)
    a.create_runs(RUN)
    moved = [submit(a, RUN, f"k{n}") for n in range(5)]
    own = [submit(b) for _ in range(3)]
    move(a, b, slot(RUN))
    space, top = item_number(moved[-1])
    assert b.work.item_ids.peek(space) > top  # the source's namespace, taken past them
    later = [submit(b) for _ in range(3)]
    assert not set(later) & (set(moved) | set(own))
    assert all(b.call(Op.TASK_STATUS, {"scope": RUN, "task": t})["id"] == t for t in moved)


def test_an_import_whose_ids_meet_the_targets_is_refused_whole() -> None:
    a, twin = shard("a", 1), shard("a", 2)  # misconfigured: two shards of one name
    a.create_runs(RUN)
    submit(a, RUN)
    submit(twin)  # t-1.@a on both
    before = twin.stats()
    with pytest.raises(CoreError) as info:
        twin.import_runs(twin.now, on_disk(a.export_slots(slot(RUN), slot(RUN))[0]))
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert "t-1.@a" in str(info.value)
    assert twin.stats() == before
    assert (twin.tables.scopes.get(("default", RUN))) is None
