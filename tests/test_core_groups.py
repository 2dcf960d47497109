"""Task groups in the pure core, on a fake clock (support/core.py's CoreDriver).

Each test is named after the rule it protects: the quorum wait answered by the K-th
success (pushed, not polled), impossibility reported at once and the moment it
happens, cancel_rest, the counts by state, bounds, withdrawal and recovery.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CoreDriver, next_rid

from rsd.core import DEFERRED, CoreError
from rsproto import ErrorCode, Kind, Limits, Op, Push


@pytest.fixture
def core() -> CoreDriver:
    core = CoreDriver()
    assert core.call(Op.SCOPE_CREATE, {})["scope"] == "scope-1"
    core.drain()
    return core


RUN = "scope-1"


def submit(core: CoreDriver, n: int, group: str | None = "g", **extra: Any) -> str:
    args: dict[str, Any] = {"scope": RUN, "mailbox": "jobs", "data": n, "key": f"k{n}", **extra}
    if group is not None:
        args["group"] = group
    return core.call(Op.TASK_SUBMIT, args)["id"]


def deliver(core: CoreDriver, conn: int = BOB) -> dict[str, Any]:
    return core.call(Op.RECEIVE, {"scope": RUN, "mailbox": "jobs"}, conn)["delivery"]


def complete(core: CoreDriver, outcome: Any, conn: int = BOB) -> str:
    delivery = deliver(core, conn)
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": outcome}, conn)
    return delivery["id"]


def reject(core: CoreDriver, conn: int = BOB) -> str:
    delivery = deliver(core, conn)
    core.call(Op.DELIVERY_REJECT, {"lease": delivery["lease"], "reason": "no"}, conn)
    return delivery["id"]


def wait(core: CoreDriver, rid: int, group: str = "g", **extra: Any) -> Any:
    return core.call(Op.GROUP_WAIT, {"scope": RUN, "group": group, **extra}, rid=rid)


def replies(messages: list[Any], conn: int = ALICE) -> dict[int, Any]:
    return {m[1]: m[2] for c, m in messages if c == conn and m[0] == Kind.REPLY}


def status(core: CoreDriver, group: str = "g") -> dict[str, Any]:
    return core.call(Op.GROUP_STATUS, {"scope": RUN, "group": group})


# ---- the quorum ------------------------------------------------------------------------


def test_a_wait_for_k_successes_is_answered_by_the_kth_success_with_ids_and_outcomes(
    core: CoreDriver,
) -> None:
    ids = [submit(core, n) for n in range(5)]
    rid = next_rid()
    assert wait(core, rid, need=2) is DEFERRED
    first = complete(core, "a")
    assert replies(core.drain()) == {}  # one success is not two: nothing yet
    second = complete(core, "b")
    reply = replies(core.drain())[rid]
    assert reply["reached"] is True and reply["need"] == 2
    assert reply["done"] == [
        {"id": first, "key": "k0", "outcome": "a"}, {"id": second, "key": "k1", "outcome": "b"},
    ]
    assert reply["counts"] == {"SUCCEEDED": 2, "PENDING": 3}
    assert reply["cancelled"] == 0
    assert [first, second] == ids[:2]
    assert core.waits.total() == 0


def test_need_defaults_to_every_task_of_the_group_at_the_time_of_the_wait(
    core: CoreDriver,
) -> None:
    for n in range(3):
        submit(core, n)
    submit(core, 9, group="other")
    rid = next_rid()
    assert wait(core, rid) is DEFERRED
    for outcome in ("x", "y"):
        complete(core, outcome)
    assert rid not in replies(core.drain())
    complete(core, "z")
    reply = replies(core.drain())[rid]
    assert (reply["need"], len(reply["done"])) == (3, 3)


def test_a_need_already_met_is_answered_at_once(core: CoreDriver) -> None:
    submit(core, 0)
    complete(core, 1)
    reply = wait(core, next_rid(), need=1)
    assert reply["reached"] is True and [d["outcome"] for d in reply["done"]] == [1]


def test_outcomes_false_answers_ids_only(core: CoreDriver) -> None:
    submit(core, 0)
    complete(core, {"big": "x" * 100})
    reply = wait(core, next_rid(), need=1, outcomes=False)
    assert reply["done"] == [{"id": "t-1", "key": "k0"}]


# ---- impossibility -------------------------------------------------------------------


def test_a_need_that_cannot_be_reached_is_reported_at_once_with_the_counts(
    core: CoreDriver,
) -> None:
    for n in range(3):
        submit(core, n)
    reject(core)
    reply = wait(core, next_rid(), need=3)
    assert reply["reached"] is False
    assert reply["counts"] == {"FAILED": 1, "PENDING": 2}
    assert (reply["succeeded"], reply["unfinished"], reply["done"]) == (0, 2, [])
    assert "can reach at most 2" in reply["why"] and "3 needed" in reply["why"]
    assert core.waits.total() == 0


def test_a_parked_wait_is_answered_the_moment_its_need_becomes_unreachable(
    core: CoreDriver,
) -> None:
    for n in range(3):
        submit(core, n)
    low, high = next_rid(), next_rid()
    assert wait(core, low, need=2) is DEFERRED
    assert wait(core, high, need=3) is DEFERRED
    reject(core)  # at most 2 can succeed now: the wait for 3 hears it, the one for 2 waits
    got = replies(core.drain())
    assert list(got) == [high] and got[high]["reached"] is False
    core.call(Op.TASK_CANCEL, {"scope": RUN, "task": "t-2"})
    got = replies(core.drain())
    assert list(got) == [low] and got[low]["reached"] is False
    assert core.waits.total() == 0


def test_a_wait_on_a_group_with_no_tasks(core: CoreDriver) -> None:
    assert wait(core, next_rid())["reached"] is True  # need defaults to all: none
    reply = wait(core, next_rid(), group="nobody", need=1)
    assert reply["reached"] is False and "has no tasks" in reply["why"]


def test_new_tasks_keep_a_wait_reachable(core: CoreDriver) -> None:
    submit(core, 0)
    assert wait(core, next_rid(), need=2)["reached"] is False
    submit(core, 1)
    rid = next_rid()
    assert wait(core, rid, need=2) is DEFERRED
    submit(core, 2)
    reject(core)  # 2 can still succeed
    assert rid not in replies(core.drain())
    complete(core, "a")
    complete(core, "b")
    assert replies(core.drain())[rid]["reached"] is True


# ---- cancel_rest -----------------------------------------------------------------------


def test_cancel_rest_cancels_the_unfinished_tasks_with_a_reason_once_the_need_is_met(
    core: CoreDriver,
) -> None:
    for n in range(4):
        submit(core, n)
    submit(core, 7, group="other")
    rid = next_rid()
    assert wait(core, rid, need=1, cancel_rest=True) is DEFERRED
    running = deliver(core, conn=ALICE)  # t-1, running at alice
    complete(core, "win")  # t-2
    messages = core.drain()
    reply = replies(messages)[rid]
    assert (reply["reached"], reply["cancelled"]) == (True, 3)
    assert reply["counts"] == {"SUCCEEDED": 1, "CANCELLED": 3}
    for task in ("t-1", "t-3", "t-4"):
        view = core.call(Op.TASK_STATUS, {"scope": RUN, "task": task})
        assert view["state"] == "CANCELLED"
        assert view["reason"] == "group 'g' reached 1 successes; the rest was cancelled"
    assert core.call(Op.TASK_STATUS, {"scope": RUN, "task": "t-5"})["state"] == "PENDING"
    pushes = [m for c, m in messages if m[0] == Kind.PUSH]
    assert pushes == [[Kind.PUSH, Push.LEASE_LOST, {"lease": running["lease"],
                                                     "reason": "cancelled"}]]


def test_cancel_rest_does_nothing_when_the_need_is_unreachable(core: CoreDriver) -> None:
    submit(core, 0)
    submit(core, 1)
    reply = wait(core, next_rid(), need=3, cancel_rest=True)
    assert reply["reached"] is False
    assert status(core)["counts"] == {"PENDING": 2}


# ---- counts ----------------------------------------------------------------------------


def test_group_status_counts_the_tasks_by_state_as_they_move(core: CoreDriver) -> None:
    for n in range(4):
        submit(core, n)
    assert status(core) == {"group": "g", "tasks": 4, "counts": {"PENDING": 4},
                            "succeeded": 0, "unfinished": 4, "waiters": 0}
    deliver(core, conn=ALICE)
    complete(core, 1)
    reject(core)
    assert status(core)["counts"] == {"RUNNING": 1, "SUCCEEDED": 1, "FAILED": 1, "PENDING": 1}
    assert status(core, "nothing")["tasks"] == 0


def test_a_task_keeps_its_group_and_a_resubmit_naming_another_is_a_conflict(
    core: CoreDriver,
) -> None:
    submit(core, 0)
    assert core.call(Op.TASK_STATUS, {"scope": RUN, "task": "t-1"})["group"] == "g"
    again = core.call(Op.TASK_SUBMIT, {"scope": RUN, "mailbox": "jobs", "data": 0, "key": "k0"})
    assert again["created"] is False  # no group named: joins the task as it is
    error = core.refused(Op.TASK_SUBMIT, {"scope": RUN, "mailbox": "jobs", "data": 0,
                                          "key": "k0", "group": "h"})
    assert error.code == ErrorCode.IDEMPOTENCY_CONFLICT and "group 'g'" in error.message
    assert status(core)["tasks"] == 1


# ---- bounds ----------------------------------------------------------------------------


def test_group_names_and_needs_are_validated_naming_the_limit(core: CoreDriver) -> None:
    long_name = "x" * (Limits.MAX_GROUP_NAME_BYTES + 1)
    error = core.refused(Op.TASK_SUBMIT, {"scope": RUN, "mailbox": "jobs", "data": 1,
                                          "group": long_name})
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert str(Limits.MAX_GROUP_NAME_BYTES) in error.message
    for bad in (0, -1, Limits.MAX_GROUP_TASKS + 1, 1.5, "2"):
        error = core.refused(Op.GROUP_WAIT, {"scope": RUN, "group": "g", "need": bad})
        assert error.code == ErrorCode.INVALID_ARGUMENT
    error = core.refused(Op.GROUP_WAIT, {"scope": "never-made", "group": "g"})
    assert error.code == ErrorCode.NOT_FOUND


def test_a_group_holds_at_most_max_group_tasks(
    core: CoreDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Limits, "MAX_GROUP_TASKS", 3)
    for n in range(3):
        submit(core, n)
    with pytest.raises(CoreError) as info:
        submit(core, 3)
    assert info.value.code == ErrorCode.RESOURCE_EXHAUSTED
    assert "3 tasks, the limit" in info.value.message
    assert status(core)["tasks"] == 3
    submit(core, 3, group="another")  # other groups are not affected


def test_a_group_holds_at_most_max_waiters_per_group(
    core: CoreDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Limits, "MAX_WAITERS_PER_GROUP", 2)
    submit(core, 0)
    assert wait(core, next_rid(), need=1) is DEFERRED
    assert wait(core, next_rid(), need=1) is DEFERRED
    error = core.refused(Op.GROUP_WAIT, {"scope": RUN, "group": "g", "need": 1})
    assert error.code == ErrorCode.RESOURCE_EXHAUSTED and "2 waiters" in error.message


def test_a_group_wait_is_withdrawn_by_cancel_timeout_and_disconnect(core: CoreDriver) -> None:
    submit(core, 0)
    rid = next_rid()
    assert wait(core, rid, need=1, timeout_ms=60_000) is DEFERRED
    assert core.call(Op.CANCEL, {"request": rid}) == {"cancelled": True}
    timed = next_rid()
    assert wait(core, timed, need=1, timeout_ms=1_000) is DEFERRED
    core.drain()
    core.advance(1.5)
    [(conn, message)] = core.drain()
    assert conn == ALICE
    assert message[:3] == [Kind.ERROR, timed, ErrorCode.WAIT_TIMEOUT]
    assert "0 of the 1 successes" in message[3]
    assert wait(core, next_rid(), need=1) is DEFERRED
    core.disconnected(ALICE)
    assert core.waits.total() == 0 and status(core)["waiters"] == 0
    complete(core, "late")  # answers nobody
    assert [m for c, m in core.drain() if c == ALICE] == []


def test_a_success_costs_the_same_whatever_the_number_of_waiters_on_other_needs(
    core: CoreDriver,
) -> None:
    """Waiters are kept by need: a success touches only the line of the need it meets."""
    for n in range(50):
        submit(core, n)
    for need in range(2, 50):
        assert wait(core, next_rid(), need=need) is DEFERRED
    group = core.scopes[("default", RUN)].groups["g"]
    assert len(group.waiters) == 48
    complete(core, "a")
    assert replies(core.drain()) == {}
    complete(core, "b")
    assert len(replies(core.drain())) == 1 and len(group.waiters) == 47


# ---- recovery --------------------------------------------------------------------------


def test_groups_and_their_counts_are_rebuilt_from_the_journal_and_from_a_snapshot(
    core: CoreDriver,
) -> None:
    for n in range(4):
        submit(core, n)
    complete(core, "a")
    reject(core)
    deliver(core, conn=ALICE)
    core.drain()
    before = status(core)
    replayed = core.replay()
    assert replayed.call(Op.GROUP_STATUS, {"scope": RUN, "group": "g"}) == before
    snapshot = list(core.snapshot())
    rebuilt = core.replay(snapshot)
    assert rebuilt.call(Op.GROUP_STATUS, {"scope": RUN, "group": "g"}) == before
    assert rebuilt.call(Op.SCOPE_STATUS, {"scope": RUN})["tasks"] == before["counts"]
    reply = rebuilt.call(Op.GROUP_WAIT, {"scope": RUN, "group": "g", "need": 1})
    assert reply["done"] == [{"id": "t-1", "key": "k0", "outcome": "a"}]


def test_a_group_is_forgotten_with_its_last_task(core: CoreDriver) -> None:
    submit(core, 0)
    complete(core, 1)
    core.drain()
    core.advance(core.work.retention_seconds + core.work.tombstone_seconds + 10)
    assert core.scopes[("default", RUN)].groups == {}
    assert status(core)["tasks"] == 0
    assert core.call(Op.SCOPE_STATUS, {"scope": RUN})["tasks"] == {}
