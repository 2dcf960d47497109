"""Shared tasks in the pure core, driven by a fake clock: ``now`` is a float we pass in.

Submit and its idempotency, status, result waits, join/detach, cancel, deadlines,
retention, run cancellation and the state table. The core is a
``CoreDriver`` (support/core.py): connections 1..4 said HELLO as alice, bob, carol and
dave, the mailbox "jobs" exists with default settings, and the core's wall clock is
``now + WALL``. Every test starts from a fresh core; nothing sleeps.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.build import compiled
from support.core import ALICE, BOB, CAROL, WALL, CoreDriver, call, refused

from rsd.core import DEFERRED, Core, Rec
from rsd.core.run.items import TERMINAL, TRANSITIONS, State, transition
from rsd.core.work import debounce as debounce_module
from rsd.core.work import deliveries as deliveries_module
from rsd.core.work import endings as endings_module
from rsd.core.work import parents as parents_module
from rsd.core.work import settlement as settlement_module
from rsd.core.work import waiting as waiting_module
from rsproto import ErrorCode, Kind, Limits, Op, Push

RETENTION = 100.0

# The runs these tests name, created by the driver at setup (SCOPE_CREATE, chosen ids).
RUNS = ("s", "s1", "s2", "other")


def make_core(ensure: bool = True, **options: Any) -> CoreDriver:
    """A driver with this file's default options (and ``RUNS``); the mailbox "jobs"
    unless not ensure."""
    options.setdefault("retention_seconds", RETENTION)
    options.setdefault("runs", RUNS)
    return CoreDriver(mailbox="jobs" if ensure else None, **options)


@pytest.fixture
def core() -> CoreDriver:
    return make_core()


def submit_args(
    data: Any = None, key: str | None = None, scope: str = "s", mailbox: str = "jobs", **extra: Any
) -> dict[str, Any]:
    args = {"scope": scope, "mailbox": mailbox, "data": data, **extra}
    if key is not None:
        args["key"] = key
    return args


def submit(
    core: Core, now: float, data: Any = None, key: str | None = None, scope: str = "s", **extra: Any
) -> dict[str, Any]:
    return call(core, now, Op.TASK_SUBMIT, submit_args(data, key, scope, **extra))


def receive(core: Core, now: float, conn: int = ALICE, scope: str = "s", **extra: Any) -> Any:
    """The delivery (or None); DEFERRED if the receive parked."""
    reply = call(core, now, Op.RECEIVE, {"scope": scope, "mailbox": "jobs", **extra}, conn)
    return reply if reply is DEFERRED else reply["delivery"]


def complete(core: Core, now: float, lease: int, outcome: Any = None) -> Any:
    return call(core, now, Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": outcome})


def reject(core: Core, now: float, lease: int, reason: str | None = None) -> Any:
    return call(core, now, Op.DELIVERY_REJECT, {"lease": lease, "reason": reason})


def status(core: Core, task: str, scope: str = "s") -> dict[str, Any]:
    return call(core, 0.0, Op.TASK_STATUS, {"scope": scope, "task": task})


def result(
    core: Core,
    now: float,
    task: str,
    conn: int = ALICE,
    rid: int | None = None,
    scope: str = "s",
    **extra: Any,
) -> Any:
    return call(core, now, Op.TASK_RESULT, {"scope": scope, "task": task, **extra}, conn, rid)


def cancel_task(core: Core, now: float, task: str, **extra: Any) -> dict[str, Any]:
    return call(core, now, Op.TASK_CANCEL, {"scope": "s", "task": task, **extra})


def cancel_scope(core: Core, now: float, scope: str = "s", **extra: Any) -> dict[str, Any]:
    return call(core, now, Op.SCOPE_CANCEL, {"scope": scope, **extra})


def renew(core: Core, now: float, leases: list[Any], conn: int = ALICE) -> list[Any]:
    return call(core, now, Op.LEASE_RENEW, {"leases": leases}, conn)["results"]


def lease_lost(lease: int, reason: str) -> list[Any]:
    return [Kind.PUSH, int(Push.LEASE_LOST), {"lease": lease, "reason": reason}]


def running_task(core: Core, now: float = 0.0, **extra: Any) -> tuple[str, int]:
    """A task delivered to alice: (task id, lease)."""
    task = submit(core, now, {"n": 1}, **extra)["id"]
    delivery = receive(core, now)
    assert delivery["id"] == task
    return task, delivery["lease"]


# ---- submit ----------------------------------------------------------------------------


def test_submit_creates_a_pending_task_at_attempt_zero(core: Core) -> None:
    reply = submit(core, 2.0, {"n": 1}, key="k")
    assert reply == {
        "id": reply["id"],
        "scope": "s",
        "mailbox": "jobs",
        "key": "k",
        "state": "PENDING",
        "attempt": 0,
        "outcome": None,
        "reason": None,
        "tombstoned": False,
        "subscribers": [],
        "created_at": WALL + 2.0,
        "finished_at": None,
        "deadline": None,
        "not_before": None,
        "priority": 0,
        "fairness_key": None,
        "created": True,
    }
    assert type(reply["id"]) is str


def test_submit_with_same_key_and_input_in_other_map_order_returns_the_same_task(
    core: Core,
) -> None:
    first = submit(core, 0.0, {"a": 1, "b": {"x": 1, "y": [1, {"p": 1, "q": 2}]}}, key="k")
    again = submit(core, 1.0, {"b": {"y": [1, {"q": 2, "p": 1}], "x": 1}, "a": 1}, key="k")
    assert again["id"] == first["id"]
    assert again["created"] is False


def test_repeated_submit_writes_no_record_and_queues_nothing(core: Core) -> None:
    submit(core, 0.0, {"n": 1}, key="k")
    core.drain()
    submit(core, 1.0, {"n": 1}, key="k")
    assert core.effects.take_records() == []
    assert call(core, 1.0, Op.QUEUE_INSPECT, {"scope": "s", "mailbox": "jobs"})["ready"] == 1


def _drive(core: Core, task: str, state: str) -> None:
    """Bring the freshly submitted ``task`` to ``state`` (all done by t=1)."""
    if state == "PENDING":
        return
    if state == "CANCELLED":
        cancel_task(core, 1.0, task)
        return
    delivery = receive(core, 1.0)
    assert delivery["id"] == task
    if state == "SUCCEEDED":
        complete(core, 1.0, delivery["lease"], {"ok": True})
    elif state == "FAILED":
        reject(core, 1.0, delivery["lease"], "no")


@pytest.mark.parametrize(
    ("state", "tombstoned"),
    [
        ("PENDING", False),
        ("RUNNING", False),
        ("SUCCEEDED", False),
        ("FAILED", False),
        ("CANCELLED", False),
        ("SUCCEEDED", True),
    ],
)
def test_submit_with_same_key_and_input_returns_the_existing_task_in_every_state(
    core: Core, state: str, tombstoned: bool
) -> None:
    task = submit(core, 0.0, {"a": 1, "b": 2}, key="k")["id"]
    _drive(core, task, state)
    now = 1.0 + RETENTION + 1.0 if tombstoned else 2.0
    core.tick(now)
    again = submit(core, now, {"b": 2, "a": 1}, key="k")
    assert (again["id"], again["created"]) == (task, False)
    assert (again["state"], again["tombstoned"]) == (state, tombstoned)


def test_submit_with_same_key_and_other_input_is_idempotency_conflict_naming_the_task(
    core: Core,
) -> None:
    task = submit(core, 0.0, {"n": 1}, key="k")["id"]
    error = refused(core, 1.0, Op.TASK_SUBMIT, submit_args({"n": 2}, "k"))
    assert error.code == ErrorCode.IDEMPOTENCY_CONFLICT
    assert error.details == {"task": task}


def test_conflicting_submit_writes_no_record_and_keeps_the_task(core: Core) -> None:
    task = submit(core, 0.0, {"n": 1}, key="k")["id"]
    core.drain()
    refused(core, 1.0, Op.TASK_SUBMIT, submit_args({"n": 2}, "k"))
    assert core.effects.take_records() == []
    assert receive(core, 1.0)["data"] == {"n": 1}
    assert receive(core, 1.0) is None
    assert status(core, task)["state"] == "RUNNING"


def test_submit_with_same_key_to_another_mailbox_is_idempotency_conflict(core: Core) -> None:
    call(core, 0.0, Op.MAILBOX_ENSURE, {"name": "other"})
    task = submit(core, 0.0, {"n": 1}, key="k")["id"]
    error = refused(core, 1.0, Op.TASK_SUBMIT, submit_args({"n": 1}, "k", mailbox="other"))
    assert error.code == ErrorCode.IDEMPOTENCY_CONFLICT
    assert error.details == {"task": task}


def test_submit_without_key_creates_a_fresh_task_each_time(core: Core) -> None:
    replies = [submit(core, 0.0, {"n": 1}) for _ in range(3)]
    assert len({reply["id"] for reply in replies}) == 3
    assert all(reply["created"] and reply["key"] is None for reply in replies)


def test_same_key_in_two_scopes_names_two_tasks(core: Core) -> None:
    first = submit(core, 0.0, {"n": 1}, key="k", scope="s1")
    second = submit(core, 0.0, {"n": 2}, key="k", scope="s2")
    assert first["id"] != second["id"]
    assert second["created"] is True


def test_submit_records_the_subscriber_id(core: Core) -> None:
    reply = submit(core, 0.0, {"n": 1}, key="k", subscriber_id="agent-1")
    assert reply["subscribers"] == ["agent-1"]
    assert (Rec.SUBSCRIBED, reply["id"], "agent-1", "s") in core.effects.take_records()


def test_repeated_submit_with_a_new_subscriber_id_joins_the_task(core: Core) -> None:
    submit(core, 0.0, {"n": 1}, key="k", subscriber_id="agent-1")
    again = submit(core, 1.0, {"n": 1}, key="k", subscriber_id="agent-2")
    assert again["subscribers"] == ["agent-1", "agent-2"]


def test_submit_without_data_is_invalid_argument(core: Core) -> None:
    error = refused(core, 0.0, Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "key": "k"})
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert "data" in error.message


def test_submit_with_nil_data_is_accepted(core: Core) -> None:
    task = submit(core, 0.0, None)["id"]
    assert receive(core, 0.0)["data"] is None
    assert status(core, task)["state"] == "RUNNING"


def test_submit_with_payload_over_the_limit_is_invalid_argument_naming_the_limit(
    core: Core,
) -> None:
    error = refused(core, 0.0, Op.TASK_SUBMIT, submit_args("x" * Limits.MAX_PAYLOAD_BYTES, "k"))
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert str(Limits.MAX_PAYLOAD_BYTES) in error.message
    assert core.effects.take_records() == []


def test_submit_with_payload_just_under_the_limit_is_accepted(core: Core) -> None:
    # msgpack str 32 header: 5 bytes.
    assert submit(core, 0.0, "x" * (Limits.MAX_PAYLOAD_BYTES - 5))["created"] is True


def test_submit_with_a_key_over_the_limit_is_invalid_argument(core: Core) -> None:
    error = refused(core, 0.0, Op.TASK_SUBMIT, submit_args(1, "k" * (Limits.MAX_KEY_BYTES + 1)))
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert "key" in error.message


def test_submit_with_a_key_at_the_limit_is_accepted(core: Core) -> None:
    assert submit(core, 0.0, 1, key="k" * Limits.MAX_KEY_BYTES)["created"] is True


# ---- status ----------------------------------------------------------------------------


def test_status_of_a_running_task_shows_state_attempt_key_and_subscribers(core: Core) -> None:
    task, _ = running_task(core, key="k", subscriber_id="agent-1")
    view = status(core, task)
    assert {
        name: view[name]
        for name in (
            "id",
            "state",
            "attempt",
            "outcome",
            "reason",
            "tombstoned",
            "key",
            "subscribers",
        )
    } == {
        "id": task,
        "state": "RUNNING",
        "attempt": 1,
        "outcome": None,
        "reason": None,
        "tombstoned": False,
        "key": "k",
        "subscribers": ["agent-1"],
    }


def test_status_of_an_unknown_id_is_not_found(core: Core) -> None:
    error = refused(core, 0.0, Op.TASK_STATUS, {"scope": "s", "task": "t-999"})
    assert error.code == ErrorCode.NOT_FOUND


def test_status_of_a_task_from_another_scope_is_not_found(core: Core) -> None:
    task = submit(core, 0.0, 1, scope="s1")["id"]
    error = refused(core, 0.0, Op.TASK_STATUS, {"scope": "s2", "task": task})
    assert error.code == ErrorCode.NOT_FOUND


def test_status_writes_no_records(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    core.drain()
    status(core, task)
    assert core.effects.take_records() == []


# ---- result ----------------------------------------------------------------------------


def test_result_of_a_finished_task_returns_its_view_at_once(core: Core) -> None:
    task, lease = running_task(core)
    complete(core, 1.0, lease, {"answer": 42})
    view = result(core, 2.0, task, timeout_ms=0)
    assert view["state"] == "SUCCEEDED"
    assert view["outcome"] == {"answer": 42}
    assert view["finished_at"] == WALL + 1.0


def test_result_with_timeout_zero_on_an_unfinished_task_is_wait_timeout_at_once(
    core: Core,
) -> None:
    task = submit(core, 0.0, 1)["id"]
    error = refused(core, 0.0, Op.TASK_RESULT, {"scope": "s", "task": task, "timeout_ms": 0})
    assert error.code == ErrorCode.WAIT_TIMEOUT
    assert core.effects.take_messages() == []


def test_result_on_an_unfinished_task_parks(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    assert result(core, 0.0, task, timeout_ms=10_000) is DEFERRED
    assert core.effects.take_messages() == []


def test_every_parked_result_waiter_gets_the_terminal_view_when_the_task_completes(
    core: Core,
) -> None:
    task, lease = running_task(core)
    for conn, rid in ((ALICE, 1), (BOB, 2), (CAROL, 3)):
        assert result(core, 0.0, task, conn=conn, rid=rid, timeout_ms=10_000) is DEFERRED
    complete(core, 1.0, lease, "done")
    view = status(core, task)
    assert view["state"] == "SUCCEEDED" and view["outcome"] == "done"
    assert core.effects.take_messages() == [
        (ALICE, [Kind.REPLY, 1, view]),
        (BOB, [Kind.REPLY, 2, view]),
        (CAROL, [Kind.REPLY, 3, view]),
    ]


def test_parked_result_waiter_gets_the_failed_view_when_the_task_is_rejected(
    core: Core,
) -> None:
    task, lease = running_task(core)
    result(core, 0.0, task, conn=BOB, rid=7, timeout_ms=10_000)
    reject(core, 1.0, lease, "bad input")
    [(conn, message)] = core.effects.take_messages()
    assert (conn, message[:2]) == (BOB, [Kind.REPLY, 7])
    assert (message[2]["state"], message[2]["reason"]) == ("FAILED", "rejected: bad input")


def test_parked_result_is_wait_timeout_at_its_deadline_not_before(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    result(core, 0.0, task, conn=BOB, rid=7, timeout_ms=2_000)
    core.tick(2.0 - 0.01)
    assert core.effects.take_messages() == []
    core.tick(2.0 + 0.01)
    [(conn, message)] = core.effects.take_messages()
    assert conn == BOB
    assert message[:3] == [Kind.ERROR, 7, "WAIT_TIMEOUT"]


def test_result_timeout_leaves_the_task_unaffected(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    result(core, 0.0, task, rid=7, timeout_ms=1_000)
    core.tick(1.01)
    assert status(core, task)["state"] == "PENDING"
    assert receive(core, 2.0)["id"] == task


def test_timed_out_result_waiter_gets_no_reply_when_the_task_completes_later(
    core: Core,
) -> None:
    task, lease = running_task(core)
    result(core, 0.0, task, rid=7, timeout_ms=1_000)
    core.tick(1.01)
    core.drain()
    complete(core, 2.0, lease)
    assert core.effects.take_messages() == []


# ---- join and detach -------------------------------------------------------------------


def test_join_adds_a_subscriber_with_its_scope(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    core.drain()
    view = call(
        core,
        0.0,
        Op.TASK_JOIN,
        {
            "scope": "s",
            "task": task,
            "subscriber_id": "agent-2",
            "subscriber_scope": "parent",
        },
    )
    assert view["subscribers"] == ["agent-2"]
    assert core.effects.take_records() == [(Rec.SUBSCRIBED, task, "agent-2", "parent")]


def test_join_again_with_the_same_scope_writes_no_record(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    args = {"scope": "s", "task": task, "subscriber_id": "agent-2", "subscriber_scope": "p"}
    call(core, 0.0, Op.TASK_JOIN, args)
    core.drain()
    assert call(core, 0.0, Op.TASK_JOIN, args)["subscribers"] == ["agent-2"]
    assert core.effects.take_records() == []


def test_detach_removes_the_subscriber(core: Core) -> None:
    task = submit(core, 0.0, 1, subscriber_id="agent-1")["id"]
    call(core, 0.0, Op.TASK_JOIN, {"scope": "s", "task": task, "subscriber_id": "agent-2"})
    view = call(
        core,
        0.0,
        Op.TASK_DETACH,
        {
            "scope": "s",
            "task": task,
            "subscriber_id": "agent-1",
        },
    )
    assert view["subscribers"] == ["agent-2"]


def test_detach_of_a_non_subscriber_changes_nothing(core: Core) -> None:
    task = submit(core, 0.0, 1, subscriber_id="agent-1")["id"]
    core.drain()
    view = call(core, 0.0, Op.TASK_DETACH, {"scope": "s", "task": task, "subscriber_id": "x"})
    assert view["subscribers"] == ["agent-1"]
    assert core.effects.take_records() == []


def test_task_with_zero_subscribers_is_still_delivered_and_completes(core: Core) -> None:
    task = submit(core, 0.0, 1, subscriber_id="agent-1")["id"]
    view = call(
        core,
        0.0,
        Op.TASK_DETACH,
        {
            "scope": "s",
            "task": task,
            "subscriber_id": "agent-1",
        },
    )
    assert (view["subscribers"], view["state"]) == ([], "PENDING")
    delivery = receive(core, 1.0)
    assert delivery["id"] == task
    complete(core, 2.0, delivery["lease"], "done")
    assert (status(core, task)["state"], status(core, task)["outcome"]) == ("SUCCEEDED", "done")


def test_join_of_an_unknown_task_is_not_found(core: Core) -> None:
    error = refused(
        core,
        0.0,
        Op.TASK_JOIN,
        {
            "scope": "s",
            "task": "t-404",
            "subscriber_id": "agent-1",
        },
    )
    assert error.code == ErrorCode.NOT_FOUND


# ---- cancel ----------------------------------------------------------------------------


def test_cancel_of_a_pending_task_makes_it_cancelled_with_the_reason(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    view = cancel_task(core, 3.0, task, reason="not needed")
    assert (view["state"], view["reason"]) == ("CANCELLED", "not needed")
    assert view["finished_at"] == WALL + 3.0


def test_cancel_without_reason_gives_reason_cancelled(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    assert cancel_task(core, 0.0, task)["reason"] == "cancelled"


def test_cancelled_task_is_not_delivered(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    cancel_task(core, 0.0, task)
    assert receive(core, 1.0) is None


def test_cancel_of_a_running_task_pushes_lease_lost_to_the_worker(core: Core) -> None:
    task, lease = running_task(core)
    core.drain()
    cancel_task(core, 1.0, task)
    assert core.effects.take_messages() == [(ALICE, lease_lost(lease, "cancelled"))]


def test_complete_after_cancel_is_stale_claim_and_the_task_stays_cancelled(
    core: Core,
) -> None:
    task, lease = running_task(core)
    cancel_task(core, 1.0, task, reason="stop")
    error = refused(core, 2.0, Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": 1})
    assert error.code == ErrorCode.STALE_CLAIM
    view = status(core, task)
    assert (view["state"], view["outcome"], view["reason"]) == ("CANCELLED", None, "stop")


def test_cancel_of_a_finished_task_changes_nothing(core: Core) -> None:
    task, lease = running_task(core)
    complete(core, 1.0, lease, "done")
    before = status(core, task)
    core.drain()
    assert cancel_task(core, 2.0, task, reason="late") == before
    assert (core.effects.take_records(), core.effects.take_messages()) == ([], [])


def test_cancel_replies_the_cancelled_view_to_result_waiters(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    result(core, 0.0, task, conn=BOB, rid=9, timeout_ms=10_000)
    view = cancel_task(core, 1.0, task)
    assert core.effects.take_messages() == [(BOB, [Kind.REPLY, 9, view])]


# ---- deadline --------------------------------------------------------------------------


def test_task_is_pending_just_before_its_deadline(core: Core) -> None:
    task = submit(core, 0.0, 1, deadline=WALL + 10.0)["id"]
    core.tick(10.0 - 0.01)
    assert status(core, task)["state"] == "PENDING"


def test_task_expires_at_its_deadline(core: Core) -> None:
    task = submit(core, 0.0, 1, deadline=WALL + 10.0)["id"]
    core.tick(10.0 + 0.01)
    view = status(core, task)
    assert view["state"] == "EXPIRED"
    assert "deadline" in view["reason"]
    assert view["deadline"] == WALL + 10.0


def test_expired_task_is_not_delivered(core: Core) -> None:
    submit(core, 0.0, 1, deadline=WALL + 10.0)
    core.tick(10.01)
    assert receive(core, 11.0) is None


def test_deadline_replies_the_expired_view_to_result_waiters(core: Core) -> None:
    task = submit(core, 0.0, 1, deadline=WALL + 10.0)["id"]
    result(core, 0.0, task, conn=BOB, rid=5, timeout_ms=60_000)
    core.tick(10.01)
    [(conn, message)] = core.effects.take_messages()
    assert (conn, message[:2]) == (BOB, [Kind.REPLY, 5])
    assert message[2]["state"] == "EXPIRED"


def test_deadline_tells_the_running_delivery_and_refuses_its_complete(core: Core) -> None:
    task, lease = running_task(core, deadline=WALL + 10.0)
    renew(core, 9.0, [lease])
    core.drain()
    core.tick(10.01)
    assert core.effects.take_messages() == [(ALICE, lease_lost(lease, "deadline"))]
    error = refused(core, 10.5, Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": 1})
    assert error.code == ErrorCode.STALE_CLAIM
    assert status(core, task)["state"] == "EXPIRED"


def test_task_finished_before_its_deadline_is_not_expired(core: Core) -> None:
    task, lease = running_task(core, deadline=WALL + 10.0)
    complete(core, 1.0, lease, "done")
    core.tick(10.01)
    assert status(core, task)["state"] == "SUCCEEDED"


def test_deadline_that_is_not_a_number_is_invalid_argument(core: Core) -> None:
    error = refused(core, 0.0, Op.TASK_SUBMIT, submit_args(1, deadline="tomorrow"))
    assert error.code == ErrorCode.INVALID_ARGUMENT


# ---- retention -------------------------------------------------------------------------


def test_finished_task_keeps_its_outcome_until_retention_passes(core: Core) -> None:
    task, lease = running_task(core)
    complete(core, 1.0, lease, {"answer": 42})
    core.tick(1.0 + RETENTION - 0.01)
    view = status(core, task)
    assert (view["outcome"], view["tombstoned"]) == ({"answer": 42}, False)


def test_after_retention_a_succeeded_task_is_a_tombstone_without_outcome(core: Core) -> None:
    task, lease = running_task(core)
    complete(core, 1.0, lease, {"answer": 42})
    core.tick(1.0 + RETENTION + 0.01)
    view = status(core, task)
    assert (view["state"], view["outcome"], view["tombstoned"]) == ("SUCCEEDED", None, True)
    assert view["finished_at"] == WALL + 1.0


def test_after_retention_a_failed_task_keeps_state_and_reason(core: Core) -> None:
    task, lease = running_task(core)
    reject(core, 1.0, lease, "bad")
    core.tick(1.0 + RETENTION + 0.01)
    view = status(core, task)
    assert (view["state"], view["reason"], view["tombstoned"]) == ("FAILED", "rejected: bad", True)


def test_tombstoning_records_tombstoned(core: Core) -> None:
    task, lease = running_task(core)
    complete(core, 1.0, lease)
    core.drain()
    core.tick(1.0 + RETENTION + 0.01)
    assert core.effects.take_records() == [(Rec.TOMBSTONED, task)]


def test_result_of_a_tombstoned_task_returns_the_tombstone(core: Core) -> None:
    task, lease = running_task(core)
    complete(core, 1.0, lease, "done")
    core.tick(1.0 + RETENTION + 0.01)
    view = result(core, 200.0, task, timeout_ms=0)
    assert (view["state"], view["tombstoned"], view["outcome"]) == ("SUCCEEDED", True, None)


def test_unfinished_task_is_never_tombstoned(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    core.tick(RETENTION * 3)
    assert status(core, task)["tombstoned"] is False


# ---- run cancellation ------------------------------------------------------------------


def test_scope_cancel_ends_unfinished_tasks_cancelled_with_a_reason_naming_it(
    core: Core,
) -> None:
    running, _ = running_task(core)
    pending = submit(core, 0.0, 1)["id"]
    reply = cancel_scope(core, 1.0, reason="user abort")
    assert reply == {"scope": "s", "cancelled": True, "tasks": 2, "claims": 0, "slots": 0}
    for task in (pending, running):
        view = status(core, task)
        assert view["state"] == "CANCELLED"
        assert "run cancelled" in view["reason"] and "user abort" in view["reason"]


def test_scope_cancel_leaves_finished_tasks_as_they_were(core: Core) -> None:
    task, lease = running_task(core)
    complete(core, 1.0, lease, "done")
    before = status(core, task)
    cancel_scope(core, 2.0)
    assert status(core, task) == before


def test_scope_cancel_ends_parked_receives_with_scope_cancelled(core: Core) -> None:
    assert receive(core, 0.0, conn=BOB, wait=True) is DEFERRED
    core.drain()
    cancel_scope(core, 1.0)
    [(conn, message)] = core.effects.take_messages()
    assert conn == BOB
    assert message[0] == Kind.ERROR and message[2] == "SCOPE_CANCELLED"
    assert call(core, 1.0, Op.QUEUE_INSPECT, {"scope": "s", "mailbox": "jobs"})["consumers"] == 0


def test_scope_cancel_ends_claim_waiters_with_scope_cancelled(core: Core) -> None:
    call(core, 0.0, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "c"}, ALICE)
    claim_args = {"scope": "s", "key": "c", "wait": True}
    assert call(core, 0.0, Op.CLAIM_ACQUIRE, claim_args, BOB, rid=44) is DEFERRED
    core.drain()
    cancel_scope(core, 1.0)
    errors = [(c, m) for c, m in core.effects.take_messages() if m[0] == Kind.ERROR]
    assert [(c, m[1], m[2]) for c, m in errors] == [(BOB, 44, "SCOPE_CANCELLED")]


def test_scope_cancel_pushes_lease_lost_for_held_claims(core: Core) -> None:
    lease = call(core, 0.0, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "c"}, CAROL)["lease"]
    core.drain()
    cancel_scope(core, 1.0)
    pushes = [(c, m) for c, m in core.effects.take_messages() if m[0] == Kind.PUSH]
    assert [(c, m[1], m[2]["lease"]) for c, m in pushes] == [(CAROL, int(Push.LEASE_LOST), lease)]


def test_scope_cancel_pushes_lease_lost_for_running_deliveries(core: Core) -> None:
    _, lease = running_task(core)
    core.drain()
    cancel_scope(core, 1.0)
    assert core.effects.take_messages() == [(ALICE, lease_lost(lease, "scope cancelled"))]
    error = refused(core, 2.0, Op.DELIVERY_COMPLETE, {"lease": lease})
    # The settlement is refused and names why: the run was cancelled (within what would
    # have been the lease; after it, STALE_CLAIM like any stale lease).
    assert error.code == ErrorCode.SCOPE_CANCELLED
    assert core.call(Op.TASK_STATUS, {"scope": "s", "task": "t-1"})["state"] == "CANCELLED"


def test_scope_cancel_replies_the_cancelled_view_to_result_waiters(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    result(core, 0.0, task, conn=BOB, rid=3, timeout_ms=10_000)
    core.drain()
    cancel_scope(core, 1.0)
    [(conn, message)] = core.effects.take_messages()
    assert (conn, message[:2], message[2]["state"]) == (BOB, [Kind.REPLY, 3], "CANCELLED")


@pytest.mark.parametrize(
    ("op", "args"),
    [
        (Op.TASK_SUBMIT, {"mailbox": "jobs", "data": 1}),
        (Op.TASK_SUBMIT, {"mailbox": "jobs", "data": 1, "key": "old"}),
        (Op.MESSAGE_SEND, {"mailbox": "jobs", "data": 1}),
        (Op.RECEIVE, {"mailbox": "jobs"}),
        (Op.CLAIM_ACQUIRE, {"key": "c"}),
    ],
    ids=["submit", "submit-existing-key", "send", "receive", "acquire"],
)
def test_new_work_in_a_cancelled_scope_is_scope_cancelled(
    core: Core, op: Op, args: dict[str, Any]
) -> None:
    submit(core, 0.0, 1, key="old")
    cancel_scope(core, 1.0)
    error = refused(core, 2.0, op, {"scope": "s", **args})
    assert error.code == ErrorCode.SCOPE_CANCELLED


def test_reads_still_work_in_a_cancelled_scope(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    cancel_scope(core, 1.0)
    assert status(core, task)["state"] == "CANCELLED"
    assert result(core, 2.0, task, timeout_ms=0)["state"] == "CANCELLED"
    counts = call(core, 2.0, Op.QUEUE_INSPECT, {"scope": "s", "mailbox": "jobs"})
    assert counts == {"ready": 0, "running": 0, "delayed": 0, "waiting": 0, "consumers": 0,
                      "dead_letters": 0, "paused": False, "blocked_by_parents": 0}


def test_scope_cancel_leaves_other_scopes_alone(core: Core) -> None:
    other = submit(core, 0.0, 1, scope="other")["id"]
    submit(core, 0.0, 1, scope="s")
    cancel_scope(core, 1.0)
    assert status(core, other, scope="other")["state"] == "PENDING"
    assert receive(core, 2.0, scope="other")["id"] == other
    assert submit(core, 2.0, 2, scope="other")["created"] is True


def test_cancelling_a_scope_twice_is_harmless(core: Core) -> None:
    task = submit(core, 0.0, 1)["id"]
    cancel_scope(core, 1.0, reason="first")
    before = status(core, task)
    core.drain()
    reply = cancel_scope(core, 2.0, reason="second")
    assert reply == {"scope": "s", "cancelled": True, "tasks": 0, "claims": 0, "slots": 0}
    assert (core.effects.take_records(), core.effects.take_messages()) == ([], [])
    assert status(core, task) == before


# ---- the state table -------------------------------------------------------------------

EVENTS = sorted({event for _, event in TRANSITIONS})


def test_transition_returns_the_table_entry_for_every_legal_move() -> None:
    for (state, event), target in TRANSITIONS.items():
        assert transition(state, event) is target


def test_transition_raises_on_every_illegal_move() -> None:
    for state in State:
        for event in EVENTS:
            if (state, event) in TRANSITIONS:
                continue
            with pytest.raises(AssertionError, match="illegal task transition"):
                transition(state, event)


def test_terminal_states_have_no_outgoing_moves() -> None:
    assert {State.SUCCEEDED, State.FAILED, State.CANCELLED, State.EXPIRED} == TERMINAL
    assert not [move for move in TRANSITIONS if move[0] in TERMINAL]


@pytest.mark.skipif(
    compiled(settlement_module), reason="compiled code calls transition directly: unpatchable"
)
def test_every_move_the_core_makes_is_in_the_table_and_every_entry_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    moves: list[tuple[State, str]] = []

    def recording(state: State, event: str) -> State:
        moves.append((state, event))
        return transition(state, event)

    monkeypatch.setattr(deliveries_module, "transition", recording)
    monkeypatch.setattr(settlement_module, "transition", recording)
    monkeypatch.setattr(endings_module, "transition", recording)
    monkeypatch.setattr(waiting_module, "transition", recording)
    monkeypatch.setattr(debounce_module, "transition", recording)
    monkeypatch.setattr(parents_module, "transition", recording)
    core = make_core()
    call(core, 0.0, Op.MAILBOX_ENSURE, {"name": "jobs", "max_attempts": 2})

    def deliver() -> int:
        return receive(core, 0.0, lease_seconds=5)["lease"]

    ids = [submit(core, 0.0, "complete")["id"]]
    complete(core, 0.0, deliver())
    ids.append(submit(core, 0.0, "retry, release, then reject")["id"])
    call(core, 0.0, Op.DELIVERY_RETRY, {"lease": deliver(), "delay_ms": 0})
    call(core, 0.0, Op.DELIVERY_RELEASE, {"lease": deliver()})
    reject(core, 0.0, deliver())
    ids.append(submit(core, 0.0, "expire twice")["id"])
    deliver()
    core.tick(5.01)
    receive(core, 5.01, lease_seconds=5)
    core.tick(10.02)  # second expiry: attempts exhausted
    ids.append(submit(core, 11.0, "cancel pending")["id"])
    cancel_task(core, 11.0, ids[-1])
    ids.append(submit(core, 11.0, "cancel running")["id"])
    cancel_task(core, 11.0, receive(core, 11.0)["id"])
    ids.append(submit(core, 11.0, "deadline", deadline=WALL + 20.0)["id"])
    ids.append(submit(core, 11.0, "deadline", deadline=WALL + 20.0)["id"])
    receive(core, 11.0, lease_seconds=30)
    ids.append(submit(core, 11.0, "delayed, then due", delay_ms=1000)["id"])
    ids.append(submit(core, 11.0, "delayed, cancelled", delay_ms=60_000)["id"])
    cancel_task(core, 11.0, ids[-1])
    ids.append(submit(core, 11.0, "delayed past", delay_ms=60_000, deadline=WALL + 20.0)["id"])
    call(core, 11.0, Op.MAILBOX_ENSURE, {"name": "waits"})  # a line of its own
    for timeout, then in [(600, "signal"), (1, "timeout"), (600, "cancel"), (600, "deadline")]:
        more = {"deadline": WALL + 20.0} if then == "deadline" else {}
        ids.append(submit(core, 11.0, f"waiting, then {then}", mailbox="waits", **more)["id"])
        waits = call(core, 11.0, Op.RECEIVE, {"scope": "s", "mailbox": "waits"})
        call(core, 11.0, Op.DELIVERY_SUSPEND, {"lease": waits["delivery"]["lease"],
                                               "name": "go", "timeout_seconds": timeout})
    call(core, 11.0, Op.TASK_SIGNAL, {"scope": "s", "task": ids[-4], "name": "go"})
    cancel_task(core, 11.0, ids[-2])
    # A debounced message due but not yet taken goes back to waiting when its key is sent
    # again (a message: its state is not read by id, its moves are recorded all the same).
    call(core, 11.0, Op.MAILBOX_ENSURE, {"name": "debounced"})
    debounced = {"scope": "s", "mailbox": "debounced", "debounce_key": "doc:7",
                 "debounce_seconds": 1.0}
    call(core, 11.0, Op.MESSAGE_SEND, {**debounced, "data": "h"})
    core.tick(12.5)  # due: PENDING
    assert call(core, 12.5, Op.MESSAGE_SEND, {**debounced, "data": "he"})["replaced"] is True
    # Tasks submitted after a parent (work/parents.py): BLOCKED until it ends, then PENDING
    # (or DELAYED, their delay still ahead), unless cancelled or expired while blocked.
    call(core, 12.5, Op.MAILBOX_ENSURE, {"name": "after"})
    parent = submit(core, 12.5, "parent", mailbox="after")["id"]
    for then, more in [("met", {}), ("met early", {"delay_ms": 600_000}), ("cancel", {}),
                       ("deadline", {"deadline": WALL + 20.0})]:
        ids.append(
            submit(core, 12.5, f"after, {then}", mailbox="after", after=[parent], **more)["id"]
        )
    cancel_task(core, 12.5, ids[-2])
    core.tick(20.01)
    parent_delivery = call(core, 20.01, Op.RECEIVE, {"scope": "s", "mailbox": "after"})
    complete(core, 20.01, parent_delivery["delivery"]["lease"])
    assert [status(core, task)["state"] for task in ids] == [
        "SUCCEEDED",
        "FAILED",
        "FAILED",
        "CANCELLED",
        "CANCELLED",
        "EXPIRED",
        "EXPIRED",
        "PENDING",
        "CANCELLED",
        "EXPIRED",
        "PENDING",
        "PENDING",
        "CANCELLED",
        "EXPIRED",
        "PENDING",
        "DELAYED",
        "CANCELLED",
        "EXPIRED",
    ]
    assert all(move in TRANSITIONS for move in moves)
    assert set(moves) == set(TRANSITIONS)
