"""Tasks and messages that need capacity (``needs``), in the pure core on a fake clock.

Each test is named after the rule it protects: delivery only with every slot and amount
at once (no partial holding, so no deadlock), a blocked task not blocking others, slots
held under the delivery's lease and freed however it ends, quota spent and not refunded,
wakes that touch only the pool or quota with room, bounded receives, idempotency,
validation and recovery.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CAROL, DAVE, CoreDriver, next_rid, on_disk

from rsd.core import DEFERRED
from rsd.core.records import FORMAT_VERSION, Rec
from rsd.core.upgrade import upgrade
from rsd.policy import Policy
from rsproto import ErrorCode, Kind, Limits, Op, Push


@pytest.fixture
def core() -> CoreDriver:
    core = CoreDriver()
    core.run = core.call(Op.SCOPE_CREATE, {})["scope"]  # type: ignore[attr-defined]
    for name, size in (("gpu", 1), ("a", 1), ("b", 1), ("cpu", 4)):
        core.call(Op.POOL_ENSURE, {"name": name, "size": size})
    core.call(Op.QUOTA_ENSURE, {"name": "openai", "limit": 10, "per_seconds": 100})
    core.drain()
    return core


def submit(core: CoreDriver, needs: Any = None, key: str | None = None, **extra: Any) -> Any:
    args = {"scope": core.run, "mailbox": "jobs", "data": extra.pop("data", None), **extra}
    if needs is not None:
        args["needs"] = needs
    if key is not None:
        args["key"] = key
    return core.call(Op.TASK_SUBMIT, args)


def receive(core: CoreDriver, conn: int = BOB, rid: int | None = None, **extra: Any) -> Any:
    args = {"scope": core.run, "mailbox": "jobs", **extra}
    reply = core.call(Op.RECEIVE, args, conn, rid=rid)
    return reply if reply is DEFERRED else reply["delivery"]


def park(core: CoreDriver, conn: int = BOB) -> int:
    rid = next_rid()
    assert receive(core, conn, rid=rid, wait=True, timeout_ms=600_000) is DEFERRED
    return rid


def delivered(messages: list[Any]) -> dict[int, dict[str, Any]]:
    """Deferred RECEIVE replies that carry a delivery, by request id."""
    return {
        body[1]: body[2]["delivery"]
        for _, body in messages
        if body[0] == Kind.REPLY and isinstance(body[2], dict) and body[2].get("delivery")
    }


def settle(core: CoreDriver, op: int, lease: bytes, conn: int = BOB, **extra: Any) -> Any:
    return core.call(op, {"lease": lease, **extra}, conn)


def pool(core: CoreDriver, name: str = "gpu") -> dict[str, Any]:
    return core.call(Op.POOL_INSPECT, {"name": name})


def level(core: CoreDriver, name: str = "openai") -> float:
    return core.call(Op.QUOTA_INSPECT, {"name": name})["level"]


def status(core: CoreDriver, task: dict[str, Any]) -> dict[str, Any]:
    return core.call(Op.TASK_STATUS, {"scope": core.run, "task": task["id"]})


# ---- delivery only with all the capacity, taken at once ---------------------------------


def test_a_task_needing_a_pool_starts_only_while_a_slot_is_free_and_holds_it(
    core: CoreDriver,
) -> None:
    first = submit(core, {"pools": ["gpu"]})
    second = submit(core, {"pools": ["gpu"]})
    assert first["needs"] == {"pools": ["gpu"], "quotas": {}}
    got = receive(core)
    assert got["id"] == first["id"]
    view = pool(core)
    assert view["held"] == 1 and view["holders"][0]["item"] == first["id"]
    assert view["holders"][0]["run"] == core.run
    assert receive(core, CAROL) is None
    assert status(core, second)["waiting_for"] == {"pools": ["gpu"], "quotas": {}}
    assert status(core, second)["state"] == "PENDING"
    # The slot is held under the delivery's lease: renewed with it, like any lease.
    core.now = 20.0
    assert core.call(Op.LEASE_RENEW, {"leases": [got["lease"]]}, BOB)["results"] == [None]
    core.now = 45.0
    core.advance(0)
    assert pool(core)["held"] == 1


def test_a_parked_consumer_gets_a_blocked_task_pushed_when_the_slot_frees(
    core: CoreDriver,
) -> None:
    submit(core, {"pools": ["gpu"]})
    second = submit(core, {"pools": ["gpu"]})
    lease = receive(core)["lease"]
    rid = park(core, CAROL)
    core.drain()
    settle(core, Op.DELIVERY_COMPLETE, lease, outcome=1)
    got = delivered(core.drain())
    assert got[rid]["id"] == second["id"]
    assert pool(core)["holders"][0]["item"] == second["id"]
    assert "waiting_for" in status(core, second) and status(core, second)["waiting_for"] is None


def test_pools_named_in_another_order_are_taken_whole_so_nothing_deadlocks(
    core: CoreDriver,
) -> None:
    ab = submit(core, {"pools": ["a", "b"]})
    ba = submit(core, {"pools": ["b", "a"]})
    assert ba["needs"]["pools"] == ["a", "b"]
    first = receive(core, BOB)
    assert first["id"] == ab["id"]
    assert receive(core, CAROL) is None  # needs both: holds neither meanwhile
    assert pool(core, "a")["holders"][0]["item"] == ab["id"]
    assert pool(core, "b")["holders"][0]["item"] == ab["id"]
    rid = park(core, CAROL)
    core.drain()
    settle(core, Op.DELIVERY_COMPLETE, first["lease"])
    assert delivered(core.drain())[rid]["id"] == ba["id"]


def test_nothing_is_held_partly_while_one_needed_pool_is_full(core: CoreDriver) -> None:
    held = core.call(Op.POOL_ACQUIRE, {"scope": core.run, "pool": "b"}, DAVE)
    task = submit(core, {"pools": ["a", "b"]})
    assert receive(core) is None
    assert pool(core, "a")["held"] == 0  # a is free for anyone else
    assert core.call(Op.POOL_ACQUIRE, {"scope": core.run, "pool": "a"}, DAVE)["lease"]
    assert status(core, task)["waiting_for"] == {"pools": ["a"], "quotas": {}} or status(
        core, task
    )["waiting_for"] == {"pools": ["b"], "quotas": {}}
    core.call(Op.POOL_RELEASE, {"lease": held["lease"]}, DAVE)
    assert receive(core) is None  # a is now held by DAVE's acquire


def test_a_capacity_blocked_task_does_not_block_the_tasks_behind_it(core: CoreDriver) -> None:
    core.call(Op.POOL_ACQUIRE, {"scope": core.run, "pool": "gpu"}, DAVE)
    blocked = submit(core, {"pools": ["gpu"]})
    plain = submit(core)
    other = submit(core, {"pools": ["cpu"]})
    assert receive(core)["id"] == plain["id"]
    assert receive(core)["id"] == other["id"]
    assert receive(core) is None
    assert status(core, blocked)["waiting_for"] == {"pools": ["gpu"], "quotas": {}}
    # A later task without needs is not held up either, nor are parked consumers.
    rid = park(core, CAROL)
    core.drain()
    late = submit(core)
    assert delivered(core.drain())[rid]["id"] == late["id"]


def test_pool_acquire_waiters_are_served_before_blocked_tasks(core: CoreDriver) -> None:
    holder = core.call(Op.POOL_ACQUIRE, {"scope": core.run, "pool": "gpu"}, DAVE)
    submit(core, {"pools": ["gpu"]})
    assert receive(core) is None
    rid = park(core, BOB)
    acquire_rid = next_rid()
    args = {"scope": core.run, "pool": "gpu", "wait": True}
    assert core.call(Op.POOL_ACQUIRE, args, CAROL, rid=acquire_rid) is DEFERRED
    core.drain()
    core.call(Op.POOL_RELEASE, {"lease": holder["lease"]}, DAVE)
    messages = core.drain()
    assert rid not in delivered(messages)
    granted = [body[2] for _, body in messages if body[0] == Kind.REPLY and body[1] == acquire_rid]
    core.call(Op.POOL_RELEASE, {"lease": granted[0]["lease"]}, CAROL)
    assert rid in delivered(core.drain())


# ---- slots freed however the delivery ends ------------------------------------------------


@pytest.mark.parametrize(
    "ending",
    ["complete", "retry", "release", "reject", "expiry", "cancel", "deadline", "run-cancel"],
)
def test_slots_are_freed_when_the_delivery_ends_whatever_the_way(
    core: CoreDriver, ending: str
) -> None:
    deadline = core.wall(10.0) if ending == "deadline" else None
    task = submit(core, {"pools": ["gpu", "cpu"]}, deadline=deadline)
    lease = receive(core)["lease"]
    rid = next_rid()
    # the waiter is in another run: a cancelled run's own waits end with it
    core.create_runs("waiter-run", conn=CAROL)
    args = {"scope": "waiter-run", "pool": "gpu", "wait": True, "timeout_ms": 600_000}
    assert core.call(Op.POOL_ACQUIRE, args, CAROL, rid=rid) is DEFERRED
    core.drain()
    if ending == "expiry":
        core.advance(31)
    elif ending == "cancel":
        core.call(Op.TASK_CANCEL, {"scope": core.run, "task": task["id"]})
    elif ending == "deadline":
        core.advance(10.01)
    elif ending == "run-cancel":
        core.call(Op.SCOPE_CANCEL, {"scope": core.run, "reason": "enough"})
    else:
        op = {"complete": Op.DELIVERY_COMPLETE, "retry": Op.DELIVERY_RETRY,
              "release": Op.DELIVERY_RELEASE, "reject": Op.DELIVERY_REJECT}[ending]
        settle(core, op, lease)
    messages = core.drain()
    grants = [body for _, body in messages if body[0] == Kind.REPLY and body[1] == rid]
    assert grants and "lease" in grants[0][2], f"the waiter got no slot after {ending}"
    assert pool(core, "cpu")["held"] == 0
    if ending in ("expiry", "cancel", "deadline", "run-cancel"):
        assert any(body[0] == Kind.PUSH and body[1] == Push.LEASE_LOST for _, body in messages)


def test_quota_is_spent_at_delivery_and_not_refunded(core: CoreDriver) -> None:
    submit(core, {"quotas": {"openai": 4}})
    lease = receive(core)["lease"]
    assert level(core) == pytest.approx(6)
    settle(core, Op.DELIVERY_RETRY, lease, delay_ms=0)
    assert level(core) == pytest.approx(6)  # spent, whatever became of the attempt
    lease = receive(core)["lease"]
    assert level(core) == pytest.approx(2)  # each delivery spends again
    settle(core, Op.DELIVERY_REJECT, lease)
    assert level(core) == pytest.approx(2)


def test_a_task_blocked_on_a_quota_is_pushed_at_the_refill_instant(core: CoreDriver) -> None:
    core.call(Op.QUOTA_ENSURE, {"name": "slow", "limit": 2, "per_seconds": 10})
    submit(core, {"quotas": {"slow": 2}})
    second = submit(core, {"quotas": {"slow": 2}})
    receive(core)
    assert receive(core, CAROL) is None
    assert status(core, second)["waiting_for"] == {"pools": [], "quotas": {"slow": 2}}
    rid = park(core, CAROL)
    core.drain()
    core.advance(9.9)
    assert rid not in delivered(core.drain())
    core.advance(0.2)
    assert delivered(core.drain())[rid]["id"] == second["id"]


def test_quota_takers_that_wait_go_before_blocked_tasks(core: CoreDriver) -> None:
    core.call(Op.QUOTA_ENSURE, {"name": "slow", "limit": 2, "per_seconds": 10})
    core.call(Op.QUOTA_TAKE, {"scope": core.run, "quota": "slow", "amount": 2}, DAVE)
    submit(core, {"quotas": {"slow": 2}})
    assert receive(core) is None
    rid = park(core)
    take = next_rid()
    args = {"scope": core.run, "quota": "slow", "amount": 2, "wait": True}
    assert core.call(Op.QUOTA_TAKE, args, DAVE, rid=take) is DEFERRED
    core.drain()
    core.advance(10.1)
    messages = core.drain()
    assert any(body[1] == take for _, body in messages if body[0] == Kind.REPLY)
    assert rid not in delivered(messages)
    core.advance(10.1)
    assert rid in delivered(core.drain())


def test_a_larger_pool_and_a_raised_quota_limit_release_blocked_tasks(core: CoreDriver) -> None:
    core.call(Op.POOL_ACQUIRE, {"scope": core.run, "pool": "gpu"}, DAVE)
    gpu_task = submit(core, {"pools": ["gpu"]})
    quota_task = submit(core, {"quotas": {"openai": 8}})
    assert receive(core)["id"] == quota_task["id"]  # level 10 -> 2
    core.call(Op.QUOTA_ENSURE, {"name": "openai", "limit": 5, "per_seconds": 100})
    again = submit(core, {"quotas": {"openai": 5}})
    assert receive(core) is None
    rid = park(core)
    core.drain()
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 2})
    assert delivered(core.drain())[rid]["id"] == gpu_task["id"]
    rid = park(core)
    core.drain()
    core.call(Op.QUOTA_ENSURE, {"name": "openai", "limit": 10, "per_seconds": 1})
    core.advance(1)
    assert delivered(core.drain())[rid]["id"] == again["id"]


def test_a_pool_shrunk_below_its_holders_releases_blocked_tasks_only_when_below_its_size(
    core: CoreDriver,
) -> None:
    first = submit(core, {"pools": ["cpu"]})
    leases = [receive(core)["lease"] for _ in range(1)]
    others = [core.call(Op.POOL_ACQUIRE, {"scope": core.run, "pool": "cpu"}, DAVE)
              for _ in range(3)]
    core.call(Op.POOL_ENSURE, {"name": "cpu", "size": 2})
    late = submit(core, {"pools": ["cpu"]})
    rid = park(core)
    core.drain()
    settle(core, Op.DELIVERY_COMPLETE, leases[0])
    core.call(Op.POOL_RELEASE, {"lease": others[0]["lease"]}, DAVE)
    assert rid not in delivered(core.drain())  # 2 held, size 2
    core.call(Op.POOL_RELEASE, {"lease": others[1]["lease"]}, DAVE)
    assert delivered(core.drain())[rid]["id"] == late["id"]
    assert first["id"] != late["id"]


# ---- cost and bounds -------------------------------------------------------------------------


def test_a_freed_slot_wakes_only_the_tasks_that_need_that_pool(core: CoreDriver) -> None:
    held = core.call(Op.POOL_ACQUIRE, {"scope": core.run, "pool": "a"}, DAVE)
    core.call(Op.POOL_ACQUIRE, {"scope": core.run, "pool": "b"}, DAVE)
    for _ in range(50):
        submit(core, {"pools": ["b"]})
    submit(core, {"pools": ["a"]})
    assert receive(core) is None
    b_line = core.blocked.lines[core.pools.pools[("default", "b")]]
    before = list(b_line.items)
    core.call(Op.POOL_RELEASE, {"lease": held["lease"]}, DAVE)
    assert list(b_line.items) == before  # the line of b was not touched
    assert receive(core) is not None  # the task needing a was offered again and starts


def test_a_receive_examines_a_bounded_number_of_blocked_items_then_resumes_in_slices(
    core: CoreDriver,
) -> None:
    core.call(Op.POOL_ACQUIRE, {"scope": core.run, "pool": "gpu"}, DAVE)
    step = Policy.MAX_BLOCKED_PER_STEP
    for _ in range(2 * step + 10):
        submit(core, {"pools": ["gpu"]})
    plain = submit(core)
    gpu_line = lambda: len(core.blocked.lines[core.pools.pools[("default", "gpu")]].items)  # noqa: E731
    assert receive(core) is None
    assert gpu_line() == step  # one step's worth, no more
    rid = park(core)
    core.drain()
    assert gpu_line() == 2 * step
    ticks = 0
    while rid not in (got := delivered(core.drain())) and ticks < 10:
        core.advance(0.01)
        ticks += 1
    assert got[rid]["id"] == plain["id"]
    assert ticks <= 2


def test_blocked_items_that_end_leave_no_memory_behind(core: CoreDriver) -> None:
    core.call(Op.POOL_ACQUIRE, {"scope": core.run, "pool": "gpu"}, DAVE)
    tasks = [submit(core, {"pools": ["gpu"]}) for _ in range(100)]
    assert receive(core) is None
    for task in tasks:
        core.call(Op.TASK_CANCEL, {"scope": core.run, "task": task["id"]})
    assert core.pools.pools[("default", "gpu")] not in core.blocked.lines


# ---- input -----------------------------------------------------------------------------------


def test_the_same_key_with_other_needs_is_an_idempotency_conflict(core: CoreDriver) -> None:
    first = submit(core, {"pools": ["gpu"], "quotas": {"openai": 2}}, key="k", data=1)
    same = submit(core, {"quotas": {"openai": 2}, "pools": ["gpu"]}, key="k", data=1)
    assert same["id"] == first["id"] and same["created"] is False
    for other in ({"pools": ["gpu"]}, {"pools": ["cpu"], "quotas": {"openai": 2}},
                  {"pools": ["gpu"], "quotas": {"openai": 3}}, None):
        args = {"scope": core.run, "mailbox": "jobs", "key": "k", "data": 1, "needs": other}
        err = core.refused(Op.TASK_SUBMIT, args)
        assert err.code == ErrorCode.IDEMPOTENCY_CONFLICT, other


def test_needs_are_checked_against_the_tenants_pools_and_quotas(core: CoreDriver) -> None:
    base = {"scope": core.run, "mailbox": "jobs", "data": None}
    cases = [
        ({"pools": ["nope"]}, ErrorCode.NOT_FOUND, "pool 'nope' does not exist"),
        ({"quotas": {"nope": 1}}, ErrorCode.NOT_FOUND, "quota 'nope' does not exist"),
        ({"quotas": {"openai": 11}}, ErrorCode.INVALID_ARGUMENT, "above the limit"),
        ({"quotas": {"openai": 0}}, ErrorCode.INVALID_ARGUMENT, "needs.quotas"),
        ({"quotas": {"openai": 1.5}}, ErrorCode.INVALID_ARGUMENT, "integer"),
        ({"pools": "gpu"}, ErrorCode.INVALID_ARGUMENT, "array"),
        ({"pools": ["gpu", "gpu"]}, ErrorCode.INVALID_ARGUMENT, "twice"),
        ({"gpus": 1}, ErrorCode.INVALID_ARGUMENT, "needs must be a map"),
        ([1], ErrorCode.INVALID_ARGUMENT, "needs must be a map"),
        ({"pools": [f"p{i}" for i in range(Limits.MAX_NEEDS_POOLS + 1)]},
         ErrorCode.INVALID_ARGUMENT, f"the limit is {Limits.MAX_NEEDS_POOLS}"),
        ({"quotas": {f"q{i}": 1 for i in range(Limits.MAX_NEEDS_QUOTAS + 1)}},
         ErrorCode.INVALID_ARGUMENT, f"the limit is {Limits.MAX_NEEDS_QUOTAS}"),
    ]
    for needs, code, words in cases:
        for op in (Op.TASK_SUBMIT, Op.MESSAGE_SEND):
            err = core.refused(op, {**base, "needs": needs})
            assert err.code == code and words in err.message, (needs, err.message)
    assert core.call(Op.TASK_SUBMIT, {**base, "needs": {}})["created"] is True


def test_another_tenants_pool_does_not_exist_for_needs() -> None:
    core = CoreDriver(tenants={BOB: ("other", False)})
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    run = core.call(Op.SCOPE_CREATE, {}, BOB)["scope"]
    args = {"scope": run, "mailbox": "jobs", "data": None, "needs": {"pools": ["gpu"]}}
    assert core.refused(Op.TASK_SUBMIT, args, BOB).code == ErrorCode.NOT_FOUND


def test_a_message_with_needs_is_delivered_with_its_capacity(core: CoreDriver) -> None:
    args = {"scope": core.run, "mailbox": "jobs", "data": "m", "needs": {"pools": ["gpu"]}}
    core.call(Op.MESSAGE_SEND, args)
    core.call(Op.MESSAGE_SEND, args)
    got = receive(core)
    assert got["kind"] == "message" and pool(core)["holders"][0]["item"] == got["id"]
    assert receive(core) is None
    settle(core, Op.DELIVERY_COMPLETE, got["lease"])
    assert receive(core) is not None


# ---- recovery --------------------------------------------------------------------------------


def as_version_4(records: list[Any]) -> list[Any]:
    """``records`` as format version 4 wrote them (then read back as rsd reads such a
    file): the needs in ITEM_ENQUEUED_NEEDS and SNAP_ITEM_NEEDS records of their own."""
    old: list[Any] = []
    for rec in map(on_disk, records):
        if rec[0] == Rec.ITEM_ENQUEUED:
            rec = rec[:11] if rec[11] is None else [Rec.ITEM_ENQUEUED_NEEDS, *rec[1:13]]
        elif rec[0] == Rec.FINISHED:
            rec = rec[:8]
        elif rec[0] == Rec.SNAP_ITEM:
            needs = rec[21:23]
            rec = rec[:21]
            if needs[0] is not None:
                old += [rec, [Rec.SNAP_ITEM_NEEDS, rec[1], *needs]]
                continue
        old.append(rec)
    assert {Rec.ITEM_ENQUEUED_NEEDS, Rec.SNAP_ITEM_NEEDS} & {rec[0] for rec in old}
    return [upgrade(rec, 4) for rec in old]


@pytest.mark.parametrize("version", [4, FORMAT_VERSION])
def test_recovery_keeps_a_running_deliverys_slots_and_its_tasks_needs(
    core: CoreDriver, version: int
) -> None:
    running = submit(core, {"pools": ["gpu"], "quotas": {"openai": 3}})
    waiting = submit(core, {"pools": ["gpu"]})
    lease = receive(core)["lease"]
    assert receive(core) is None
    core.drain()
    layout = as_version_4 if version == 4 else list
    from_journal = core.replay(layout(core.records))
    snap = list(core.snapshot())
    from_snapshot = core.replay(layout(snap))
    for rebuilt in (from_journal, from_snapshot):
        rebuilt.connected(BOB, "bob")
        rebuilt.connected(CAROL, "carol")
        rebuilt.run = core.run  # type: ignore[attr-defined]
        view = pool(rebuilt)
        assert view["held"] == 1 and view["holders"][0]["item"] == running["id"]
        assert level(rebuilt) == pytest.approx(7)
        assert status(rebuilt, waiting)["needs"] == {"pools": ["gpu"], "quotas": {}}
        assert receive(rebuilt, CAROL) is None  # the slot is still taken
        rid = park(rebuilt, CAROL)
        rebuilt.drain()
        settle(rebuilt, Op.DELIVERY_COMPLETE, lease)
        assert delivered(rebuilt.drain())[rid]["id"] == waiting["id"]
    assert ALICE  # every connection of the driver stays as it was


def test_a_wake_moves_a_bounded_number_of_blocked_items_per_step(core: CoreDriver) -> None:
    holder = core.call(Op.POOL_ACQUIRE, {"scope": core.run, "pool": "gpu"}, DAVE)
    step = Policy.MAX_BLOCKED_PER_STEP
    tasks = [submit(core, {"pools": ["gpu"]}) for _ in range(2 * step + 5)]
    for _ in range(3):  # each receive blocks one step's worth
        assert receive(core) is None
    gpu = core.pools.pools[("default", "gpu")]
    assert len(core.blocked.lines[gpu].items) == len(tasks)
    core.call(Op.POOL_RELEASE, {"lease": holder["lease"]}, DAVE)  # nobody receives now
    assert len(core.blocked.lines[gpu].items) == len(tasks) - step
    core.advance(0.01)
    core.advance(0.01)
    assert gpu not in core.blocked.lines  # all back in the ready line, a step at a time
    assert core.call(Op.QUEUE_INSPECT, {"scope": core.run, "mailbox": "jobs"})["ready"] == len(
        tasks
    )
