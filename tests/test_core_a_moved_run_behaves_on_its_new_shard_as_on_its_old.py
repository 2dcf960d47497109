"""A run with every kind of state, exported from shard A's core and imported into a busy
shard B's (rsd/core/transfer.py), behaves on B exactly as it did on A, and B's own runs
are untouched: claims held with their tokens valid, a stale token still refused, a
delivery in flight completable with its handle, results readable, delays and schedules
firing at their times, dedupe and dead letters kept; every grant of a moved key after
the move is above every grant of it before; B's journal replays to the same state."""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CoreDriver, on_disk
from support.twoshards import move, one_of_everything, placed, shard, slot

from rsd.core import CoreError
from rsproto import ErrorCode, Op

RUN = placed("m")


def call(core: CoreDriver, op: Op, conn: int = ALICE, **args: Any) -> Any:
    return core.call(op, {"scope": RUN, **args}, conn)


def busy_source() -> tuple[CoreDriver, dict[str, Any]]:
    """Shard A with run RUN holding one of everything; what the test needs of it."""
    a = shard("a", 1)
    got = one_of_everything(a, RUN)
    a.drain()
    return a, got


def busy_target() -> CoreDriver:
    """Shard B, serving runs of its own in other slots: claims, queued and running work."""
    b = shard("b", 2)
    assert slot("s") != slot(RUN)
    b.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "held"})
    for n in range(5):
        b.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "key": f"b{n}", "data": n})
    b.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}, BOB)
    b.drain()
    return b


def own_state(core: CoreDriver, run: str = "s") -> list[Any]:
    scope = core.scopes[("default", run)]
    return [on_disk(r) for r in (*core.claims.run_snapshot(scope), *core.work.run_snapshot(scope))]


@pytest.fixture
def moved() -> tuple[CoreDriver, CoreDriver, dict[str, Any]]:
    a, got = busy_source()
    b = busy_target()
    got["b_before"] = own_state(b)
    got["stats_a"] = a.stats()
    a.advance(1.0)
    b.advance(1.0)
    reply = move(a, b, slot(RUN))
    assert reply["runs"] == 1
    return a, b, got


def test_the_targets_own_runs_are_untouched(moved: Any) -> None:
    _, b, got = moved
    assert own_state(b) == got["b_before"]


def test_a_held_claim_keeps_its_token_and_a_stale_one_is_still_refused(moved: Any) -> None:
    _, b, got = moved
    held, stale = got["held"], got["stale"]
    check = call(b, Op.FENCE_CHECK, key="held", token=held["lease"])
    assert check == {"current": True, "generation": held["generation"]}
    assert b.call(Op.LEASE_RENEW, {"leases": [held["lease"]]})["results"] == [None]  # renewed
    assert call(b, Op.FENCE_CHECK, key="freed", token=stale["lease"])["current"] is False
    assert call(b, Op.FENCE_CHECK, key="held", token=stale["lease"])["current"] is False


def test_every_grant_after_the_move_is_above_every_grant_before(moved: Any) -> None:
    _, b, got = moved
    held, stale = got["held"], got["stale"]
    freed = call(b, Op.CLAIM_ACQUIRE, BOB, key="freed")  # a key nobody held at the move
    assert freed["generation"] > stale["generation"]  # (B's own floor is below A's)
    refused = b.refused(Op.CLAIM_ACQUIRE, {"scope": RUN, "key": "held"}, BOB)
    assert refused.code == ErrorCode.CLAIM_HELD  # still held: by its holder on A
    b.call(Op.CLAIM_RELEASE, {"lease": held["lease"]})
    again = call(b, Op.CLAIM_ACQUIRE, BOB, key="held")
    assert again["generation"] > held["generation"]


def test_a_delivery_in_flight_completes_with_its_handle_and_results_are_read(
    moved: Any,
) -> None:
    _, b, got = moved
    done, inflight, delivery = got["done"], got["inflight"], got["delivery"]
    assert call(b, Op.TASK_RESULT, task=done["id"])["outcome"] == {"ok": 1}
    b.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": "moved"})
    assert call(b, Op.TASK_RESULT, task=inflight["id"])["outcome"] == "moved"


def test_delays_schedules_lines_dedupe_and_dead_letters_carry_on(moved: Any) -> None:
    _, b, got = moved
    first = call(b, Op.RECEIVE, mailbox="line")["delivery"]
    assert first["id"] == got["urgent"]["id"]  # the priority kept
    assert call(b, Op.RECEIVE, mailbox="line")["delivery"]["data"] == 0  # then the line
    assert call(b, Op.MESSAGE_SEND, mailbox="jobs", data="x", work_key="w")["id"] == \
        got["sent"]["id"]  # the dedupe entry moved with the run
    dead = call(b, Op.DEAD_LETTERS, mailbox="once")["items"]
    assert [d["reason"] for d in dead] == ["rejected: bad"]
    assert call(b, Op.GROUP_STATUS, group="g")["counts"] == {"PENDING": 1}
    later = got["later"]["id"]
    assert call(b, Op.TASK_STATUS, task=later)["state"] == "DELAYED"
    b.advance(4.5)  # 5 s after it was submitted on A (1 s passed before the move)
    assert call(b, Op.TASK_STATUS, task=later)["state"] == "PENDING"
    scope = b.scopes[("default", RUN)]
    assert not [k for k in scope.tasks if k.startswith("schedule:tick:")]  # at 5.5 s
    b.advance(5.0)  # its first fire time, 10 s after it was made on A, has passed
    assert len([k for k in scope.tasks if k.startswith("schedule:tick:")]) == 1


def test_the_targets_journal_replays_to_the_same_state(moved: Any) -> None:
    _, b, got = moved
    replayed = b.replay()
    assert sorted(map(repr, map(on_disk, replayed.snapshot()))) == sorted(
        map(repr, map(on_disk, b.snapshot()))
    )
    held = got["held"]
    assert replayed.call(Op.FENCE_CHECK, {"scope": RUN, "key": "held",
                                          "token": held["lease"]})["current"] is True


def test_an_import_that_meets_the_targets_state_is_refused_whole(moved: Any) -> None:
    a, b, _ = moved
    again = a.replay()  # A's state before any drop: the run is still there
    again.serve_shard("a", 64)
    before = b.stats()
    with pytest.raises(CoreError) as info:
        b.import_runs(b.now, on_disk(again.export_slots(slot(RUN), slot(RUN))[0]))
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert "already" in str(info.value)
    assert b.stats() == before
    assert b.effects.take_records() == []
