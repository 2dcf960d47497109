"""Exporting the runs of a slot range looks only at those runs' own state (transfer.py):
a core holding 100k other runs, with items of their own, exports one run with the same
records, looking at one run, and never walking the table of runs or of items."""

from __future__ import annotations

from typing import Any

import pytest
from support.core import WALL, CoreDriver
from support.twoshards import placed, shard, slot

from rsd.core import Rec
from rsproto import Op

RUN = placed("m")
OTHERS = 100_000


class NoWalk(dict[Any, Any]):
    """A table that may be looked up, never walked."""

    def _walked(self, *args: Any) -> Any:
        raise AssertionError("the export walked a whole table")

    __iter__ = keys = values = items = _walked


def with_run(core: CoreDriver) -> CoreDriver:
    core.create_runs(RUN)
    core.call(Op.CLAIM_ACQUIRE, {"scope": RUN, "key": "k"})
    for n in range(3):
        core.call(Op.TASK_SUBMIT, {"scope": RUN, "mailbox": "jobs", "key": f"t{n}", "data": n})
    core.call(Op.RECEIVE, {"scope": RUN, "mailbox": "jobs"})
    core.drain()
    return core


def crowded() -> CoreDriver:
    """A shard with OTHERS runs in other slots (some holding work) beside RUN."""
    core = with_run(shard("a", 1))
    target = slot(RUN)
    made = 0
    n = 0
    while made < OTHERS:
        n += 1
        run = f"other-{n}"
        if slot(run) == target:
            continue
        core.apply((Rec.SCOPE_CREATED, run, WALL, "default"), 0.0)
        made += 1
        if made % 1000 == 0:  # some hold work of their own
            core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": made})
    core.drain()
    return core


@pytest.mark.at_scale
def test_one_run_is_exported_alike_beside_100k_others_without_a_walk() -> None:
    alone = with_run(shard("a", 1))
    core = crowded()
    assert len(core.scopes) > OTHERS
    tables, work = core.tables, core.work
    scopes, items = tables.scopes, work.items
    tables.scopes, work.items = NoWalk(scopes), NoWalk(items)
    try:
        before = core.transfer.looked_at
        rec = core.export_slots(slot(RUN), slot(RUN))
        assert core.transfer.looked_at - before == 1
    finally:
        tables.scopes, work.items = scopes, items
    expected = alone.export_slots(slot(RUN), slot(RUN))
    assert len(rec) == len(expected) == 1
    assert [r[0] for r in rec[0][3]] == [r[0] for r in expected[0][3]]
