"""Quotas (token buckets) in the pure core, on a fake clock (support/core.py's CoreDriver).

Each test is named after the rule it protects: continuous refill up to the burst, strict
FIFO waiters served by a timer at the head's instant (a large amount is not starved),
withdrawn waits, the level surviving recovery, and the bounds.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CAROL, CoreDriver, next_rid, wheel_but_quiet_runs

from rsd.core import DEFERRED, Rec
from rsproto import ErrorCode, Kind, Limits, Op

# The runs these tests name, created by the driver at setup (SCOPE_CREATE, chosen ids).
RUNS = ("s", "r", "run-1", "run-a", "run-b", "run-x")


@pytest.fixture
def core() -> CoreDriver:
    core = CoreDriver(mailbox=None, runs=RUNS)
    ensure(core, "api", 10, 10)  # 1 token per second, burst 10
    core.drain()
    return core


def ensure(core: CoreDriver, name: str, limit: int, per_seconds: float) -> dict[str, Any]:
    return core.call(Op.QUOTA_ENSURE, {"name": name, "limit": limit, "per_seconds": per_seconds})


def take(
    core: CoreDriver, amount: int = 1, conn: int = ALICE, rid: int | None = None,
    quota: str = "api", **extra: Any,
) -> Any:
    args = {"scope": "run-1", "quota": quota, "amount": amount, **extra}
    return core.call(Op.QUOTA_TAKE, args, conn, rid=rid)


def level(core: CoreDriver, name: str = "api") -> float:
    return core.call(Op.QUOTA_INSPECT, {"name": name})["level"]


def served(messages: list[Any]) -> list[int]:
    """Request ids of the takes served by deferred replies, in order."""
    return [body[1] for _, body in messages if body[0] == Kind.REPLY and "taken" in body[2]]


def wait_for(core: CoreDriver, amount: int, conn: int = ALICE, **extra: Any) -> int:
    rid = next_rid()
    assert take(core, amount, conn, rid=rid, wait=True, **extra) is DEFERRED
    return rid


# ---- the bucket --------------------------------------------------------------------------


def test_a_new_quota_starts_full_and_a_take_lowers_its_level(core: CoreDriver) -> None:
    assert level(core) == 10
    assert take(core, 4) == {"taken": 4, "level": 6, "waited_ms": 0}
    assert level(core) == 6


def test_the_level_refills_continuously_up_to_the_limit(core: CoreDriver) -> None:
    take(core, 10)
    core.now = 2.5
    assert level(core) == pytest.approx(2.5)
    core.now = 100.0
    assert level(core) == 10  # burst = limit


def test_an_empty_budget_without_wait_is_quota_exhausted(core: CoreDriver) -> None:
    take(core, 9)
    err = core.refused(Op.QUOTA_TAKE, {"scope": "r", "quota": "api", "amount": 2})
    assert err.code == ErrorCode.QUOTA_EXHAUSTED
    assert err.details == {"level": 1.0, "limit": 10, "waiters": 0}
    assert level(core) == 1  # a refused take takes nothing


def test_an_amount_above_the_limit_is_invalid_argument_naming_the_limit(
    core: CoreDriver,
) -> None:
    err = core.refused(Op.QUOTA_TAKE, {"scope": "r", "quota": "api", "amount": 11, "wait": True})
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert "limit" in err.message and "10" in err.message


# ---- waiters -----------------------------------------------------------------------------


def test_a_waiter_is_served_by_a_timer_at_the_instant_its_amount_is_there(
    core: CoreDriver,
) -> None:
    take(core, 10)
    rid = wait_for(core, 3)
    core.drain()
    core.advance(2.9)
    assert core.drain() == []
    core.advance(0.11)
    messages = core.drain()
    assert served(messages) == [rid]
    reply = messages[0][1][2]
    assert reply["taken"] == 3
    assert reply["level"] < 0.2
    assert reply["waited_ms"] >= 3000
    # no waiter, no timer: nothing polls (run "s", made at setup and holding nothing,
    # is the one entry left: its end, runends.py)
    assert wheel_but_quiet_runs(core) == 0


def test_a_large_head_is_not_passed_by_small_waiters_behind_it(core: CoreDriver) -> None:
    take(core, 10)
    big = wait_for(core, 8, ALICE)
    small = [wait_for(core, 1, BOB) for _ in range(5)]
    core.drain()
    core.advance(7.0)  # 7 tokens: enough for all the small ones, not for the head
    assert served(core.drain()) == []
    core.advance(1.01)
    assert served(core.drain()) == [big]
    core.advance(1.01)
    assert served(core.drain()) == small[:1]


def test_a_non_waiting_take_does_not_pass_waiters(core: CoreDriver) -> None:
    take(core, 5)
    wait_for(core, 8)
    err = core.refused(Op.QUOTA_TAKE, {"scope": "r", "quota": "api", "amount": 1}, BOB)
    assert err.code == ErrorCode.QUOTA_EXHAUSTED
    assert err.details["waiters"] == 1


def test_a_withdrawn_head_lets_the_next_waiter_in_at_its_own_instant(core: CoreDriver) -> None:
    take(core, 10)
    head = wait_for(core, 9, ALICE)
    second = wait_for(core, 2, BOB)
    core.advance(1.0)
    core.drain()
    assert core.call(Op.CANCEL, {"request": head}, ALICE) == {"cancelled": True}
    core.advance(0.5)
    assert served(core.drain()) == []
    core.advance(0.51)  # 2 tokens at t=2
    assert served(core.drain()) == [second]


def test_waits_time_out_and_die_with_their_connection(core: CoreDriver) -> None:
    take(core, 10)
    rid = wait_for(core, 5, ALICE, timeout_ms=1000)
    wait_for(core, 1, CAROL)
    core.drain()
    core.advance(1.01)
    errors = [body for _, body in core.drain() if body[0] == Kind.ERROR]
    assert [(e[1], e[2]) for e in errors] == [(rid, "WAIT_TIMEOUT")]
    core.disconnected(CAROL)
    assert core.call(Op.QUOTA_INSPECT, {"name": "api"})["waiters"] == 0
    assert core.waits.total() == 0
    core.advance(10.0)
    assert served(core.drain()) == []
    assert level(core) == 10


def test_lowering_the_limit_below_a_waiters_amount_ends_that_wait(core: CoreDriver) -> None:
    take(core, 10)
    rid = wait_for(core, 8)
    small = wait_for(core, 1, BOB)
    core.drain()
    ensure(core, "api", 5, 5)
    messages = core.drain()
    errors = [body for _, body in messages if body[0] == Kind.ERROR]
    assert [(e[1], e[2]) for e in errors] == [(rid, "INVALID_ARGUMENT")]
    assert "5" in errors[0][3]
    core.advance(1.01)
    assert served(core.drain()) == [small]


def test_a_higher_rate_brings_the_heads_instant_forward(core: CoreDriver) -> None:
    take(core, 10)
    rid = wait_for(core, 5)
    core.drain()
    ensure(core, "api", 10, 1)  # 10 per second now
    core.advance(0.51)
    assert served(core.drain()) == [rid]


# ---- recovery ----------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["journal", "snapshot"])
def test_the_level_survives_recovery_and_refills_for_the_time_that_passed(
    core: CoreDriver, source: str
) -> None:
    core.now = 50.0
    take(core, 10)
    core.now = 52.0
    take(core, 2)  # level 0 at t=52
    core.drain()
    records = list(core.snapshot()) if source == "snapshot" else core.records
    # Restarted 3 s later, on a monotonic clock that starts again from 0.
    rebuilt = CoreDriver(mailbox=None, wall_offset=core.wall(55.0), runs=RUNS)
    for rec in records:
        rebuilt.apply(rec, 0.0)
    assert level(rebuilt) == pytest.approx(3.0)
    assert [r for r in core.records if r[0] == Rec.QUOTA_TAKEN][-1][3] == 0


def test_take_records_carry_the_level_and_instant_not_a_clock_read(core: CoreDriver) -> None:
    core.now = 3.0
    take(core, 4)
    core.drain()
    assert core.records[-1] == (Rec.QUOTA_TAKEN, "default", "api", 6.0, core.wall(3.0))


# ---- bounds ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"limit": 0, "per_seconds": 1}, "limit"),
        ({"limit": Limits.MAX_QUOTA_LIMIT + 1, "per_seconds": 1}, "limit"),
        ({"limit": 2.5, "per_seconds": 1}, "limit"),
        ({"limit": 5}, "per_seconds"),
        ({"limit": 5, "per_seconds": 0.5}, "per_seconds"),
        ({"limit": 5, "per_seconds": Limits.MAX_QUOTA_PER_SECONDS + 1}, "per_seconds"),
        ({"limit": 5, "per_seconds": float("nan")}, "per_seconds"),
    ],
)
def test_quota_settings_are_validated_naming_the_field(
    core: CoreDriver, args: dict[str, Any], field: str
) -> None:
    err = core.refused(Op.QUOTA_ENSURE, {"name": "q", **args})
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert field in err.message


@pytest.mark.parametrize("amount", [0, -1, 1.0, True, "1"])
def test_amount_must_be_a_positive_integer(core: CoreDriver, amount: Any) -> None:
    err = core.refused(Op.QUOTA_TAKE, {"scope": "r", "quota": "api", "amount": amount})
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert "amount" in err.message


def test_unknown_quotas_are_not_found(core: CoreDriver) -> None:
    for op, args in (
        (Op.QUOTA_TAKE, {"scope": "r", "quota": "nope"}),
        (Op.QUOTA_INSPECT, {"name": "nope"}),
    ):
        assert core.refused(op, args).code == ErrorCode.NOT_FOUND


def test_a_tenant_has_at_most_max_quotas_per_tenant(
    core: CoreDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Limits, "MAX_QUOTAS_PER_TENANT", 2)
    ensure(core, "b", 1, 1)
    err = core.refused(Op.QUOTA_ENSURE, {"name": "c", "limit": 1, "per_seconds": 1})
    assert err.code == ErrorCode.RESOURCE_EXHAUSTED
    assert "2 quotas" in err.message


def test_a_quota_has_at_most_max_waiters_per_quota(
    core: CoreDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Limits, "MAX_WAITERS_PER_QUOTA", 2)
    take(core, 10)
    wait_for(core, 1)
    wait_for(core, 1)
    err = core.refused(
        Op.QUOTA_TAKE, {"scope": "r", "quota": "api", "wait": True}, BOB
    )
    assert err.code == ErrorCode.RESOURCE_EXHAUSTED
    assert "2 waiters" in err.message


def test_a_cancelled_run_cannot_take(core: CoreDriver) -> None:
    core.call(Op.SCOPE_CANCEL, {"scope": "run-x"})
    err = core.refused(Op.QUOTA_TAKE, {"scope": "run-x", "quota": "api"})
    assert err.code == ErrorCode.SCOPE_CANCELLED


def test_ended_quota_and_pool_waits_leave_no_timer_and_no_wait(core: CoreDriver) -> None:
    """Served, cancelled, timed out, dropped with the connection: nothing is left."""
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    slot = core.call(Op.POOL_ACQUIRE, {"scope": "r", "pool": "gpu"})["lease"]
    take(core, 10)
    baseline = core.stats()
    for _ in range(3):
        served_rid = wait_for(core, 1, ALICE)
        cancelled = wait_for(core, 1, BOB)
        wait_for(core, 1, CAROL, timeout_ms=100)
        core.call(Op.POOL_ACQUIRE, {"scope": "r", "pool": "gpu", "wait": True}, CAROL)
        core.call(Op.CANCEL, {"request": cancelled}, BOB)
        core.advance(0.2)
        core.disconnected(CAROL)
        core.connected(CAROL, "carol")
        core.advance(1.0)
        assert served_rid in served(core.drain())
        left = int(level(core))
        if left:
            take(core, left)  # empty again
    core.call(Op.POOL_RELEASE, {"lease": slot})
    slot = core.call(Op.POOL_ACQUIRE, {"scope": "r", "pool": "gpu"})["lease"]
    after = core.stats()
    assert (after["waits"], after["timers"]) == (baseline["waits"], baseline["timers"])
    assert core.quotas.quotas[("default", "api")].timer_at is None
