"""Once its runs are on their new shard, the source drops them (transfer.py): one
RUNS_DROPPED record takes everything of them out, the source then holds exactly what it
held without them (every table, count and index as a core rebuilt without them), its
other runs go on untouched, the runs are unknown there, every wait on them is answered
MOVED, and a replay of the source's journal gives the same state."""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CAROL, CoreDriver, on_disk
from support.twoshards import move, one_of_everything, placed, shard, slot

from rsd.core import DEFERRED, Rec, transfer
from rsproto import ErrorCode, Op
from tests.test_core_counts_match_a_walk import assert_counts_match

RUN = placed("m")
_BY_RUN = {  # where a snapshot record names its run
    Rec.SNAP_SCOPE: 1, Rec.SNAP_CLAIM: 1, Rec.SNAP_ITEM: 3, Rec.SNAP_QUEUED: 2,
    Rec.SNAP_DEDUPE: 1, Rec.SNAP_DEAD_LETTER: 1, Rec.SNAP_SCHEDULE: 2,
}
_ASIDE = (Rec.SNAP_COUNTERS, Rec.SNAP_ID_COUNTERS, Rec.SNAP_SETTLED,  # compared apart
          Rec.SNAP_FORWARDED)  # (the moved leases, answered MOVED for a while: forwarded.py)


def without_run(core: CoreDriver) -> list[Any]:
    """``core``'s snapshot without RUN's records (and without the counters and the
    remembered settlements and the moved leases' handles, which a drop does not take
    back)."""
    records = [on_disk(r) for r in core.snapshot()]
    moved_ids = {r[1] for r in records if r[0] == Rec.SNAP_ITEM and r[3] == RUN}
    moved_ids |= {i for r in records if r[0] == Rec.SNAP_QUEUED and r[2] == RUN
                  for i in r[4][::10]}
    return [
        r for r in records
        if r[0] not in _ASIDE
        and not (r[0] in _BY_RUN and r[_BY_RUN[r[0]]] == RUN)
        and not (r[0] == Rec.GROUP_JOINED and r[1] in moved_ids)
    ]


def source() -> CoreDriver:
    """Shard A: RUN with one of everything, and run "s" with work of its own."""
    a = shard("a", 1)
    one_of_everything(a, RUN)
    a.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "mine"})
    for n in range(3):
        a.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "key": f"s{n}", "data": n})
    a.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}, BOB)
    a.drain()
    return a


def test_the_source_holds_what_it_held_without_the_run_and_replays_to_it() -> None:
    a, b = source(), shard("b", 2)
    expected = without_run(a)
    rebuilt = a.fresh()
    for rec in expected:
        rebuilt.apply(rec, a.now)
    move(a, b, slot(RUN))
    assert a.drop_slots(a.now, slot(RUN), slot(RUN)) == 1
    a.drain()
    assert a.records[-1][0] == Rec.RUNS_DROPPED
    assert sorted(map(repr, without_run(a))) == sorted(map(repr, expected))
    assert a.scopes.get(("default", RUN)) is None
    assert a.runs_in_slots(slot(RUN), slot(RUN)) == 0
    stats = {k: v for k, v in a.stats().items() if k != "timers"}
    assert stats == {k: v for k, v in rebuilt.stats().items() if k != "timers"}
    assert a.tenant_usage("default") == rebuilt.tenant_usage("default")
    assert_counts_match(a)
    replayed = a.replay()
    assert sorted(map(repr, without_run(replayed))) == sorted(map(repr, expected))
    assert replayed.scopes.get(("default", RUN)) is None
    err = a.refused(Op.TASK_STATUS, {"scope": RUN, "task": "t-1.@a"})
    assert err.code == ErrorCode.NOT_FOUND  # the shell answers MOVED before asking


def test_the_sources_other_runs_go_on_after_the_drop() -> None:
    a, b = source(), shard("b", 2)
    move(a, b, slot(RUN))
    a.drop_slots(a.now, slot(RUN), slot(RUN))
    got = a.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})["delivery"]
    a.call(Op.DELIVERY_COMPLETE, {"lease": got["lease"], "outcome": 1})
    assert a.call(Op.TASK_RESULT, {"scope": "s", "task": got["id"]})["outcome"] == 1
    a.advance(60.0)  # every timer of the dropped run would have come due by now
    assert a.scopes.get(("default", RUN)) is None
    assert_counts_match(a)


@pytest.mark.parametrize("when", ["at the pause", "at the drop"])
def test_every_wait_on_a_moved_run_is_answered_moved(when: str) -> None:
    a, b = source(), shard("b", 2)
    waits = {
        "claim": (Op.CLAIM_ACQUIRE, {"scope": RUN, "key": "held", "wait": True}),
        "receive": (Op.RECEIVE, {"scope": RUN, "mailbox": "ticks", "wait": True}),
        "result": (Op.TASK_RESULT, {"scope": RUN, "task": "t-2.@a", "timeout_ms": 9000}),
        "group": (Op.GROUP_WAIT, {"scope": RUN, "group": "g", "timeout_ms": 9000}),
    }
    rids = {}
    for n, (name, (op, args)) in enumerate(waits.items()):
        rids[name] = 500_000 + n
        assert a.call(op, args, CAROL, rid=rids[name]) is DEFERRED, name
    a.drain()
    details = {"slot": slot(RUN), "shard": "b", "primary": None, "map_epoch": 2}
    answered = {}
    if when == "at the pause":  # the shell's order: nothing is granted after the export
        assert a.answer_moved_waits(a.now, slot(RUN), slot(RUN), details) == 1
        answered = {m[1][1]: m[1] for m in a.drain() if m[0] == CAROL}
        a.advance(40.0)  # the held claim expires on A: its waiter is granted nothing
        assert not [m for m in a.drain() if m[0] == CAROL]
    move(a, b, slot(RUN))
    a.drop_slots(a.now, slot(RUN), slot(RUN), details)
    answered |= {m[1][1]: m[1] for m in a.drain() if m[0] == CAROL}
    for name, rid in rids.items():
        assert answered[rid][2] == ErrorCode.MOVED, name
        assert answered[rid][4] == details, name
    assert a.waits.total() == 0
    assert ALICE  # (the holders of the moved leases keep them on B)


def test_a_run_moved_in_the_middle_of_its_cancellation_is_cancelled_on_its_new_shard() -> None:
    a, b = shard("a", 1), shard("b", 2)
    a.create_runs(RUN)
    for n in range(1200):  # more than a slice (Policy.MAX_CANCELLED_PER_STEP)
        a.call(Op.TASK_SUBMIT, {"scope": RUN, "mailbox": "jobs", "key": f"k{n}", "data": n})
    a.call(Op.SCOPE_CANCEL, {"scope": RUN})
    scope = a.scopes[("default", RUN)]
    assert scope.live_items and len(a.cascade) == 1  # the first slice only, so far
    a.drain()
    move(a, b, slot(RUN))
    a.drop_slots(a.now, slot(RUN), slot(RUN))
    assert len(a.cascade) == 0  # nothing more of it is worked through on A
    a.advance(1.0)
    assert not [r for r in a.drain() if r] and not a.effects.take_records()
    for _ in range(5):  # a slice per step
        b.advance(0.1)
    moved = b.scopes[("default", RUN)]
    assert not moved.live_items and len(b.cascade) == 0
    status = b.call(Op.TASK_STATUS, {"scope": RUN, "task": "t-1200.@a"})
    assert status["state"] == "CANCELLED"


def test_a_drop_of_many_runs_is_several_whole_records(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "DROPPED_PER_RECORD", 2)
    a, b = shard("a", 1), shard("b", 2)
    runs = [placed("m", f"run{n}") for n in range(5)]
    a.create_runs(*runs)
    for run in runs:
        a.call(Op.CLAIM_ACQUIRE, {"scope": run, "key": "k"})
    a.drain()
    move(a, b, slot(RUN))
    assert a.drop_slots(a.now, slot(RUN), slot(RUN)) == 5
    a.drain()
    dropped = [r for r in a.records if r[0] == Rec.RUNS_DROPPED]
    assert [len(r[1]) for r in dropped] == [2, 2, 1]
    assert not a.runs_in_slots(slot(RUN), slot(RUN))
    replayed = a.replay()
    assert not [run for run in runs if ("default", run) in replayed.scopes]
    assert all(b.call(Op.CLAIM_INSPECT, {"scope": run, "key": "k"})["held"] for run in runs)
