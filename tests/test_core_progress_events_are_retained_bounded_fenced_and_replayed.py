"""DELIVERY_PROGRESS and TASK_EVENTS on the pure core (fake clock): a task's progress
events and the state changes between them are retained (the last EVENTS_RETAINED, at
most EVENTS_RETAINED_BYTES of data; older ones dropped and counted as missed), pushed to
every subscriber with the outcome last, fenced by the delivery's lease as a completion
is, bounded (event size, per-task rate, tenant bytes, subscriptions per connection),
kept until the task's tombstone, and rebuilt alike by a replay of the journal and by a
snapshot. A task that never publishes progress has events from its first follower on
(one TASK_FOLLOWED record a task at most): its state changes, WAITING too.
"""

from __future__ import annotations

from typing import Any

from support.core import ALICE, BOB, CAROL, HOLDERS, CoreDriver, on_disk
from support.twoshards import move, placed, shard, slot

from rsd.core import Rec
from rsd.core.ground.tenants import TenantLimits
from rsproto import ErrorCode, Kind, Limits, Op, Push

BOX = {"scope": "s", "mailbox": "jobs"}
RETENTION = 60.0


def a_core(**options: Any) -> CoreDriver:
    options.setdefault("retention_seconds", RETENTION)
    options.setdefault("tombstone_seconds", RETENTION)
    return CoreDriver(**options)


def running(core: CoreDriver, data: Any = "job", **submit: Any) -> tuple[str, bytes]:
    """A submitted task, delivered: its id and its delivery's lease."""
    task = core.call(Op.TASK_SUBMIT, {**BOX, "data": data, **submit})["id"]
    delivery = core.call(Op.RECEIVE, {**BOX, "lease_seconds": 10})["delivery"]
    assert delivery["task_id"] == task
    return task, delivery["lease"]


def publish(core: CoreDriver, lease: bytes, data: Any, conn: int = ALICE) -> int:
    return int(core.call(Op.DELIVERY_PROGRESS, {"lease": lease, "data": data}, conn)["seq"])


def events(core: CoreDriver, task: str, after: int = 0, conn: int = ALICE) -> dict[str, Any]:
    return dict(core.call(Op.TASK_EVENTS, {"scope": "s", "task": task, "after": after}, conn))


def pushed(core: CoreDriver) -> list[tuple[int, dict[str, Any]]]:
    """The TASK_EVENTS pushes since the last drain: (connection, body)."""
    return [
        (conn, msg[2]) for conn, msg in core.drain()
        if msg[0] == Kind.PUSH and msg[1] == Push.TASK_EVENTS
    ]


def shape(event: dict[str, Any]) -> tuple[Any, ...]:
    kind = event["kind"]
    if kind == "progress":
        return (event["seq"], kind, event["data"])
    if kind == "state":
        return (event["seq"], kind, event["state"], event["attempt"])
    return (event["seq"], kind, event["state"], event["outcome"])


def test_progress_and_state_changes_are_pushed_in_order_with_the_outcome_last() -> None:
    core = a_core()
    task, lease = running(core)
    reply = events(core, task)  # its first follower: seq 1 says where the task is
    assert ([shape(e) for e in reply["events"]], reply["state"], reply["attempt"],
            reply["done"]) == ([(1, "state", "RUNNING", 1)], "RUNNING", 1, False)
    events(core, task, conn=BOB)  # a second subscriber, on another connection
    core.drain()
    assert publish(core, lease, {"pct": 50}) == 2
    got = pushed(core)
    assert [conn for conn, _ in got] == [ALICE, BOB]
    assert got[0][1] is got[1][1]  # one message, shared by every subscriber
    assert shape(got[0][1]["events"][0]) == (2, "progress", {"pct": 50})
    # A retry: PENDING, then RUNNING with the next attempt, each an event.
    core.call(Op.DELIVERY_RETRY, {"lease": lease, "delay_ms": 0})
    lease = core.call(Op.RECEIVE, BOX)["delivery"]["lease"]
    publish(core, lease, "again")
    core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": {"answer": 42}})
    got = [body for conn, body in pushed(core) if conn == ALICE]
    assert [shape(body["events"][0]) for body in got] == [
        (3, "state", "PENDING", 1), (4, "state", "RUNNING", 2), (5, "progress", "again"),
        (6, "outcome", "SUCCEEDED", {"answer": 42}),
    ]
    assert [body["done"] for body in got] == [False, False, False, True]
    assert core.progress.watching == {} and core.progress.by_conn == {}  # ended with it
    # A late subscriber gets everything kept, the outcome last, and no subscription.
    late = events(core, task, conn=BOB)
    assert [event["seq"] for event in late["events"]] == [1, 2, 3, 4, 5, 6]
    assert late["done"] is True and core.progress.by_conn == {}
    # ``after`` resumes past what was seen.
    assert [event["seq"] for event in events(core, task, after=4)["events"]] == [5, 6]


def test_a_task_keeps_its_last_64_events_and_says_how_many_were_dropped() -> None:
    core = a_core()
    task, lease = running(core)
    for n in range(100):
        core.advance(0.02)  # within the rate
        publish(core, lease, n)
    reply = events(core, task)
    kept = reply["events"]
    assert len(kept) == Limits.EVENTS_RETAINED == 64
    assert kept[0]["seq"] == 101 - 63 and kept[-1]["data"] == 99
    assert reply["missed"] == 101 - 64  # seqs 1..37 are gone
    assert events(core, task, after=10)["missed"] == 101 - 64 - 10
    assert events(core, task, after=90)["missed"] == 0


def test_a_task_keeps_at_most_256_kib_of_event_data() -> None:
    core = a_core()
    task, lease = running(core)
    big = "x" * (60 * 1024)
    for _ in range(10):
        publish(core, lease, big)
    kept = [event for event in events(core, task)["events"] if event["kind"] == "progress"]
    assert len(kept) == 4  # 4 x 60 KiB fit in 256 KiB, 5 do not
    log = core.work.items[task].events
    assert log.bytes == sum(log.sizes) <= Limits.EVENTS_RETAINED_BYTES


def test_an_event_over_64_kib_is_refused_and_leaves_nothing() -> None:
    core = a_core()
    task, lease = running(core)
    core.drain()
    before = len(core.records)
    refusal = core.refused(
        Op.DELIVERY_PROGRESS, {"lease": lease, "data": "x" * Limits.MAX_EVENT_BYTES}
    )
    assert refusal.code == ErrorCode.INVALID_ARGUMENT
    assert "max_event_bytes" in refusal.message
    assert core.work.items[task].events is None
    core.drain()
    assert len(core.records) == before


def test_a_task_publishing_past_its_rate_is_refused_until_tokens_come_back() -> None:
    core = a_core()
    _, lease = running(core)
    for _ in range(Limits.PROGRESS_EVENTS_BURST):
        publish(core, lease, 1)
    refusal = core.refused(Op.DELIVERY_PROGRESS, {"lease": lease, "data": 1})
    assert refusal.code == ErrorCode.RESOURCE_EXHAUSTED
    assert "a second" in refusal.message
    core.advance(1.0)  # a second's worth of tokens
    for _ in range(Limits.PROGRESS_EVENTS_PER_SECOND):
        publish(core, lease, 1)
    assert core.refused(Op.DELIVERY_PROGRESS, {"lease": lease, "data": 1}).code == (
        ErrorCode.RESOURCE_EXHAUSTED
    )


def test_a_core_given_a_higher_rate_lets_a_task_publish_that_much() -> None:
    core = a_core(progress_rate=1000)  # rsd's --test-progress-rate (bench)
    _, lease = running(core)
    for _ in range(2000):  # twice the rate in a burst
        publish(core, lease, 1)
    assert core.refused(Op.DELIVERY_PROGRESS, {"lease": lease, "data": 1}).code == (
        ErrorCode.RESOURCE_EXHAUSTED
    )


def test_event_bytes_are_charged_to_the_tenant_and_refused_past_its_limit() -> None:
    core = a_core(tenant_limits=TenantLimits(payload_bytes=100_000))
    task, lease = running(core)
    base = core.tenant_usage("default")["payload_bytes"]
    publish(core, lease, "x" * 40_000)
    publish(core, lease, "x" * 40_000)
    charged = core.tenant_usage("default")["payload_bytes"] - base
    assert 80_000 <= charged < 80_100
    refusal = core.refused(Op.DELIVERY_PROGRESS, {"lease": lease, "data": "x" * 40_000})
    assert refusal.code == ErrorCode.RESOURCE_EXHAUSTED
    # The bytes go back with the events, at the task's tombstone (as its result's do).
    core.call(Op.DELIVERY_COMPLETE, {"lease": lease})
    core.advance(RETENTION + 1)
    assert core.tenant_usage("default")["payload_bytes"] == 0
    assert not core.work.items[task].events.events
    after = events(core, task)
    assert [event["kind"] for event in after["events"]] == ["outcome"]
    assert after["events"][0]["tombstoned"] is True
    # Its seqs go on: a follower that saw the three events resumes to the outcome, the
    # fourth, and one from the start is told it missed them.
    assert after["events"][0]["seq"] == 4 and after["missed"] == 3
    assert events(core, task, after=3)["missed"] == 0


def test_only_the_live_lease_of_the_delivery_publishes() -> None:
    core = a_core(tenants={BOB: ("other", True)})
    task, lease = running(core)
    events(core, task)
    core.drain()
    before = len(core.records)
    # Another tenant's connection, with the very handle: STALE_CLAIM, as a completion.
    args = {"lease": lease, "data": "forged"}
    assert core.refused(Op.DELIVERY_PROGRESS, args, BOB).code == ErrorCode.STALE_CLAIM
    core.advance(11.0)  # the lease expires: the task goes back to its queue
    assert core.refused(Op.DELIVERY_PROGRESS, args).code == ErrorCode.STALE_CLAIM
    new_lease = core.call(Op.RECEIVE, BOX)["delivery"]["lease"]
    core.call(Op.DELIVERY_COMPLETE, {"lease": new_lease})
    assert core.refused(Op.DELIVERY_PROGRESS, {"lease": new_lease, "data": 1}).code == (
        ErrorCode.STALE_CLAIM
    )
    kept = core.work.items[task].events.events  # (its follower's: its states alone)
    assert [event["kind"] for event in kept] == ["state"] * 3  # nothing was published
    core.drain()
    assert not [rec for rec in core.records[before:] if rec[0] == 21]
    # A message has no events.
    core.call(Op.MESSAGE_SEND, {**BOX, "data": "m"})
    message = core.call(Op.RECEIVE, BOX)["delivery"]
    assert core.refused(Op.DELIVERY_PROGRESS, {"lease": message["lease"]}).code == (
        ErrorCode.INVALID_ARGUMENT
    )


def test_subscriptions_are_bounded_per_connection_and_end_with_it() -> None:
    core = a_core()
    tasks = [core.call(Op.TASK_SUBMIT, {**BOX, "data": n})["id"]
             for n in range(Limits.MAX_EVENT_SUBSCRIPTIONS + 1)]
    for task in tasks[:-1]:
        events(core, task)
    events(core, tasks[0])  # the same task again: no second subscription
    refusal = core.refused(Op.TASK_EVENTS, {"scope": "s", "task": tasks[-1]})
    assert refusal.code == ErrorCode.RESOURCE_EXHAUSTED
    assert "max_event_subscriptions" in refusal.message
    stopped = core.call(Op.TASK_EVENTS, {"scope": "s", "task": tasks[0], "stop": True})
    assert stopped["stopped"] is True
    events(core, tasks[-1])  # room again
    core.disconnected(ALICE, core.now)
    assert core.progress.watching == {} and core.progress.by_conn == {}
    assert core.refused(Op.TASK_EVENTS, {"scope": "s", "task": "t-nope"}).code == (
        ErrorCode.NOT_FOUND
    )
    assert core.refused(Op.TASK_EVENTS, {"scope": "s", "task": tasks[1], "after": -1},
                        BOB).code == ErrorCode.INVALID_ARGUMENT


def _kept(core: CoreDriver) -> dict[str, Any]:
    """Every task's retained events, seqs and bytes, and the tenant's charge."""
    return {
        "logs": {
            item.id: (list(item.events.events), item.events.next_seq, item.events.bytes,
                      item.size)
            for item in core.work.items.values() if item.events is not None
        },
        "bytes": core.tenant_usage("default")["payload_bytes"],
    }


def test_a_replay_of_the_journal_and_a_snapshot_rebuild_the_live_events() -> None:
    core = a_core()
    first, lease = running(core)
    for n in range(70):
        core.advance(0.05)
        publish(core, lease, {"n": n, "pad": "y" * 3000})
    core.call(Op.DELIVERY_RETRY, {"lease": lease, "delay_ms": 0})
    lease = core.call(Op.RECEIVE, BOX)["delivery"]["lease"]
    publish(core, lease, "second attempt")
    second, other = running(core, "other")
    publish(core, other, "done soon")
    core.call(Op.DELIVERY_COMPLETE, {"lease": other, "outcome": 7})
    running(core, "never publishes")
    core.drain()
    live = _kept(core)
    assert set(live["logs"]) == {first, second}
    from_journal = core.replay()
    assert _kept(from_journal) == live
    rebuilt = core.fresh(HOLDERS)
    for rec in core.snapshot():
        rebuilt.apply(on_disk(rec), core.now)
    assert _kept(rebuilt) == live
    # And both go on alike: the next event takes the next seq.
    for again in (from_journal, rebuilt):
        again.recovered(core.now, clean=True)
        seq = live["logs"][first][1]
        assert events(again, first)["events"][-1]["seq"] == seq - 1


def _rebuilt(core: CoreDriver) -> tuple[CoreDriver, CoreDriver]:
    """``core`` rebuilt from its journal and from its snapshot."""
    core.drain()
    from_snapshot = core.fresh(HOLDERS)
    for rec in core.snapshot():
        from_snapshot.apply(on_disk(rec), core.now)
    return core.replay(), from_snapshot


def test_a_followed_task_hears_its_state_changes_without_publishing_progress() -> None:
    core = a_core()
    task = core.call(Op.TASK_SUBMIT, {**BOX, "data": "job"})["id"]
    reply = events(core, task)  # its first follower starts its log: where it is
    assert [shape(event) for event in reply["events"]] == [(1, "state", "PENDING", 0)]
    core.drain()
    lease = core.call(Op.RECEIVE, BOX)["delivery"]["lease"]
    core.call(Op.DELIVERY_RETRY, {"lease": lease, "delay_ms": 0})
    lease = core.call(Op.RECEIVE, BOX)["delivery"]["lease"]
    core.call(Op.DELIVERY_SUSPEND, {"lease": lease, "name": "approval"})
    got = [body for conn, body in pushed(core) if conn == ALICE]
    waiting = _kept(core)
    for again in _rebuilt(core):  # a restart while it waits: the same events and seqs
        assert _kept(again) == waiting
    core.call(Op.TASK_SIGNAL, {**BOX, "task": task, "name": "approval", "data": "yes"}, BOB)
    lease = core.call(Op.RECEIVE, BOX)["delivery"]["lease"]
    before_end = _kept(core)["logs"][task][:3]  # events, next seq, bytes
    core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": "done"})
    got += [body for conn, body in pushed(core) if conn == ALICE]
    assert [shape(body["events"][0]) for body in got] == [
        (2, "state", "RUNNING", 1), (3, "state", "PENDING", 1), (4, "state", "RUNNING", 2),
        (5, "state", "WAITING", 1), (6, "state", "PENDING", 1), (7, "state", "RUNNING", 2),
        (8, "outcome", "SUCCEEDED", "done"),
    ]
    assert [body["done"] for body in got] == [False] * 6 + [True]
    assert [rec[0] for rec in core.records].count(Rec.TASK_FOLLOWED) == 1
    ended = _kept(core)
    assert ended["logs"][task][:3] == before_end  # (its outcome is built when sent)
    for again in _rebuilt(core):  # and after its end: the same, the outcome last
        assert _kept(again) == ended
        again.recovered(core.now, clean=True)
        assert [shape(event) for event in events(again, task)["events"]] == [
            shape(reply["events"][0]), *(shape(body["events"][0]) for body in got)
        ]


def test_following_a_task_writes_one_record_at_most() -> None:
    core = a_core()
    done, lease = running(core, "ends unfollowed")
    core.call(Op.DELIVERY_COMPLETE, {"lease": lease})
    progressed, lease = running(core, "publishes")
    publish(core, lease, "its log is made by its progress")
    task = core.call(Op.TASK_SUBMIT, {**BOX, "data": "followed in a loop"})["id"]
    core.drain()
    before = len(core.records)
    for n in range(100):  # subscribing, stopping and reconnecting, over and over
        conn = (ALICE, BOB)[n % 2]
        events(core, task, conn=conn)
        events(core, progressed, conn=conn)
        assert events(core, done, conn=conn)["done"] is True
        core.call(Op.TASK_EVENTS, {"scope": "s", "task": task, "stop": True}, conn)
        if n % 10 == 0:
            core.disconnected(conn, core.now)
            core.connected(conn, HOLDERS[conn], tenant="default", admin=True)
    core.drain()
    assert [rec[0] for rec in core.records[before:]] == [Rec.TASK_FOLLOWED]
    assert core.work.items[done].events is None  # an ended task is not followed
    # A refused subscription (the connection follows its most) writes nothing either.
    many = [core.call(Op.TASK_SUBMIT, {**BOX, "data": n})["id"]
            for n in range(Limits.MAX_EVENT_SUBSCRIPTIONS + 1)]
    for other in many[:-1]:
        events(core, other, conn=CAROL)
    core.drain()
    before = len(core.records)
    assert core.refused(Op.TASK_EVENTS, {"scope": "s", "task": many[-1]}, CAROL).code == (
        ErrorCode.RESOURCE_EXHAUSTED
    )
    core.drain()
    assert len(core.records) == before and core.work.items[many[-1]].events is None


def test_a_run_moved_to_another_shard_keeps_its_tasks_events() -> None:
    a, b = shard("a", 1), shard("b", 2)
    run = placed("p")
    where = {"scope": run, "mailbox": "jobs"}
    a.create_runs(run)
    task = a.call(Op.TASK_SUBMIT, {**where, "data": None})["id"]
    lease = a.call(Op.RECEIVE, where)["delivery"]["lease"]
    publish(a, lease, "before the move")
    a.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": 1})
    a.drain()
    kept = _kept(a)["logs"][task]
    a.advance(1.0)
    b.advance(1.0)
    assert move(a, b, slot(run))["runs"] == 1
    assert _kept(b)["logs"][task][:3] == kept[:3]  # events, next seq, bytes
    moved = b.call(Op.TASK_EVENTS, {"scope": run, "task": task})
    assert [shape(event) for event in moved["events"]] == [
        (1, "state", "RUNNING", 1), (2, "progress", "before the move"),
        (3, "outcome", "SUCCEEDED", 1),
    ]
    assert a.drop_slots(a.now, slot(run), slot(run)) == 1
    assert a.tenant_usage("default")["payload_bytes"] == 0  # its bytes left with it
