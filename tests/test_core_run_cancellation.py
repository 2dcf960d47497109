"""Whole run cancellation and run status in the pure core, on a fake clock.

Each test is named after the rule it protects: cancelling a run ends everything it
holds or waits on (tasks, result waiters, deliveries and their settlements, claims,
pool slots, claim/pool/quota waiters, consumers), grants the slots it freed to other
runs' waiters, refuses new work; SCOPE_STATUS reports from counters; all of it is
rebuilt by recovery.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CAROL, DAVE, CoreDriver, next_rid

from rsd.core import DEFERRED
from rsproto import ErrorCode, Kind, Op, Push

RUN = "scope-1"
OTHER = "scope-2"


@pytest.fixture
def core() -> CoreDriver:
    core = CoreDriver()
    assert core.call(Op.SCOPE_CREATE, {})["scope"] == RUN
    assert core.call(Op.SCOPE_CREATE, {})["scope"] == OTHER
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    core.call(Op.QUOTA_ENSURE, {"name": "api", "limit": 1, "per_seconds": 100})
    core.drain()
    return core


def submit(core: CoreDriver, n: int, scope: str = RUN) -> str:
    args = {"scope": scope, "mailbox": "jobs", "data": n}
    return core.call(Op.TASK_SUBMIT, args)["id"]


def run_status(core: CoreDriver, scope: str = RUN) -> dict[str, Any]:
    return core.call(Op.SCOPE_STATUS, {"scope": scope})


def cancel(core: CoreDriver, reason: str = "stop") -> dict[str, Any]:
    return core.call(Op.SCOPE_CANCEL, {"scope": RUN, "reason": reason})


def by_rid(messages: list[Any]) -> dict[int, Any]:
    return {m[1]: m for _, m in messages if m[0] in (Kind.REPLY, Kind.ERROR)}


def test_run_status_counts_tasks_by_state_claims_and_slots_held(core: CoreDriver) -> None:
    assert run_status(core) == {
        "scope": RUN, "state": "open", "reason": None, "created_at": pytest.approx(core.wall(0)),
        "tasks": {}, "claims": 0, "slots": 0,
    }
    for n in range(3):
        submit(core, n)
    submit(core, 9, scope=OTHER)
    delivery = core.call(Op.RECEIVE, {"scope": RUN, "mailbox": "jobs"}, BOB)["delivery"]
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": 1}, BOB)
    core.call(Op.RECEIVE, {"scope": RUN, "mailbox": "jobs"}, BOB)
    core.call(Op.CLAIM_ACQUIRE, {"scope": RUN, "key": "a"})
    core.call(Op.CLAIM_ACQUIRE, {"scope": RUN, "key": "b"})
    core.call(Op.POOL_ACQUIRE, {"scope": RUN, "pool": "gpu"})
    status = run_status(core)
    assert status["tasks"] == {"SUCCEEDED": 1, "RUNNING": 1, "PENDING": 1}
    assert (status["claims"], status["slots"]) == (2, 1)
    assert run_status(core, OTHER)["tasks"] == {"PENDING": 1}
    assert core.refused(Op.SCOPE_STATUS, {"scope": "never-made"}).code == ErrorCode.NOT_FOUND


def test_another_tenants_run_has_no_status(core: CoreDriver) -> None:
    other = CoreDriver(tenants={BOB: ("acme", False)})
    other.call(Op.SCOPE_CREATE, {})
    assert other.refused(Op.SCOPE_STATUS, {"scope": "scope-1"}, BOB).code == ErrorCode.NOT_FOUND


def test_cancelling_a_run_ends_its_tasks_and_tells_result_waiters_and_workers(
    core: CoreDriver,
) -> None:
    running = submit(core, 1)
    pending = submit(core, 2)
    delivery = core.call(Op.RECEIVE, {"scope": RUN, "mailbox": "jobs"}, BOB)["delivery"]
    waiter = next_rid()
    core.call(Op.TASK_RESULT, {"scope": RUN, "task": pending, "timeout_ms": 60_000},
              CAROL, rid=waiter)
    core.drain()
    reply = cancel(core, "user abort")
    assert reply == {"scope": RUN, "cancelled": True, "tasks": 2, "claims": 0, "slots": 0}
    messages = core.drain()
    assert (BOB, [Kind.PUSH, Push.LEASE_LOST, {"lease": delivery["lease"],
                                                "reason": "scope cancelled"}]) in messages
    answer = by_rid(messages)[waiter]
    assert answer[2]["state"] == "CANCELLED" and "user abort" in answer[2]["reason"]
    error = core.refused(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]}, BOB)
    assert error.code == ErrorCode.SCOPE_CANCELLED and "user abort" in error.message
    status = run_status(core)
    assert (status["state"], status["reason"]) == ("cancelled", "user abort")
    assert status["tasks"] == {"CANCELLED": 2}
    assert core.call(Op.TASK_STATUS, {"scope": RUN, "task": running})["state"] == "CANCELLED"
    # After what would have been the lease, the handle is simply stale.
    core.advance(delivery["lease_seconds"] + 1)
    error = core.refused(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]}, BOB)
    assert error.code == ErrorCode.STALE_CLAIM
    assert core.deliveries.cancelled == {}


def test_cancelling_a_run_frees_its_pool_slots_to_other_runs_waiters_and_refuses_its_own(
    core: CoreDriver,
) -> None:
    held = core.call(Op.POOL_ACQUIRE, {"scope": RUN, "pool": "gpu"}, ALICE)
    own_waiter, other_waiter = next_rid(), next_rid()
    args = {"pool": "gpu", "wait": True, "timeout_ms": 60_000}
    assert core.call(Op.POOL_ACQUIRE, {"scope": RUN, **args}, BOB, rid=own_waiter) is DEFERRED
    assert core.call(Op.POOL_ACQUIRE, {"scope": OTHER, **args}, CAROL,
                     rid=other_waiter) is DEFERRED
    core.drain()
    assert cancel(core)["slots"] == 1
    messages = core.drain()
    got = by_rid(messages)
    assert got[own_waiter][:3] == [Kind.ERROR, own_waiter, ErrorCode.SCOPE_CANCELLED]
    assert got[other_waiter][0] == Kind.REPLY and "lease" in got[other_waiter][2]
    assert (ALICE, [Kind.PUSH, Push.LEASE_LOST, {"lease": held["lease"],
                                                  "reason": "scope cancelled"}]) in messages
    inspect = core.call(Op.POOL_INSPECT, {"name": "gpu"})
    assert [h["run"] for h in inspect["holders"]] == [OTHER]
    assert run_status(core)["slots"] == 0 and run_status(core, OTHER)["slots"] == 1
    assert core.refused(Op.POOL_RELEASE, {"lease": held["lease"]}).code == ErrorCode.STALE_CLAIM


def test_cancelling_a_run_ends_its_quota_and_claim_waiters_and_releases_its_claims(
    core: CoreDriver,
) -> None:
    core.call(Op.QUOTA_TAKE, {"scope": OTHER, "quota": "api"})  # empty now
    quota_waiter, other_quota_waiter, claim_waiter = next_rid(), next_rid(), next_rid()
    args = {"quota": "api", "wait": True, "timeout_ms": 600_000}
    assert core.call(Op.QUOTA_TAKE, {"scope": RUN, **args}, BOB, rid=quota_waiter) is DEFERRED
    assert core.call(Op.QUOTA_TAKE, {"scope": OTHER, **args}, DAVE,
                     rid=other_quota_waiter) is DEFERRED
    core.call(Op.CLAIM_ACQUIRE, {"scope": RUN, "key": "k"}, ALICE)
    assert core.call(Op.CLAIM_ACQUIRE, {"scope": RUN, "key": "k", "wait": True}, CAROL,
                     rid=claim_waiter) is DEFERRED
    core.drain()
    assert cancel(core)["claims"] == 1
    got = by_rid(core.drain())
    assert got[quota_waiter][2] == ErrorCode.SCOPE_CANCELLED
    assert got[claim_waiter][2] == ErrorCode.SCOPE_CANCELLED
    assert other_quota_waiter not in got  # another run's wait goes on
    assert core.call(Op.QUOTA_INSPECT, {"name": "api"})["waiters"] == 1
    assert run_status(core)["claims"] == 0
    assert core.scopes[("default", RUN)].parked == {}
    core.advance(101)
    assert by_rid(core.drain())[other_quota_waiter][0] == Kind.REPLY


def test_a_cancelled_run_refuses_new_work_of_every_kind(core: CoreDriver) -> None:
    cancel(core, "done")
    refusals = [
        (Op.TASK_SUBMIT, {"scope": RUN, "mailbox": "jobs", "data": 1}),
        (Op.MESSAGE_SEND, {"scope": RUN, "mailbox": "jobs", "data": 1}),
        (Op.CLAIM_ACQUIRE, {"scope": RUN, "key": "k"}),
        (Op.POOL_ACQUIRE, {"scope": RUN, "pool": "gpu"}),
        (Op.QUOTA_TAKE, {"scope": RUN, "quota": "api"}),
        (Op.RECEIVE, {"scope": RUN, "mailbox": "jobs", "wait": True}),
    ]
    for op, args in refusals:
        error = core.refused(op, args)
        assert error.code == ErrorCode.SCOPE_CANCELLED, op
        assert "done" in error.message
    assert run_status(core)["state"] == "cancelled"


def test_parked_consumers_of_a_cancelled_run_end_with_scope_cancelled(core: CoreDriver) -> None:
    rid = next_rid()
    args = {"scope": RUN, "mailbox": "jobs", "wait": True, "timeout_ms": 60_000}
    assert core.call(Op.RECEIVE, args, BOB, rid=rid) is DEFERRED
    core.drain()
    cancel(core)
    assert by_rid(core.drain())[rid][:3] == [Kind.ERROR, rid, ErrorCode.SCOPE_CANCELLED]


def test_a_served_or_withdrawn_pool_wait_leaves_its_run(core: CoreDriver) -> None:
    """The run's list of parked waits follows the waits: memory does not grow."""
    held = core.call(Op.POOL_ACQUIRE, {"scope": OTHER, "pool": "gpu"})
    scope = core.scopes[("default", RUN)]
    for _ in range(100):
        rid = next_rid()
        core.call(Op.POOL_ACQUIRE, {"scope": RUN, "pool": "gpu", "wait": True}, BOB, rid=rid)
        assert len(scope.parked) == 1
        core.call(Op.CANCEL, {"request": rid}, BOB)
        assert scope.parked == {}
    core.call(Op.POOL_ACQUIRE, {"scope": RUN, "pool": "gpu", "wait": True}, BOB)
    core.call(Op.POOL_RELEASE, {"lease": held["lease"]})
    assert scope.parked == {} and run_status(core)["slots"] == 1


def test_run_status_and_cancellation_are_rebuilt_by_recovery(core: CoreDriver) -> None:
    submit(core, 1)
    submit(core, 2)
    core.call(Op.RECEIVE, {"scope": RUN, "mailbox": "jobs"}, BOB)
    core.call(Op.POOL_ACQUIRE, {"scope": RUN, "pool": "gpu"})
    core.call(Op.CLAIM_ACQUIRE, {"scope": RUN, "key": "k"})
    submit(core, 3, scope=OTHER)
    core.call(Op.CLAIM_ACQUIRE, {"scope": OTHER, "key": "k"})
    core.drain()
    open_before = run_status(core)
    assert open_before["tasks"] == {"RUNNING": 1, "PENDING": 1}
    assert core.replay().call(Op.SCOPE_STATUS, {"scope": RUN}) == open_before
    assert core.replay(list(core.snapshot())).call(Op.SCOPE_STATUS, {"scope": RUN}) == open_before
    cancel(core, "enough")
    core.drain()
    before = [run_status(core), run_status(core, OTHER)]
    assert before[0]["tasks"] == {"CANCELLED": 2} and before[0]["slots"] == 0
    for rebuilt in (core.replay(), core.replay(list(core.snapshot()))):
        assert [rebuilt.call(Op.SCOPE_STATUS, {"scope": s}) for s in (RUN, OTHER)] == before
        error = rebuilt.refused(Op.TASK_SUBMIT, {"scope": RUN, "mailbox": "jobs", "data": 1})
        assert error.code == ErrorCode.SCOPE_CANCELLED


def test_pool_and_quota_waits_on_made_up_runs_are_not_found_and_leave_no_run_behind(
    core: CoreDriver,
) -> None:
    """A pool acquire or quota take naming a run never created is NOT_FOUND, waiting or
    not, and leaves nothing: made-up run ids cannot fill the run table or park waits."""
    core.call(Op.POOL_ACQUIRE, {"scope": OTHER, "pool": "gpu"})
    core.call(Op.QUOTA_TAKE, {"scope": OTHER, "quota": "api"})
    before = len(core.scopes)
    for n in range(200):
        run = f"made-up-{n}"
        for args in (
            {"scope": run, "pool": "gpu"},
            {"scope": run, "pool": "gpu", "wait": True},
        ):
            assert core.refused(Op.POOL_ACQUIRE, args).code == ErrorCode.NOT_FOUND
        assert core.refused(
            Op.QUOTA_TAKE, {"scope": run, "quota": "api", "wait": True}, BOB
        ).code == ErrorCode.NOT_FOUND
    assert len(core.scopes) == before
    assert core.call(Op.POOL_INSPECT, {"name": "gpu"})["waiters"] == 0
    assert core.call(Op.QUOTA_INSPECT, {"name": "api"})["waiters"] == 0
