"""Work queues in the pure core, driven by a fake clock: ``now`` is a float we pass in.

Mailboxes, receive (plain and parked), settlement (complete, retry, release, reject),
dead letters, crash takeover by lease expiry, plain messages with work_key dedupe, and
rebuilding all of it from the journal records. The core is a
``CoreDriver`` (support/core.py): connections 1..4 said HELLO as alice, bob, carol and
dave, the mailbox "jobs" exists with default settings, and the core's wall clock is
``now + WALL``. Every test starts from a fresh core; nothing sleeps.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CAROL, WALL, CoreDriver, call, handle, lease_id, refused

from rsd.core import DEFERRED, Core, CoreError, Rec
from rsproto import LEASE_HANDLE_BYTES, ErrorCode, Kind, Limits, Op, Push

DEDUPE = 60.0

# The runs these tests name, created by the driver at setup (SCOPE_CREATE, chosen ids).
RUNS = ("s", "s1", "s2", "other")


def make_core(ensure: bool = True, **options: Any) -> CoreDriver:
    """A driver with this file's default options (and ``RUNS``); the mailbox "jobs"
    unless not ensure."""
    options.setdefault("dedupe_seconds", DEDUPE)
    options.setdefault("runs", RUNS)
    return CoreDriver(mailbox="jobs" if ensure else None, **options)


@pytest.fixture
def core() -> CoreDriver:
    return make_core()


def ensure(core: Core, name: str = "jobs", **settings: Any) -> dict[str, Any]:
    return call(core, 0.0, Op.MAILBOX_ENSURE, {"name": name, **settings})


def submit(
    core: Core,
    now: float,
    data: Any = None,
    key: str | None = None,
    scope: str = "s",
    mailbox: str = "jobs",
    **extra: Any,
) -> str:
    args = {"scope": scope, "mailbox": mailbox, "data": data, **extra}
    if key is not None:
        args["key"] = key
    return call(core, now, Op.TASK_SUBMIT, args)["id"]


def send(
    core: Core,
    now: float,
    data: Any = None,
    work_key: str | None = None,
    scope: str = "s",
    mailbox: str = "jobs",
) -> dict[str, Any]:
    args = {"scope": scope, "mailbox": mailbox, "data": data}
    if work_key is not None:
        args["work_key"] = work_key
    return call(core, now, Op.MESSAGE_SEND, args)


def receive(
    core: Core,
    now: float,
    conn: int = ALICE,
    rid: int | None = None,
    scope: str = "s",
    mailbox: str = "jobs",
    **extra: Any,
) -> Any:
    """The delivery (or None); DEFERRED if the receive parked."""
    args = {"scope": scope, "mailbox": mailbox, **extra}
    reply = call(core, now, Op.RECEIVE, args, conn, rid)
    return reply if reply is DEFERRED else reply["delivery"]


def settle(core: Core, now: float, op: Op, lease: int, conn: int = ALICE, **extra: Any) -> Any:
    return call(core, now, op, {"lease": lease, **extra}, conn)


def complete(core: Core, now: float, lease: int, outcome: Any = None, conn: int = ALICE) -> Any:
    return settle(core, now, Op.DELIVERY_COMPLETE, lease, conn, outcome=outcome)


def retry(core: Core, now: float, lease: int, **extra: Any) -> dict[str, Any]:
    return settle(core, now, Op.DELIVERY_RETRY, lease, **extra)


def stale(core: Core, now: float, op: Op, lease: int, conn: int = ALICE) -> bool:
    with pytest.raises(CoreError) as info:
        settle(core, now, op, lease, conn)
    return info.value.code == ErrorCode.STALE_CLAIM


def status(core: Core, task: str, scope: str = "s") -> dict[str, Any]:
    return call(core, 0.0, Op.TASK_STATUS, {"scope": scope, "task": task})


def inspect(core: Core, scope: str = "s", mailbox: str = "jobs") -> dict[str, Any]:
    return call(core, 0.0, Op.QUEUE_INSPECT, {"scope": scope, "mailbox": mailbox})


def dead_letters(
    core: Core, scope: str = "s", mailbox: str = "jobs", **extra: Any
) -> list[dict[str, Any]]:
    args = {"scope": scope, "mailbox": mailbox, **extra}
    return call(core, 0.0, Op.DEAD_LETTERS, args)["items"]


def renew(core: Core, now: float, leases: list[Any], conn: int = ALICE) -> list[Any]:
    return call(core, now, Op.LEASE_RENEW, {"leases": leases}, conn)["results"]


def lease_lost(lease: int, reason: str) -> list[Any]:
    return [Kind.PUSH, int(Push.LEASE_LOST), {"lease": lease, "reason": reason}]


def bounds(base_ms: int, attempt: int) -> tuple[float, float]:
    ceiling = base_ms * 2 ** (attempt - 1)
    return ceiling / 2, ceiling


# ---- mailboxes -------------------------------------------------------------------------


def test_ensure_creates_the_mailbox_with_default_settings() -> None:
    core = make_core(ensure=False)
    assert ensure(core, "work") == {
        "name": "work",
        "mode": "WORK",
        "max_attempts": Limits.DEFAULT_MAX_ATTEMPTS,
        "retry_backoff_ms": Limits.DEFAULT_RETRY_BACKOFF_MS,
        "paused": False,
        "created": True,
    }


def test_ensure_again_is_idempotent_and_says_not_created(core: Core) -> None:
    reply = ensure(core)
    assert reply["created"] is False
    assert core.effects.take_records() == []


def test_ensure_with_other_settings_changes_them(core: Core) -> None:
    reply = ensure(core, max_attempts=2, retry_backoff_ms=250)
    assert (reply["created"], reply["max_attempts"], reply["retry_backoff_ms"]) == (False, 2, 250)
    assert core.effects.take_records() == [(Rec.MAILBOX_ENSURED, "jobs", "WORK", 2, 250, "default")]
    assert ensure(core, max_attempts=2, retry_backoff_ms=250)["created"] is False


def test_changed_attempt_limit_applies_to_the_next_settlement(core: Core) -> None:
    submit(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    ensure(core, max_attempts=1)
    assert retry(core, 1.0, lease)["state"] == "FAILED"


def test_ensure_with_an_unknown_mode_is_invalid_argument(core: Core) -> None:
    error = refused(core, 0.0, Op.MAILBOX_ENSURE, {"name": "x", "mode": "PUBSUB"})
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert "mode" in error.message


def test_ensure_with_nil_mode_means_work(core: Core) -> None:
    assert ensure(core, "x", mode=None)["mode"] == "WORK"


@pytest.mark.parametrize("mode", [False, 0, ""])
def test_ensure_with_a_falsy_mode_that_is_not_nil_is_invalid_argument(
    core: Core, mode: Any
) -> None:
    error = refused(core, 0.0, Op.MAILBOX_ENSURE, {"name": "x", "mode": mode})
    assert error.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_attempts", 0),
        ("max_attempts", Limits.MAX_ATTEMPTS + 1),
        ("max_attempts", 2.0),
        ("max_attempts", 2.5),
        ("max_attempts", True),
        ("max_attempts", "3"),
        ("retry_backoff_ms", -1),
        ("retry_backoff_ms", Limits.MAX_RETRY_BACKOFF_MS + 1),
        ("retry_backoff_ms", 100.0),
        ("retry_backoff_ms", False),
        ("retry_backoff_ms", "100"),
    ],
)
def test_ensure_with_an_out_of_range_or_non_integer_setting_is_invalid_argument(
    core: Core, field: str, value: Any
) -> None:
    error = refused(core, 0.0, Op.MAILBOX_ENSURE, {"name": "x", field: value})
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert field in error.message
    assert refused(core, 0.0, Op.QUEUE_INSPECT, {"scope": "s", "mailbox": "x"}).code == (
        ErrorCode.NOT_FOUND
    )


def test_ensure_accepts_the_limits_inclusive(core: Core) -> None:
    assert ensure(core, "lo", max_attempts=1, retry_backoff_ms=0)["created"] is True
    hi = ensure(
        core, "hi", max_attempts=Limits.MAX_ATTEMPTS, retry_backoff_ms=Limits.MAX_RETRY_BACKOFF_MS
    )
    assert hi["max_attempts"] == Limits.MAX_ATTEMPTS


@pytest.mark.parametrize(
    ("op", "extra"),
    [
        (Op.TASK_SUBMIT, {"data": 1}),
        (Op.MESSAGE_SEND, {"data": 1}),
        (Op.RECEIVE, {}),
        (Op.RECEIVE, {"wait": True}),
        (Op.DEAD_LETTERS, {}),
        (Op.QUEUE_INSPECT, {}),
    ],
    ids=["submit", "send", "receive", "receive-wait", "dead-letters", "inspect"],
)
def test_any_op_on_a_never_ensured_mailbox_is_not_found(
    core: Core, op: Op, extra: dict[str, Any]
) -> None:
    error = refused(core, 0.0, op, {"scope": "s", "mailbox": "nope", **extra})
    assert error.code == ErrorCode.NOT_FOUND
    assert "nope" in error.message


# ---- receive ---------------------------------------------------------------------------


def test_receive_delivers_in_fifo_order(core: Core) -> None:
    ids = [submit(core, 0.0, n) for n in range(4)]
    assert [receive(core, 1.0)["id"] for _ in ids] == ids


def test_receive_on_an_empty_queue_returns_no_delivery(core: Core) -> None:
    assert call(core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}) == {"delivery": None}


def test_delivery_carries_lease_id_kind_task_key_data_attempt_and_lease_seconds(
    core: Core,
) -> None:
    task = submit(core, 0.0, {"company": "acme"}, key="acme")
    delivery = receive(core, 0.0)
    assert delivery == {
        "lease": delivery["lease"],
        "id": task,
        "kind": "task",
        "task_id": task,
        "key": "acme",
        "data": {"company": "acme"},
        "attempt": 1,
        "lease_seconds": Limits.DEFAULT_LEASE_SECONDS,
        "waited_ms": 0,
    }
    assert type(delivery["lease"]) is bytes and len(delivery["lease"]) == LEASE_HANDLE_BYTES


def test_receive_grants_the_requested_lease_seconds(core: Core) -> None:
    submit(core, 0.0, 1)
    assert receive(core, 0.0, lease_seconds=120)["lease_seconds"] == 120


def test_receive_marks_the_task_running_at_attempt_one(core: Core) -> None:
    task = submit(core, 0.0, 1)
    receive(core, 0.0)
    view = status(core, task)
    assert (view["state"], view["attempt"]) == ("RUNNING", 1)


def test_an_item_goes_to_one_worker_at_a_time(core: Core) -> None:
    submit(core, 0.0, 1)
    assert receive(core, 0.0, conn=ALICE) is not None
    assert receive(core, 0.0, conn=BOB) is None


def test_delivery_lease_ids_are_distinct_from_claim_lease_ids(core: Core) -> None:
    claim = call(core, 0.0, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "c"})["lease"]
    submit(core, 0.0, 1)
    assert receive(core, 0.0)["lease"] != claim


@pytest.mark.parametrize("seconds", [4.99, 0, 601, -5, "30", True])
def test_receive_with_lease_seconds_out_of_range_is_invalid_argument(
    core: Core, seconds: Any
) -> None:
    submit(core, 0.0, 1)
    error = refused(
        core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "lease_seconds": seconds}
    )
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert "lease_seconds" in error.message
    assert inspect(core)["ready"] == 1


def test_receive_accepts_lease_seconds_at_the_limits(core: Core) -> None:
    submit(core, 0.0, 1)
    submit(core, 0.0, 2)
    assert receive(core, 0.0, lease_seconds=Limits.MIN_LEASE_SECONDS) is not None
    assert receive(core, 0.0, lease_seconds=Limits.MAX_LEASE_SECONDS) is not None


def test_receive_with_wait_on_an_empty_queue_parks(core: Core) -> None:
    assert receive(core, 0.0, wait=True) is DEFERRED
    assert core.effects.take_messages() == []
    assert inspect(core)["consumers"] == 1


def test_receive_with_wait_and_timeout_zero_returns_no_delivery_at_once(core: Core) -> None:
    assert receive(core, 0.0, wait=True, timeout_ms=0) is None
    assert inspect(core)["consumers"] == 0


def test_receive_with_wait_takes_a_ready_item_at_once(core: Core) -> None:
    task = submit(core, 0.0, 1)
    assert receive(core, 0.0, wait=True)["id"] == task


def test_submit_delivers_to_a_parked_consumer_as_a_deferred_reply(core: Core) -> None:
    receive(core, 0.0, conn=BOB, rid=7, wait=True, lease_seconds=45)
    task = submit(core, 1.0, {"n": 1}, key="k")
    [(conn, message)] = core.effects.take_messages()
    assert (conn, message[:2]) == (BOB, [Kind.REPLY, 7])
    delivery = message[2]["delivery"]
    assert (delivery["id"], delivery["attempt"], delivery["lease_seconds"]) == (task, 1, 45)
    view = status(core, task)
    assert (view["state"], inspect(core)["consumers"]) == ("RUNNING", 0)


def test_send_delivers_to_a_parked_consumer_as_a_deferred_reply(core: Core) -> None:
    receive(core, 0.0, conn=BOB, rid=7, wait=True)
    sent = send(core, 1.0, "hello")
    [(conn, message)] = core.effects.take_messages()
    assert (conn, message[:2]) == (BOB, [Kind.REPLY, 7])
    assert (message[2]["delivery"]["id"], message[2]["delivery"]["kind"]) == (sent["id"], "message")


def test_parked_consumers_are_served_longest_waiting_first(core: Core) -> None:
    receive(core, 0.0, conn=CAROL, rid=1, wait=True)
    receive(core, 0.1, conn=ALICE, rid=2, wait=True)
    receive(core, 0.2, conn=BOB, rid=3, wait=True)
    first, second = submit(core, 1.0, "a"), submit(core, 1.0, "b")
    served = [
        (conn, message[1], message[2]["delivery"]["id"])
        for conn, message in core.effects.take_messages()
    ]
    assert served == [(CAROL, 1, first), (ALICE, 2, second)]
    assert inspect(core)["consumers"] == 1


def test_a_consumer_parked_longer_than_its_lease_gets_a_full_lease_from_the_delivery(
    core: Core,
) -> None:
    """The lease a parked receive asked for counts from the delivery, not from the park:
    parked 5.2 s with a 5 s lease, the task it gets is still its own 4.9 s later."""
    receive(core, 0.0, conn=BOB, rid=7, wait=True, lease_seconds=5)
    core.tick(5.2)
    assert core.effects.take_messages() == []  # the park itself holds no lease
    task = submit(core, 5.2, {"n": 1}, key="after-a-long-idle")
    [(_, message)] = core.effects.take_messages()
    lease = message[2]["delivery"]["lease"]
    core.tick(5.2 + 5.0 - 0.01)
    assert core.effects.take_messages() == []
    assert status(core, task)["state"] == "RUNNING"
    complete(core, 5.2 + 5.0 - 0.01, lease, conn=BOB)
    assert status(core, task)["state"] == "SUCCEEDED"


def test_the_parked_consumers_holder_is_its_connections(core: Core) -> None:
    receive(core, 0.0, conn=BOB, rid=7, wait=True)
    submit(core, 1.0, 1)
    [(_, message)] = core.effects.take_messages()
    assert core.leases.get(message[2]["delivery"]["lease"]).holder == "bob"


def test_parked_receive_gets_no_delivery_at_its_timeout_not_before(core: Core) -> None:
    receive(core, 0.0, conn=BOB, rid=7, wait=True, timeout_ms=3_000)
    core.tick(3.0 - 0.01)
    assert core.effects.take_messages() == []
    core.tick(3.0 + 0.01)
    assert core.effects.take_messages() == [(BOB, [Kind.REPLY, 7, {"delivery": None}])]
    assert inspect(core)["consumers"] == 0


def test_timed_out_consumer_is_not_served_later(core: Core) -> None:
    receive(core, 0.0, conn=BOB, rid=7, wait=True, timeout_ms=1_000)
    core.tick(1.01)
    core.drain()
    task = submit(core, 2.0, 1)
    assert core.effects.take_messages() == []
    assert status(core, task)["state"] == "PENDING"


def test_cancel_of_a_parked_receive_is_cancelled_error(core: Core) -> None:
    receive(core, 0.0, conn=BOB, rid=7, wait=True)
    assert call(core, 1.0, Op.CANCEL, {"request": 7}, BOB) == {"cancelled": True}
    [(conn, message)] = core.effects.take_messages()
    assert (conn, message[:3]) == (BOB, [Kind.ERROR, 7, "CANCELLED"])
    assert inspect(core)["consumers"] == 0


def test_disconnect_drops_parked_receives_and_later_work_stays_ready(core: Core) -> None:
    receive(core, 0.0, conn=BOB, rid=7, wait=True)
    core.disconnected(BOB)
    task = submit(core, 1.0, 1)
    assert core.effects.take_messages() == []
    assert inspect(core)["ready"] == 1
    assert receive(core, 2.0, conn=ALICE)["id"] == task


def test_inspect_counts_ready_running_consumers_and_dead_letters(core: Core) -> None:
    for n in range(4):
        submit(core, 0.0, n)
    receive(core, 0.0)
    lease = receive(core, 0.0)["lease"]
    settle(core, 0.0, Op.DELIVERY_REJECT, lease)
    receive(core, 0.0, scope="s", mailbox="jobs", conn=BOB)
    assert inspect(core) == {
        "ready": 1, "running": 2, "delayed": 0, "waiting": 0, "consumers": 0,
        "dead_letters": 1, "paused": False, "blocked_by_parents": 0,
    }
    receive(core, 0.0)
    receive(core, 0.0, conn=CAROL, wait=True)
    assert inspect(core) == {
        "ready": 0, "running": 3, "delayed": 0, "waiting": 0, "consumers": 1,
        "dead_letters": 1, "paused": False, "blocked_by_parents": 0,
    }


def test_queues_of_one_mailbox_in_two_scopes_are_separate(core: Core) -> None:
    submit(core, 0.0, 1, scope="s1")
    assert receive(core, 0.0, scope="s2") is None
    assert inspect(core, scope="s1")["ready"] == 1


@pytest.mark.parametrize("op", [Op.QUEUE_INSPECT, Op.DEAD_LETTERS],
                         ids=["queue_inspect", "dead_letters"])
def test_queue_reads_do_not_create_scopes(op: int) -> None:
    """protocol.md: QUEUE_INSPECT "Changes nothing"; CLAIM_INSPECT and TASK_STATUS already
    only look. A run never created is NOT_FOUND."""
    core = CoreDriver(recovered=True)
    before = core.stats()["scopes"]
    for n in range(100):
        assert core.refused(op, {"scope": f"nobody-{n}", "mailbox": "jobs"}).code == (
            ErrorCode.NOT_FOUND
        )
    assert core.stats()["scopes"] == before
    assert core.drain() == []


# ---- settlement ------------------------------------------------------------------------


def test_complete_makes_the_task_succeeded_with_the_outcome(core: Core) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    assert complete(core, 2.0, lease, {"report": "ok"}) == {"id": task, "state": "SUCCEEDED"}
    view = status(core, task)
    assert (view["state"], view["outcome"], view["reason"], view["finished_at"]) == (
        "SUCCEEDED",
        {"report": "ok"},
        None,
        WALL + 2.0,
    )
    assert inspect(core) == {
        "ready": 0, "running": 0, "delayed": 0, "waiting": 0, "consumers": 0,
        "dead_letters": 0, "paused": False, "blocked_by_parents": 0,
    }


def test_complete_with_an_outcome_over_the_limit_is_invalid_and_keeps_the_delivery(
    core: Core,
) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    error = refused(
        core,
        1.0,
        Op.DELIVERY_COMPLETE,
        {
            "lease": lease,
            "outcome": "x" * Limits.MAX_PAYLOAD_BYTES,
        },
    )
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert str(Limits.MAX_PAYLOAD_BYTES) in error.message
    assert status(core, task)["state"] == "RUNNING"
    assert complete(core, 2.0, lease, "small")["state"] == "SUCCEEDED"


SETTLE_OPS = [
    Op.DELIVERY_COMPLETE,
    Op.DELIVERY_RETRY,
    Op.DELIVERY_RELEASE,
    Op.DELIVERY_REJECT,
]


@pytest.mark.parametrize(
    ("first", "second"),
    [(a, b) for a in SETTLE_OPS for b in SETTLE_OPS if a != b],
    ids=lambda op: op.name,
)
def test_a_second_settle_of_another_kind_with_the_same_lease_is_stale_claim(
    core: Core, first: Op, second: Op
) -> None:
    """(A repeat of the same kind is answered as the first:
    test_core_a_repeated_settlement_is_answered_as_the_first.py.)"""
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    settle(core, 1.0, first, lease)
    before = status(core, task)
    core.drain()
    assert stale(core, 2.0, second, lease)
    assert status(core, task) == before
    assert core.effects.take_records() == []


@pytest.mark.parametrize("op", SETTLE_OPS, ids=lambda op: op.name)
def test_settle_with_a_never_issued_lease_is_stale_claim(core: Core, op: Op) -> None:
    assert stale(core, 0.0, op, handle(12345))


@pytest.mark.parametrize("op", SETTLE_OPS, ids=lambda op: op.name)
def test_settle_with_a_claims_lease_is_stale_claim_and_keeps_the_claim(core: Core, op: Op) -> None:
    lease = call(core, 0.0, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "c"})["lease"]
    assert stale(core, 1.0, op, lease)
    claim = call(core, 1.0, Op.CLAIM_INSPECT, {"scope": "s", "key": "c"})
    assert (claim["held"], claim["holder"]) == (True, "alice")


def test_retry_puts_the_task_back_pending_with_the_reason(core: Core) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    reply = retry(core, 1.0, lease, reason="flaky")
    assert (reply["id"], reply["state"]) == (task, "PENDING")
    view = status(core, task)
    assert (view["state"], view["attempt"], view["reason"]) == ("PENDING", 1, "flaky")
    assert inspect(core)["running"] == 0


def test_retried_task_is_not_delivered_before_its_backoff_passes(core: Core) -> None:
    submit(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    delay = retry(core, 1.0, lease)["retry_in_ms"] / 1000.0
    core.tick(1.0 + delay - 0.01)
    assert receive(core, 1.0 + delay - 0.01) is None
    assert inspect(core)["ready"] == 0


def test_retried_task_is_delivered_after_its_backoff_with_the_next_attempt(core: Core) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    delay = retry(core, 1.0, lease)["retry_in_ms"] / 1000.0
    core.tick(1.0 + delay + 0.01)
    delivery = receive(core, 1.0 + delay + 0.01)
    assert (delivery["id"], delivery["attempt"]) == (task, 2)
    assert delivery["lease"] != lease


def test_retried_task_is_handed_to_a_parked_consumer_when_its_backoff_passes(
    core: Core,
) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    retry(core, 1.0, lease, delay_ms=2_000)
    receive(core, 1.0, conn=BOB, rid=7, wait=True, timeout_ms=60_000)
    core.tick(3.01)
    [(conn, message)] = core.effects.take_messages()
    assert (conn, message[:2]) == (BOB, [Kind.REPLY, 7])
    assert (message[2]["delivery"]["id"], message[2]["delivery"]["attempt"]) == (task, 2)


def test_retry_backoff_grows_exponentially_within_equal_jitter_bounds() -> None:
    core = make_core()
    ensure(core, max_attempts=8, retry_backoff_ms=1_000)
    submit(core, 0.0, 1)
    now, delays = 0.0, []
    for attempt in range(1, 8):
        delivery = receive(core, now)
        assert delivery["attempt"] == attempt
        delay = retry(core, now, delivery["lease"])["retry_in_ms"]
        low, high = bounds(1_000, attempt)
        assert low <= delay <= high, (attempt, delay)
        delays.append(delay)
        now += delay / 1000.0 + 0.01
        core.tick(now)
    assert delays == sorted(delays)
    assert delays[-1] >= 16 * delays[0]


def test_retry_backoff_never_exceeds_the_longest_allowed_backoff() -> None:
    core = make_core()
    ensure(core, retry_backoff_ms=Limits.MAX_RETRY_BACKOFF_MS)
    submit(core, 0.0, 1)
    retry(core, 0.0, receive(core, 0.0)["lease"], delay_ms=0)
    delay = retry(core, 1.0, receive(core, 1.0)["lease"])["retry_in_ms"]
    assert Limits.MAX_RETRY_BACKOFF_MS / 2 <= delay <= Limits.MAX_RETRY_BACKOFF_MS


def test_retry_backoff_is_the_same_for_the_same_item_and_attempt() -> None:
    runs = []
    for _ in range(2):
        core = make_core()
        submit(core, 0.0, 1)
        first = retry(core, 0.0, receive(core, 0.0)["lease"])["retry_in_ms"]
        core.tick(first / 1000.0 + 0.01)
        second = retry(core, 5.0, receive(core, 5.0)["lease"])["retry_in_ms"]
        runs.append((first, second))
    assert runs[0] == runs[1]


def test_retry_with_delay_ms_waits_exactly_that_long(core: Core) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    assert retry(core, 1.0, lease, delay_ms=7_000)["retry_in_ms"] == 7_000
    core.tick(8.0 - 0.01)
    assert receive(core, 8.0 - 0.01) is None
    core.tick(8.0 + 0.01)
    assert receive(core, 8.0 + 0.01)["id"] == task


def test_retry_with_delay_zero_is_ready_at_once(core: Core) -> None:
    task = submit(core, 0.0, 1)
    retry(core, 1.0, receive(core, 0.0)["lease"], delay_ms=0)
    assert receive(core, 1.0)["id"] == task


@pytest.mark.parametrize("delay", [-1, "10", True, Limits.MAX_RETRY_BACKOFF_MS + 1])
def test_retry_with_a_bad_delay_ms_is_invalid_and_keeps_the_delivery(
    core: Core, delay: Any
) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    error = refused(core, 1.0, Op.DELIVERY_RETRY, {"lease": lease, "delay_ms": delay})
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert status(core, task)["state"] == "RUNNING"


def test_retry_at_the_attempt_limit_fails_with_a_reason_naming_the_limit(core: Core) -> None:
    ensure(core, max_attempts=2)
    task = submit(core, 0.0, {"n": 1}, key="k")
    retry(core, 0.0, receive(core, 0.0)["lease"], delay_ms=0)
    reply = retry(core, 1.0, receive(core, 1.0)["lease"], reason="boom")
    assert reply == {"id": task, "state": "FAILED", "retry_in_ms": None}
    view = status(core, task)
    assert (view["state"], view["attempt"]) == ("FAILED", 2)
    assert "attempt limit of 2" in view["reason"] and "boom" in view["reason"]


def test_retry_at_the_attempt_limit_dead_letters_the_task(core: Core) -> None:
    ensure(core, max_attempts=1)
    task = submit(core, 0.0, {"n": 1}, key="k")
    retry(core, 3.0, receive(core, 0.0)["lease"])
    [letter] = dead_letters(core)
    assert (letter["id"], letter["attempt"], letter["at"]) == (task, 1, WALL + 3.0)
    assert "attempt limit of 1" in letter["reason"]
    assert receive(core, 4.0) is None


def test_release_makes_the_task_ready_at_once_with_the_same_attempt(core: Core) -> None:
    task = submit(core, 0.0, 1)
    first = receive(core, 0.0)
    assert settle(core, 1.0, Op.DELIVERY_RELEASE, first["lease"]) == {
        "id": task,
        "state": "PENDING",
    }
    assert status(core, task)["state"] == "PENDING"
    again = receive(core, 1.0, conn=BOB)
    assert (again["id"], again["attempt"]) == (task, first["attempt"])
    assert again["lease"] != first["lease"]


def test_release_does_not_use_up_attempts(core: Core) -> None:
    ensure(core, max_attempts=1)
    task = submit(core, 0.0, 1)
    for _ in range(3):
        settle(core, 0.0, Op.DELIVERY_RELEASE, receive(core, 0.0)["lease"])
    assert complete(core, 1.0, receive(core, 1.0)["lease"])["state"] == "SUCCEEDED"
    assert status(core, task)["attempt"] == 1


def test_reject_fails_the_task_with_the_reason(core: Core) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    reply = settle(core, 1.0, Op.DELIVERY_REJECT, lease, reason="malformed")
    assert reply == {"id": task, "state": "FAILED"}
    view = status(core, task)
    assert (view["state"], view["reason"]) == ("FAILED", "rejected: malformed")


def test_reject_without_a_reason_says_rejected(core: Core) -> None:
    task = submit(core, 0.0, 1)
    settle(core, 1.0, Op.DELIVERY_REJECT, receive(core, 0.0)["lease"])
    assert status(core, task)["reason"] == "rejected"


def test_rejected_task_is_listed_in_dead_letters(core: Core) -> None:
    task = submit(core, 0.0, {"company": "acme"}, key="acme")
    settle(core, 2.0, Op.DELIVERY_REJECT, receive(core, 0.0)["lease"], reason="malformed")
    assert dead_letters(core) == [
        {
            "id": task,
            "kind": "task",
            "key": "acme",
            "data": {"company": "acme"},
            "attempt": 1,
            "reason": "rejected: malformed",
            "at": WALL + 2.0,
        }
    ]


def test_dead_letters_limit_returns_the_newest(core: Core) -> None:
    ids = []
    for n in range(5):
        ids.append(submit(core, 0.0, n))
        settle(core, 0.0, Op.DELIVERY_REJECT, receive(core, 0.0)["lease"])
    assert [letter["id"] for letter in dead_letters(core)] == ids
    assert [letter["id"] for letter in dead_letters(core, limit=2)] == ids[-2:]


@pytest.mark.parametrize("limit", [0, Limits.MAX_DEAD_LETTERS + 1, "3", True])
def test_dead_letters_with_a_bad_limit_is_invalid_argument(core: Core, limit: Any) -> None:
    error = refused(core, 0.0, Op.DEAD_LETTERS, {"scope": "s", "mailbox": "jobs", "limit": limit})
    assert error.code == ErrorCode.INVALID_ARGUMENT


def test_completed_task_is_not_a_dead_letter(core: Core) -> None:
    submit(core, 0.0, 1)
    complete(core, 0.0, receive(core, 0.0)["lease"])
    assert dead_letters(core) == []


# ---- crash takeover --------------------------------------------------------------------


def test_unrenewed_delivery_is_still_running_just_before_its_lease_ends(core: Core) -> None:
    task = submit(core, 0.0, 1)
    receive(core, 0.0, lease_seconds=10)
    core.tick(10.0 - 0.01)
    assert status(core, task)["state"] == "RUNNING"
    assert receive(core, 10.0 - 0.01, conn=BOB) is None
    assert core.effects.take_messages() == []


def test_unrenewed_delivery_is_ready_again_after_its_lease_ends(core: Core) -> None:
    task = submit(core, 0.0, 1)
    receive(core, 0.0, lease_seconds=10)
    core.tick(10.0 + 0.01)
    view = status(core, task)
    assert (view["state"], view["attempt"], view["reason"]) == ("PENDING", 1, "lease expired")
    assert inspect(core) == {
        "ready": 1, "running": 0, "delayed": 0, "waiting": 0, "consumers": 0,
        "dead_letters": 0, "paused": False, "blocked_by_parents": 0,
    }


def test_lease_expiry_pushes_lease_lost_to_the_workers_connection(core: Core) -> None:
    submit(core, 0.0, 1)
    lease = receive(core, 0.0, conn=BOB, lease_seconds=10)["lease"]
    core.drain()
    core.tick(10.01)
    assert core.effects.take_messages() == [(BOB, lease_lost(lease, "expired"))]


def test_lease_expiry_records_the_requeue(core: Core) -> None:
    task = submit(core, 0.0, 1)
    old = receive(core, 0.0, lease_seconds=10)
    core.drain()
    core.tick(10.01)
    [rec] = core.effects.take_records()
    lease = old["lease"]
    assert rec == (Rec.REQUEUED, task, lease, "lease_expired", WALL + 10.01, "lease expired", None)


def test_next_delivery_after_an_expiry_has_the_next_attempt(core: Core) -> None:
    task = submit(core, 0.0, 1)
    old = receive(core, 0.0, lease_seconds=10)
    core.tick(10.01)
    new = receive(core, 11.0, conn=BOB)
    assert (new["id"], new["attempt"]) == (task, old["attempt"] + 1)
    assert new["lease"] > old["lease"]


@pytest.mark.parametrize("op", SETTLE_OPS, ids=lambda op: op.name)
def test_settle_with_an_expired_lease_is_stale_claim(core: Core, op: Op) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0, lease_seconds=10)["lease"]
    core.tick(10.01)
    assert stale(core, 11.0, op, lease)
    assert status(core, task)["state"] == "PENDING"


def test_renew_of_an_expired_delivery_lease_is_stale_claim_in_its_slot(core: Core) -> None:
    submit(core, 0.0, 1)
    old = receive(core, 0.0, lease_seconds=10)["lease"]
    core.tick(10.01)
    new = receive(core, 11.0, conn=BOB)["lease"]
    assert renew(core, 12.0, [old, new], conn=ALICE) == [ErrorCode.STALE_CLAIM.value, None]


def test_the_valid_holders_result_is_the_one_kept(core: Core) -> None:
    task = submit(core, 0.0, 1)
    old = receive(core, 0.0, conn=ALICE, lease_seconds=10)["lease"]
    core.tick(10.01)
    new = receive(core, 11.0, conn=BOB)["lease"]
    assert stale(core, 12.0, Op.DELIVERY_COMPLETE, old)
    complete(core, 13.0, new, "bob's result", conn=BOB)
    with pytest.raises(CoreError) as info:
        complete(core, 14.0, old, "alice's late result")
    assert info.value.code == ErrorCode.STALE_CLAIM
    view = status(core, task)
    assert (view["state"], view["outcome"], view["attempt"]) == ("SUCCEEDED", "bob's result", 2)


def test_renewed_delivery_lives_past_its_original_lease(core: Core) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0, lease_seconds=10)["lease"]
    assert renew(core, 8.0, [lease]) == [None]
    core.tick(10.01)
    assert status(core, task)["state"] == "RUNNING"
    assert core.effects.take_messages() == []
    core.tick(18.0 - 0.01)
    assert status(core, task)["state"] == "RUNNING"
    assert complete(core, 17.5, lease, "done")["state"] == "SUCCEEDED"


def test_renewed_delivery_expires_one_length_after_the_renewal(core: Core) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0, lease_seconds=10)["lease"]
    renew(core, 8.0, [[lease, 20]])
    core.tick(28.0 - 0.01)
    assert status(core, task)["state"] == "RUNNING"
    core.tick(28.0 + 0.01)
    assert status(core, task)["state"] == "PENDING"


def test_expiry_on_the_last_allowed_attempt_fails_and_dead_letters(core: Core) -> None:
    ensure(core, max_attempts=2)
    task = submit(core, 0.0, 1)
    receive(core, 0.0, lease_seconds=5)
    core.tick(5.01)
    lease = receive(core, 6.0, conn=BOB, lease_seconds=5)["lease"]
    core.drain()
    core.tick(11.01)
    assert core.effects.take_messages() == [(BOB, lease_lost(lease, "expired"))]
    view = status(core, task)
    assert (view["state"], view["attempt"]) == ("FAILED", 2)
    assert "lease expired" in view["reason"] and "2 attempts" in view["reason"]
    [letter] = dead_letters(core)
    assert (letter["id"], letter["attempt"], letter["reason"]) == (task, 2, view["reason"])
    assert receive(core, 12.0) is None


def test_expired_item_is_handed_to_a_parked_consumer(core: Core) -> None:
    task = submit(core, 0.0, 1)
    lease = receive(core, 0.0, lease_seconds=10)["lease"]
    receive(core, 1.0, conn=BOB, rid=7, wait=True, timeout_ms=60_000)
    core.tick(10.01)
    messages = core.effects.take_messages()
    assert messages[0] == (ALICE, lease_lost(lease, "expired"))
    conn, reply = messages[1]
    assert (conn, reply[:2]) == (BOB, [Kind.REPLY, 7])
    assert (reply[2]["delivery"]["id"], reply[2]["delivery"]["attempt"]) == (task, 2)


def test_expired_item_goes_back_to_the_end_of_the_line(core: Core) -> None:
    first = submit(core, 0.0, 1)
    second = submit(core, 0.0, 2)
    receive(core, 0.0, lease_seconds=10)
    core.tick(10.01)
    assert [receive(core, 11.0)["id"] for _ in range(2)] == [second, first]


# ---- plain messages --------------------------------------------------------------------


def test_send_returns_the_id_and_replay_false(core: Core) -> None:
    sent = send(core, 0.0, {"company": "acme"}, work_key="crawl:acme")
    assert sent == {"id": sent["id"], "replay": False}
    assert type(sent["id"]) is str


def test_send_with_the_same_work_key_and_data_within_the_window_replays(core: Core) -> None:
    first = send(core, 0.0, {"a": 1, "b": 2}, work_key="wk")
    core.drain()
    again = send(core, 10.0, {"b": 2, "a": 1}, work_key="wk")
    assert again == {"id": first["id"], "replay": True}
    assert core.effects.take_records() == []
    assert inspect(core)["ready"] == 1


def test_send_replays_also_after_the_message_was_consumed(core: Core) -> None:
    first = send(core, 0.0, "x", work_key="wk")
    complete(core, 1.0, receive(core, 1.0)["lease"])
    assert send(core, 2.0, "x", work_key="wk") == {"id": first["id"], "replay": True}
    assert inspect(core)["ready"] == 0


def test_send_with_the_same_work_key_and_other_data_is_idempotency_conflict(
    core: Core,
) -> None:
    first = send(core, 0.0, "x", work_key="wk")
    error = refused(
        core,
        1.0,
        Op.MESSAGE_SEND,
        {
            "scope": "s",
            "mailbox": "jobs",
            "data": "y",
            "work_key": "wk",
        },
    )
    assert error.code == ErrorCode.IDEMPOTENCY_CONFLICT
    assert error.details == {"id": first["id"]}


def test_work_key_is_still_taken_just_before_the_window_ends(core: Core) -> None:
    first = send(core, 0.0, "x", work_key="wk")
    core.tick(DEDUPE - 0.01)
    assert send(core, DEDUPE - 0.01, "x", work_key="wk")["id"] == first["id"]


def test_work_key_is_free_again_after_the_window_passes(core: Core) -> None:
    first = send(core, 0.0, "x", work_key="wk")
    core.drain()
    core.tick(DEDUPE + 0.01)
    assert core.effects.take_records() == [
        (Rec.DEDUPE_EXPIRED, "s", "jobs", "wk", first["id"], "default")
    ]
    again = send(core, DEDUPE + 0.01, "other data", work_key="wk")
    assert again["replay"] is False and again["id"] != first["id"]


def test_send_without_a_work_key_never_dedupes(core: Core) -> None:
    ids = {send(core, 0.0, "same")["id"] for _ in range(3)}
    assert len(ids) == 3
    assert inspect(core)["ready"] == 3


def test_work_key_dedupe_is_per_mailbox_and_per_scope(core: Core) -> None:
    ensure(core, "other")
    first = send(core, 0.0, "x", work_key="wk")["id"]
    in_mailbox = send(core, 0.0, "x", work_key="wk", mailbox="other")
    in_scope = send(core, 0.0, "x", work_key="wk", scope="s2")
    assert not in_mailbox["replay"] and not in_scope["replay"]
    assert len({first, in_mailbox["id"], in_scope["id"]}) == 3


def test_message_is_received_like_a_task(core: Core) -> None:
    sent = send(core, 0.0, {"n": 1}, work_key="wk")
    delivery = receive(core, 1.0, lease_seconds=20)
    assert delivery == {
        "lease": delivery["lease"],
        "id": sent["id"],
        "kind": "message",
        "task_id": None,
        "key": "wk",
        "data": {"n": 1},
        "attempt": 1,
        "lease_seconds": 20,
        "waited_ms": 0,
    }


def test_messages_and_tasks_share_one_fifo_line(core: Core) -> None:
    ids = [send(core, 0.0, 1)["id"], submit(core, 0.0, 2), send(core, 0.0, 3)["id"]]
    assert [receive(core, 1.0)["id"] for _ in ids] == ids


def test_completed_message_is_gone_from_the_queue(core: Core) -> None:
    send(core, 0.0, 1)
    lease = receive(core, 0.0)["lease"]
    assert complete(core, 1.0, lease)["state"] == "SUCCEEDED"
    assert inspect(core) == {
        "ready": 0, "running": 0, "delayed": 0, "waiting": 0, "consumers": 0,
        "dead_letters": 0, "paused": False, "blocked_by_parents": 0,
    }
    assert receive(core, 2.0) is None


def test_retried_message_is_delivered_again_with_the_next_attempt(core: Core) -> None:
    sent = send(core, 0.0, 1)
    retry(core, 0.0, receive(core, 0.0)["lease"], delay_ms=0)
    delivery = receive(core, 1.0)
    assert (delivery["id"], delivery["attempt"]) == (sent["id"], 2)


def test_rejected_message_is_a_dead_letter_of_kind_message(core: Core) -> None:
    sent = send(core, 0.0, {"n": 1}, work_key="wk")
    settle(core, 1.0, Op.DELIVERY_REJECT, receive(core, 0.0)["lease"], reason="bad")
    [letter] = dead_letters(core)
    assert (letter["id"], letter["kind"], letter["key"], letter["reason"]) == (
        sent["id"],
        "message",
        "wk",
        "rejected: bad",
    )


def test_status_of_a_message_id_is_not_found(core: Core) -> None:
    sent = send(core, 0.0, 1)
    error = refused(core, 0.0, Op.TASK_STATUS, {"scope": "s", "task": sent["id"]})
    assert error.code == ErrorCode.NOT_FOUND


def test_send_without_data_is_invalid_argument(core: Core) -> None:
    error = refused(core, 0.0, Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs"})
    assert error.code == ErrorCode.INVALID_ARGUMENT


def test_send_with_data_over_the_limit_is_invalid_argument_naming_the_limit(
    core: Core,
) -> None:
    error = refused(
        core,
        0.0,
        Op.MESSAGE_SEND,
        {
            "scope": "s",
            "mailbox": "jobs",
            "data": b"x" * Limits.MAX_PAYLOAD_BYTES,
        },
    )
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert str(Limits.MAX_PAYLOAD_BYTES) in error.message


# ---- records and replay ----------------------------------------------------------------

RETENTION = 10.0
END = 13.0  # when the history ends and the fresh core replays it


def history_core() -> Core:
    return make_core(ensure=False, retention_seconds=RETENTION, dedupe_seconds=10.0)


def build_history() -> tuple[Core, list[tuple[Any, ...]], dict[str, str]]:
    """A scenario that writes every queue record kind; returns core, records, task ids."""
    core = history_core()
    records: list[tuple[Any, ...]] = []
    ensure(core, "jobs", max_attempts=3, retry_backoff_ms=1_000)
    ensure(core, "once", max_attempts=1)
    ensure(core, "jobs", max_attempts=3, retry_backoff_ms=500)
    tasks = {
        name: submit(core, 0.0, {"task": name}, key=name, subscriber_id=f"sub-{name}")
        for name in ("done", "retried", "rejected", "released")
    }
    tasks["cancelled"] = submit(core, 0.0, "c", key="cancelled")
    tasks["deadline"] = submit(core, 0.0, "d", key="deadline", deadline=WALL + 5.0)
    tasks["doomed"] = submit(core, 0.0, "e", key="doomed", mailbox="once")
    send(core, 0.0, "m1", work_key="old")
    send(core, 0.0, "m2")
    call(core, 0.0, Op.TASK_CANCEL, {"scope": "s", "task": tasks["cancelled"]})
    by_id = {}
    for _ in range(4):
        delivery = receive(core, 1.0)
        by_id[delivery["id"]] = delivery["lease"]
    complete(core, 1.0, by_id[tasks["done"]], {"answer": 42})
    retry(core, 1.0, by_id[tasks["retried"]], reason="flaky")
    settle(core, 1.0, Op.DELIVERY_REJECT, by_id[tasks["rejected"]], reason="bad")
    settle(core, 1.0, Op.DELIVERY_RELEASE, by_id[tasks["released"]])
    receive(core, 1.0, mailbox="once", lease_seconds=5)  # never renewed: dead at 6
    assert receive(core, 1.0)["id"] == tasks["deadline"]  # running when its deadline hits
    complete(core, 1.0, receive(core, 1.0)["lease"])  # the message with work_key "old"
    call(
        core,
        1.0,
        Op.TASK_JOIN,
        {
            "scope": "s",
            "task": tasks["done"],
            "subscriber_id": "late",
            "subscriber_scope": "p",
        },
    )
    call(
        core,
        1.0,
        Op.TASK_DETACH,
        {
            "scope": "s",
            "task": tasks["retried"],
            "subscriber_id": "sub-retried",
        },
    )
    records += core.effects.take_records()
    core.tick(3.0)  # retried is visible again
    expiring = receive(core, 3.0, lease_seconds=5)  # m2, left to expire at 8
    assert expiring["kind"] == "message"
    core.tick(8.01)  # m2 lease expired, deadline passed, "doomed" dead on its last attempt
    core.tick(12.0)  # done and rejected tombstoned; the "old" work_key window over
    send(core, 12.0, "m3", work_key="new")
    released = receive(core, 12.0, lease_seconds=60)
    assert released["id"] == tasks["released"]
    renew(core, 12.0, [[released["lease"], 90]])
    retried = receive(core, 12.0)
    assert (retried["id"], retried["attempt"]) == (tasks["retried"], 2)
    complete(core, 12.0, retried["lease"], "second time lucky")
    core.tick(END)
    records += core.effects.take_records()
    return core, records, tasks


def replayed(records: list[tuple[Any, ...]], times: int = 1) -> Core:
    fresh = history_core()
    for _ in range(times):
        for rec in records:
            fresh.apply(rec, END)
    return fresh


def task_views(core: Core, tasks: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {name: status(core, task) for name, task in tasks.items()}


def test_history_covers_every_queue_record_kind() -> None:
    _, records, _ = build_history()
    kinds = {rec[0] for rec in records}
    assert kinds >= {
        Rec.MAILBOX_ENSURED,
        Rec.ITEM_ENQUEUED,
        Rec.DELIVERED,
        Rec.REQUEUED,
        Rec.FINISHED,
        Rec.SUBSCRIBED,
        Rec.DETACHED,
        Rec.TOMBSTONED,
        Rec.DEDUPE_EXPIRED,
        Rec.LEASE_RESIZED,
    }
    requeues = {rec[3] for rec in records if rec[0] == Rec.REQUEUED}
    assert requeues == {"retry", "release", "lease_expired"}


def test_history_ends_with_tasks_in_every_kind_of_state() -> None:
    core, _, tasks = build_history()
    views = task_views(core, tasks)
    assert {name: (v["state"], v["tombstoned"]) for name, v in views.items()} == {
        "done": ("SUCCEEDED", True),
        "retried": ("SUCCEEDED", False),
        "rejected": ("FAILED", True),
        "released": ("RUNNING", False),
        "cancelled": ("CANCELLED", True),
        "deadline": ("EXPIRED", False),
        "doomed": ("FAILED", False),
    }


def test_replay_rebuilds_the_same_task_views() -> None:
    original, records, tasks = build_history()
    assert task_views(replayed(records), tasks) == task_views(original, tasks)


def test_replay_rebuilds_the_same_dead_letters() -> None:
    original, records, _ = build_history()
    fresh = replayed(records)
    for mailbox in ("jobs", "once"):
        assert dead_letters(fresh, mailbox=mailbox) == dead_letters(original, mailbox=mailbox)


def test_replay_rebuilds_the_same_queue_counts() -> None:
    original, records, _ = build_history()
    fresh = replayed(records)
    for mailbox in ("jobs", "once"):
        assert inspect(fresh, mailbox=mailbox) == inspect(original, mailbox=mailbox)


def _released_history() -> tuple[Core, Core, str, str]:
    """a and b submitted, a delivered and released: the line is b, a. Both cores."""
    core = make_core()
    first, second = submit(core, 0.0, "a"), submit(core, 0.0, "b")
    settle(core, 1.0, Op.DELIVERY_RELEASE, receive(core, 1.0)["lease"])
    fresh = make_core()
    for rec in core.effects.take_records():
        fresh.apply(rec, 2.0)
    return core, fresh, first, second


def test_replayed_requeued_item_is_counted_once_as_ready() -> None:
    original, fresh, _, _ = _released_history()
    assert inspect(original)["ready"] == 2
    assert inspect(fresh)["ready"] == 2


def test_replay_keeps_the_order_of_the_ready_line() -> None:
    _, fresh, first, second = _released_history()
    assert [receive(fresh, 2.0)["id"] for _ in range(2)] == [second, first]


def test_replayed_requeued_item_is_delivered_once() -> None:
    _, fresh, first, second = _released_history()
    delivered = [receive(fresh, 2.0) for _ in range(3)]
    assert sorted(d["id"] for d in delivered[:2]) == sorted([first, second])
    assert delivered[2] is None


def test_replay_rebuilds_mailbox_settings() -> None:
    _, records, _ = build_history()
    fresh = replayed(records)
    assert ensure(fresh, "jobs", max_attempts=3, retry_backoff_ms=500)["created"] is False
    assert fresh.effects.take_records() == []


def test_replay_keeps_work_key_dedupe() -> None:
    original, records, _ = build_history()
    fresh = replayed(records)
    for core in (original, fresh):
        replay = send(core, END, "m3", work_key="new")
        assert replay["replay"] is True
        error = refused(
            core,
            END,
            Op.MESSAGE_SEND,
            {
                "scope": "s",
                "mailbox": "jobs",
                "data": "other",
                "work_key": "new",
            },
        )
        assert error.code == ErrorCode.IDEMPOTENCY_CONFLICT
        assert send(core, END, "m1 again", work_key="old")["replay"] is False
    assert send(fresh, END, "m3", work_key="new") == send(original, END, "m3", work_key="new")


def test_replay_keeps_task_key_idempotency() -> None:
    _, records, tasks = build_history()
    fresh = replayed(records)
    again = call(
        fresh,
        END,
        Op.TASK_SUBMIT,
        {
            "scope": "s",
            "mailbox": "jobs",
            "key": "done",
            "data": {"task": "done"},
        },
    )
    assert (again["id"], again["created"]) == (tasks["done"], False)


def test_replay_writes_no_records_and_sends_no_messages() -> None:
    _, records, _ = build_history()
    fresh = replayed(records)
    assert (fresh.effects.take_records(), fresh.effects.take_messages()) == ([], [])


def test_replayed_core_issues_new_item_and_lease_ids() -> None:
    _, records, _ = build_history()
    fresh = replayed(records)
    old_items = {rec[1] for rec in records if rec[0] == Rec.ITEM_ENQUEUED}
    old_leases = {lease_id(rec[2]) for rec in records if rec[0] == Rec.DELIVERED}
    new_item = submit(fresh, END, "fresh")
    assert new_item not in old_items
    assert fresh.leases.ids.top > max(old_leases)


def test_replayed_running_delivery_can_be_completed_with_its_old_lease() -> None:
    _, records, tasks = build_history()
    fresh = replayed(records)
    delivered = [rec for rec in records if rec[0] == Rec.DELIVERED]
    lease = [rec[2] for rec in delivered if rec[1] == tasks["released"]][-1]
    assert complete(fresh, END + 1, lease, "after restart")["state"] == "SUCCEEDED"
    assert status(fresh, tasks["released"])["attempt"] == 1


def test_replayed_resized_delivery_lives_its_new_length_from_the_restart() -> None:
    _, records, tasks = build_history()
    fresh = replayed(records)
    fresh.tick(END + 90 - 0.01)
    assert status(fresh, tasks["released"])["state"] == "RUNNING"
    fresh.tick(END + 90 + 0.01)
    assert status(fresh, tasks["released"])["state"] == "PENDING"


def test_replaying_each_record_twice_in_a_row_is_harmless() -> None:
    original, records, tasks = build_history()
    fresh = replayed([rec for rec in records for _ in range(2)])
    assert task_views(fresh, tasks) == task_views(original, tasks)
    for mailbox in ("jobs", "once"):
        assert dead_letters(fresh, mailbox=mailbox) == dead_letters(original, mailbox=mailbox)


def test_replaying_all_records_twice_is_harmless() -> None:
    original, records, tasks = build_history()
    fresh = replayed(records, times=2)
    assert task_views(fresh, tasks) == task_views(original, tasks)
    for mailbox in ("jobs", "once"):
        assert dead_letters(fresh, mailbox=mailbox) == dead_letters(original, mailbox=mailbox)
