"""Cancelling a huge run, or the rest of a big group, never stops the loop (cascade.py).

SCOPE_CANCEL of a run holding 100,000 tasks ended them all inside the one request: about
1.7 s of one loop turn on the pure core alone, every other client waiting. Here, on the
pure core and a fake clock: the request ends at most ``MAX_CANCELLED_PER_STEP`` claims and
tasks, each later tick at most as many more, no two steps run in one tick, the reply still
counts everything, nothing is ended twice or missed, and a crash in the middle of the
cascade is finished after recovery. GROUP_WAIT's ``cancel_rest`` on a group of 10,000
(about 0.3 s in one request before) is worked through the same way.
"""

from __future__ import annotations

from typing import Any

from support.core import BOB, CoreDriver

from rsd.core.records import Rec
from rsd.policy import Policy
from rsproto import ErrorCode, Op

STEP = Policy.MAX_CANCELLED_PER_STEP
TASKS = 5 * STEP + 7
CLAIMS = STEP + 3


def filled() -> CoreDriver:
    """A core whose run "s" holds CLAIMS claims and TASKS tasks, one of them running."""
    core = CoreDriver(recovered=True)
    for i in range(CLAIMS):
        core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": f"c{i}"})
    for start in range(0, TASKS, 256):
        items = [{"key": f"t{i}", "data": None} for i in range(start, min(TASKS, start + 256))]
        core.call(Op.TASK_SUBMIT_MANY, {"scope": "s", "mailbox": "jobs", "items": items,
                                        "slim": True})
    core.drain()
    return core


def endings(records: list[Any]) -> int:
    return sum(1 for rec in records if rec[0] in (Rec.FINISHED, Rec.LEASE_ENDED))


def ended_in_one_call(core: CoreDriver, call: Any) -> int:
    before = len(core.records)
    call()
    core.drain()
    return endings(core.records[before:])


def test_a_run_cancel_ends_one_step_per_tick_and_counts_everything_in_its_reply() -> None:
    core = filled()
    reply: dict[str, Any] = {}
    first = ended_in_one_call(
        core, lambda: reply.update(core.call(Op.SCOPE_CANCEL, {"scope": "s"}))
    )
    assert reply["tasks"] == TASKS and reply["claims"] == CLAIMS
    assert first == STEP
    assert ended_in_one_call(core, lambda: core.tick(core.now)) == 0  # never twice a tick
    steps = 1
    while core.cascade:
        now = core.next_deadline()
        assert now is not None and now - core.now < 0.01  # the next step is due at once
        core.now = max(core.now, now)
        ended = ended_in_one_call(core, lambda: core.tick(core.now))
        assert ended <= STEP
        steps += 1
    assert steps == -(-(TASKS + CLAIMS) // STEP)
    status = core.call(Op.SCOPE_STATUS, {"scope": "s"})
    assert status["tasks"] == {"CANCELLED": TASKS} and status["claims"] == 0
    assert endings(core.records) >= TASKS + CLAIMS


def finish_cascade(core: CoreDriver) -> None:
    while core.cascade:
        core.advance(0.01)
    core.drain()


def test_during_the_cascade_the_run_neither_delivers_nor_accepts_settlements() -> None:
    core = filled()
    delivery = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}, BOB)["delivery"]
    core.call(Op.SCOPE_CANCEL, {"scope": "s"})
    core.drain()
    assert core.cascade  # the first step ended claims only: the task still runs
    for settle in (Op.DELIVERY_COMPLETE, Op.DELIVERY_RETRY, Op.DELIVERY_REJECT):
        refused = core.refused(settle, {"lease": delivery["lease"], "outcome": 1}, BOB)
        assert refused.code == ErrorCode.SCOPE_CANCELLED
    refused = core.refused(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}, BOB)
    assert refused.code == ErrorCode.SCOPE_CANCELLED
    finish_cascade(core)
    finished = [rec for rec in core.records if rec[0] == Rec.FINISHED and rec[1] == delivery["id"]]
    assert len(finished) == 1
    status = core.call(Op.SCOPE_STATUS, {"scope": "s"})
    assert status["tasks"] == {"CANCELLED": TASKS}
    refused = core.refused(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]}, BOB)
    assert refused.code == ErrorCode.SCOPE_CANCELLED


def test_a_cascade_cut_by_a_crash_is_finished_after_recovery() -> None:
    core = filled()
    core.call(Op.SCOPE_CANCEL, {"scope": "s"})
    core.drain()
    assert core.cascade  # more than one step is left
    rebuilt = core.replay()
    rebuilt.recovered(core.now, clean=False)
    finish_cascade(rebuilt)
    status = rebuilt.call(Op.SCOPE_STATUS, {"scope": "s"})
    assert status["state"] == "cancelled"
    assert status["tasks"] == {"CANCELLED": TASKS} and status["claims"] == 0


def test_group_cancel_rest_ends_the_rest_one_step_per_tick_and_counts_them_all() -> None:
    core = CoreDriver(recovered=True)
    members = 4 * STEP + 5
    for start in range(0, members, 256):
        items = [{"key": f"g{i}", "data": None, "group": "g"}
                 for i in range(start, min(members, start + 256))]
        core.call(Op.TASK_SUBMIT_MANY, {"scope": "s", "mailbox": "jobs", "items": items})
    delivery = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}, BOB)["delivery"]
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": 1}, BOB)
    core.drain()
    reply: dict[str, Any] = {}
    first = ended_in_one_call(core, lambda: reply.update(core.call(
        Op.GROUP_WAIT, {"scope": "s", "group": "g", "need": 1, "cancel_rest": True})))
    assert reply["reached"] and reply["cancelled"] == members - 1
    assert first == STEP
    assert ended_in_one_call(core, lambda: core.tick(core.now)) == 0  # never twice a tick
    while core.cascade:
        core.now = max(core.now, core.next_deadline() or core.now)
        assert ended_in_one_call(core, lambda: core.tick(core.now)) <= STEP
    status = core.call(Op.GROUP_STATUS, {"scope": "s", "group": "g"})
    assert status["counts"] == {"SUCCEEDED": 1, "CANCELLED": members - 1}
    assert status["unfinished"] == 0
