"""Limits by key (core/work/keylimits.py) on the fake clock: a concurrency key lets at most
its limit of tasks run at once in their queue, a rate key at most its limit of deliveries
per period; a task held back by its key waits off the ready line, so tasks of other keys
or none go on; a freed slot (settled, retried, lost lease) or a turned period lets the
next held task go; the key's limit is its newest submit's; the same state comes back
from a replay, a snapshot and a slot move; bad input and the tenant's bound on keys are
refused with clear codes."""

from __future__ import annotations

from typing import Any

import pytest
from support.core import CoreDriver
from support.twoshards import move, placed, shard, slot

from rsd.core.ground.tenants import TenantLimits
from rsd.policy import Policy
from rsproto import ErrorCode, Limits, Op

TICK = 0.005


def submit(core: CoreDriver, data: Any = None, run: str = "s", **keys: Any) -> str:
    reply = core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": data, **keys})
    task_id: str = reply["id"]
    return task_id


def user(core: CoreDriver, data: Any, key: str = "user:42", limit: int = 2) -> str:
    return submit(core, data, concurrency_key=key, concurrency_limit=limit)


def api(core: CoreDriver, data: Any, limit: int = 10, period: float = 1.0) -> str:
    return submit(core, data, rate_key="api:openai", rate_limit=limit, rate_period_seconds=period)


def receive(core: CoreDriver, run: str = "s", **extra: Any) -> Any:
    return core.call(Op.RECEIVE, {"scope": run, "mailbox": "jobs", **extra}).get("delivery")


def receive_all(core: CoreDriver) -> list[dict[str, Any]]:
    """Receive until nothing can start; the deliveries (not settled)."""
    out = []
    while (delivery := receive(core)) is not None:
        out.append(delivery)
    return out


def complete(core: CoreDriver, delivery: dict[str, Any]) -> None:
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": None})


def status(core: CoreDriver, task_id: str) -> dict[str, Any]:
    view: dict[str, Any] = core.call(Op.TASK_STATUS, {"scope": "s", "task": task_id})
    return view


# ---- concurrency ---------------------------------------------------------------------------


def test_a_concurrency_key_of_2_runs_2_at_a_time_under_100_submits() -> None:
    core = CoreDriver()
    ids = [user(core, n) for n in range(100)]
    done: list[Any] = []
    running = receive_all(core)
    while running:
        assert len(running) <= 2
        assert len(running) == min(2, 100 - len(done))
        for delivery in running:
            done.append(delivery["data"])
            complete(core, delivery)
        running = receive_all(core)
    assert done == list(range(100))  # in submit order: a held line is first in, first out
    assert all(status(core, task_id)["state"] == "SUCCEEDED" for task_id in ids)
    assert core.work.keys.by_run == {} and core.work.keys.per_tenant == {}


def test_a_held_key_does_not_hold_back_other_keys_or_plain_tasks() -> None:
    core = CoreDriver()
    for n in range(5):
        user(core, f"a{n}", key="a", limit=1)
    user(core, "b0", key="b", limit=1)
    submit(core, "plain")
    got = [d["data"] for d in receive_all(core)]
    assert got == ["a0", "b0", "plain"]
    gate = core.work.keys.by_run[("default", "s")][("jobs", 0, "a")]
    assert len(gate.line) == 4 and core.scopes[("default", "s")].queues["jobs"].ready_count() == 0


def test_a_receive_does_not_walk_the_held_tasks_again() -> None:
    """Held tasks wait off the ready line: once held, a receive for new work of another
    key meets only that work, however many tasks its key holds back."""
    core = CoreDriver()
    for n in range(2000):
        user(core, n, key="hot", limit=1)
    first = receive(core)
    assert first["data"] == 0
    # the held are moved off in slices of a step's budget, one slice per receive
    queue = core.scopes[("default", "s")].queues["jobs"]
    receives = 0
    while queue.ready_count():
        assert receive(core) is None
        receives += 1
    assert receives <= 1999 // Policy.MAX_BLOCKED_PER_STEP + 1
    assert queue.blocked == 1999
    user(core, "cold", key="cold", limit=1)
    assert receive(core)["data"] == "cold"
    assert queue.blocked == 1999  # nothing was taken back onto the line to be looked at


def test_a_parked_consumer_gets_the_held_task_when_a_slot_frees() -> None:
    core = CoreDriver()
    user(core, "first", limit=1)
    user(core, "second", limit=1)
    first = receive(core)
    assert receive(core) is None
    parked = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True}, 2)
    assert parked is not None  # DEFERRED
    complete(core, first)
    replies = [m for m in core.drain() if isinstance(m, tuple) or m]
    assert any("second" in repr(m) for m in replies)


def test_a_retry_and_a_lost_lease_free_the_slot_and_come_back_through_the_gate() -> None:
    core = CoreDriver()
    user(core, "x", limit=1)
    user(core, "y", limit=1)
    x = receive(core, lease_seconds=Limits.MIN_LEASE_SECONDS)
    assert x["data"] == "x" and receive(core) is None
    core.call(Op.DELIVERY_RETRY, {"lease": x["lease"], "backoff_ms": 0})
    y = receive(core, lease_seconds=Limits.MIN_LEASE_SECONDS)
    assert y["data"] == "y"
    assert receive(core) is None  # x is back, and held by the gate y holds
    core.advance(Limits.MIN_LEASE_SECONDS + 1.0)  # y's lease is lost: its slot is free
    again = receive(core)
    assert again is not None and again["data"] in ("x", "y")
    assert receive(core) is None


def test_priorities_and_delays_pass_through_the_gate_in_order() -> None:
    """A key's room goes by priority among ready tasks, then first held first out; a
    delayed task meets the gate only once it is due, behind the tasks held before it."""
    core = CoreDriver()
    submit(core, "late", concurrency_key="k", concurrency_limit=1, delay_ms=1000)
    submit(core, "low", concurrency_key="k", concurrency_limit=1)
    submit(core, "high", concurrency_key="k", concurrency_limit=1, priority=9)
    first = receive(core)
    assert first["data"] == "high" and receive(core) is None  # low is held
    core.advance(1.0 + 2 * TICK)  # late is due: held too, behind low
    assert receive(core) is None
    order = []
    delivery = first
    while delivery is not None:
        complete(core, delivery)
        delivery = receive(core)
        if delivery is not None:
            order.append(delivery["data"])
    assert order == ["low", "late"]


def test_the_newest_submit_states_the_keys_limit() -> None:
    core = CoreDriver()
    for n in range(6):
        user(core, n, limit=1)
    assert len(receive_all(core)) == 1
    user(core, 6, limit=3)  # raised: two more may start now
    assert len(receive_all(core)) == 2
    status_view = status(core, user(core, 7, limit=3))
    assert status_view["limits"] == {"concurrency_key": "user:42", "concurrency_limit": 3}


def test_the_task_view_says_which_key_holds_it_back() -> None:
    core = CoreDriver()
    user(core, 0, limit=1)
    held = user(core, 1, limit=1)
    receive_all(core)
    view = status(core, held)
    assert view["held_by"] == {"kind": "concurrency", "key": "user:42", "limit": 1, "running": 1}


# ---- rate ----------------------------------------------------------------------------------


def test_a_rate_key_gives_its_limit_per_period_across_the_boundary() -> None:
    core = CoreDriver()
    for n in range(25):
        api(core, n)
    first = receive_all(core)
    assert [d["data"] for d in first] == list(range(10))
    for delivery in first:
        complete(core, delivery)
    core.advance(0.5)
    assert receive_all(core) == []  # the period is not over: done or not, 10 were delivered
    held = status(core, core.work.keys.by_run[("default", "s")][("jobs", 1, "api:openai")]
                  .line[-1].id)
    assert held["held_by"]["kind"] == "rate" and held["held_by"]["count"] == 10
    core.advance(0.5 + 2 * TICK)  # the period turned: ten more
    assert [d["data"] for d in receive_all(core)] == list(range(10, 20))
    core.advance(1.0 + 2 * TICK)
    assert [d["data"] for d in receive_all(core)] == list(range(20, 25))


def test_a_parked_consumer_is_served_when_the_period_turns() -> None:
    core = CoreDriver()
    api(core, "a", limit=1)
    api(core, "b", limit=1)
    assert receive(core)["data"] == "a"
    core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True, "timeout_ms": 5000}, 2)
    core.drain()
    core.advance(1.0 + 2 * TICK)
    assert any("'b'" in repr(m) for m in core.drain())


def test_a_rate_key_outlives_its_tasks_until_its_period_ends() -> None:
    """Finishing every task does not begin a new period early."""
    core = CoreDriver()
    api(core, "a", limit=1)
    complete(core, receive(core))
    api(core, "b", limit=1)
    assert receive(core) is None
    core.advance(1.0 + 2 * TICK)
    complete(core, receive(core))
    core.advance(1.0 + 2 * TICK)
    assert core.work.keys.by_run == {} and core.work.keys.per_tenant == {}


def test_a_newer_submit_with_a_shorter_period_lets_the_held_go_at_its_end() -> None:
    """The newest submit states the period too: a shorter one ends the current period
    sooner, and the held tasks go then, not at the end the longer one had set."""
    core = CoreDriver()
    api(core, "a", limit=1, period=60.0)
    api(core, "b", limit=1, period=60.0)
    assert receive(core)["data"] == "a"
    assert receive(core) is None  # b is held until 60 s
    api(core, "c", limit=1, period=2.0)
    core.advance(2.0 + 2 * TICK)
    assert receive(core)["data"] == "b"


def test_both_keys_on_one_task_are_both_kept() -> None:
    core = CoreDriver()
    for n in range(4):
        submit(core, n, concurrency_key="u", concurrency_limit=2, rate_key="r", rate_limit=3)
    got = receive_all(core)
    assert len(got) == 2
    for delivery in got:
        complete(core, delivery)
    assert [d["data"] for d in receive_all(core)] == [2]  # rate: 3 in this period
    core.advance(1.0 + 2 * TICK)
    assert [d["data"] for d in receive_all(core)] == [3]


# ---- durable and derived ---------------------------------------------------------------


def scenario() -> CoreDriver:
    core = CoreDriver()
    for n in range(5):
        user(core, f"u{n}", limit=2)
    for n in range(4):
        api(core, f"r{n}", limit=3, period=10.0)
    submit(core, "both", concurrency_key="user:42", concurrency_limit=2, rate_key="api:openai",
           rate_limit=3, rate_period_seconds=10.0)
    running = receive_all(core)
    complete(core, running[0])
    core.advance(1.0)
    core.drain()
    return core


def state_of(core: CoreDriver) -> dict[str, Any]:
    keys = core.work.keys
    return {
        "gates": {
            (run, gk): (g.limit, g.period, g.running, g.start, g.count, g.carriers)
            for run, gates in keys.by_run.items() for gk, g in gates.items()
        },
        "per_tenant": dict(keys.per_tenant),
        "states": {i: (it.state.value, None if it.terminal else getattr(it.limits, "keys", None))
                   for i, it in core.work.items.items()},
    }


def drained(core: CoreDriver, rounds: int = 4) -> list[Any]:
    out = []
    for _ in range(rounds):
        for delivery in receive_all(core):
            out.append(delivery["data"])
            complete(core, delivery)
        core.advance(10.0 + 2 * TICK)
    return out


@pytest.mark.parametrize("how", ["replay", "snapshot"])
def test_replay_and_snapshot_rebuild_the_key_counts_as_live(how: str) -> None:
    core = scenario()
    rebuilt = core.rebuilt(from_snapshot=how == "snapshot")
    assert state_of(rebuilt) == state_of(core)
    assert sorted(drained(rebuilt)) == sorted(drained(core))
    assert state_of(rebuilt) == state_of(core)


def test_a_record_applied_twice_changes_nothing() -> None:
    core = scenario()
    rebuilt = core.replay(core.records + core.records[-8:])
    rebuilt.now = core.now
    assert state_of(rebuilt) == state_of(core)


def test_a_moved_run_keeps_its_keys_running_counts_and_period() -> None:
    a, b = shard("a", 1), shard("b", 2)
    run = placed("k")
    a.create_runs(run)
    for n in range(3):
        submit(a, f"u{n}", run, concurrency_key="u", concurrency_limit=1)
    for n in range(3):
        submit(a, f"r{n}", run, rate_key="r", rate_limit=1, rate_period_seconds=10.0)
    got = [receive(a, run), receive(a, run)]
    assert receive(a, run) is None
    a.drain()
    b.advance(a.now)
    assert move(a, b, slot(run))["runs"] == 1
    assert receive(b, run) is None  # u0 runs, r0's period holds the rest, as on a
    gates = b.work.keys.by_run[("default", run)]
    assert gates[("jobs", 0, "u")].running == 1 and gates[("jobs", 1, "r")].count == 1
    assert {d["data"] for d in got} == {"u0", "r0"}


# ---- bad input and bounds ----------------------------------------------------------------


@pytest.mark.parametrize(("args", "words"), [
    ({"concurrency_key": "k"}, "go together"),
    ({"concurrency_limit": 2}, "go together"),
    ({"concurrency_key": "k", "concurrency_limit": 0}, "between 1"),
    ({"concurrency_key": "k", "concurrency_limit": Limits.MAX_CONCURRENCY_LIMIT + 1}, "between 1"),
    ({"concurrency_key": "k", "concurrency_limit": 1.5}, "integer"),
    ({"concurrency_key": "", "concurrency_limit": 1}, "concurrency_key"),
    ({"concurrency_key": "k" * (Limits.MAX_KEY_BYTES + 1), "concurrency_limit": 1},
     "concurrency_key"),
    ({"rate_limit": 5}, "need a rate_key"),
    ({"rate_period_seconds": 1}, "need a rate_key"),
    ({"rate_key": "r"}, "needs its rate_limit"),
    ({"rate_key": "r", "rate_limit": 0}, "between 1"),
    ({"rate_key": "r", "rate_limit": Limits.MAX_RATE_LIMIT + 1}, "between 1"),
    ({"rate_key": "r", "rate_limit": 1, "rate_period_seconds": 0}, "between"),
    ({"rate_key": "r", "rate_limit": 1, "rate_period_seconds": Limits.MAX_RATE_PERIOD_SECONDS + 1},
     "between"),
    ({"rate_key": "r", "rate_limit": 1, "rate_period_seconds": float("nan")}, "NaN"),
    ({"rate_key": 7, "rate_limit": 1}, "rate_key"),
])
def test_bad_key_limits_are_invalid_and_leave_nothing(args: dict[str, Any], words: str) -> None:
    core = CoreDriver()
    error = core.refused(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 1, **args})
    assert error.code is ErrorCode.INVALID_ARGUMENT and words in error.message
    assert core.work.items == {} and core.work.keys.by_run == {}


def test_a_message_carries_no_key_limits() -> None:
    core = CoreDriver()
    error = core.refused(Op.MESSAGE_SEND, {
        "scope": "s", "mailbox": "jobs", "data": 1, "concurrency_key": "k",
        "concurrency_limit": 1,
    })
    assert error.code is ErrorCode.INVALID_ARGUMENT and "TASK_SUBMIT" in error.message


def test_the_tenants_keys_are_bounded_and_free_again_once_their_tasks_end() -> None:
    core = CoreDriver(tenant_limits=TenantLimits(limit_keys=5))
    for n in range(5):
        user(core, n, key=f"k{n}")
    for n in range(5, 20):  # trying to make more keys than the bound
        error = core.refused(Op.TASK_SUBMIT, {
            "scope": "s", "mailbox": "jobs", "data": n, "concurrency_key": f"k{n}",
            "concurrency_limit": 1,
        })
        assert error.code is ErrorCode.RESOURCE_EXHAUSTED
        assert error.details == {"limit": "max_limit_keys_per_tenant", "value": 5}
    user(core, "again", key="k3")  # a live key: no new one
    assert core.work.keys.per_tenant == {"default": 5} and len(core.work.items) == 6
    error = core.refused(Op.TASK_SUBMIT, {  # a rate key counts too
        "scope": "s", "mailbox": "jobs", "data": 1, "rate_key": "r", "rate_limit": 1,
    })
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED
    for delivery in receive_all(core):
        complete(core, delivery)
    for delivery in receive_all(core):
        complete(core, delivery)
    assert core.work.keys.per_tenant == {}
    user(core, "new", key="k9")


def test_the_default_bound_is_the_policys() -> None:
    assert TenantLimits().limit_keys == Policy.MAX_LIMIT_KEYS_PER_TENANT == 100_000
