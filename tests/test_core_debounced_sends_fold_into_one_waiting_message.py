"""Debounced sends (core/work/debounce.py) on the fake clock: a send with a debounce key
waits out its window; a send with the key of a message still undelivered replaces its
data and moves its due instant (one message, the newest data, one timer); once it is
delivered or ended, the next send starts a new one; the index is the same after a replay
of the journal and after a snapshot; bad input is refused with a clear code; the index
is bounded by the tenant's item limit, which it cannot get past."""

from __future__ import annotations

from typing import Any

import pytest
from support.core import WALL, CoreDriver, on_disk
from support.twoshards import move, placed, shard, slot

from rsd.core.ground.tenants import TenantLimits
from rsd.core.records import Rec
from rsproto import ErrorCode, Limits, Op

TICK = 0.005


def send(core: CoreDriver, data: Any = None, key: str = "doc:7", seconds: float = 5.0,
         **extra: Any) -> dict[str, Any]:
    return core.call(Op.MESSAGE_SEND, {
        "scope": "s", "mailbox": "jobs", "data": data, "debounce_key": key,
        "debounce_seconds": seconds, **extra,
    })


def refused(core: CoreDriver, op: int = Op.MESSAGE_SEND, **args: Any) -> tuple[ErrorCode, str]:
    error = core.refused(op, {"scope": "s", "mailbox": "jobs", "data": 1, **args})
    return error.code, error.message


def receive(core: CoreDriver) -> Any:
    return core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}).get("delivery")


def inspect(core: CoreDriver) -> dict[str, Any]:
    return core.call(Op.QUEUE_INSPECT, {"scope": "s", "mailbox": "jobs"})


def index(core: CoreDriver) -> dict[str, str]:
    """The debounce index of queue (s, jobs): key -> message id."""
    scope = core.scopes.get(("default", "s"))
    queue = None if scope is None else scope.queues.get("jobs")
    return {} if queue is None else {key: item.id for key, item in queue.debounced.items()}


def drain_data(core: CoreDriver) -> list[Any]:
    """Receive and complete everything ready: the data in delivery order."""
    out = []
    while (delivery := receive(core)) is not None:
        out.append(delivery["data"])
        core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})
    return out


# ---- replace, then anew ----------------------------------------------------------------


def test_the_first_send_waits_out_its_window_and_later_sends_replace_it() -> None:
    core = CoreDriver()
    first = send(core, "v1")
    assert first["replaced"] is False and first["replay"] is False
    assert inspect(core)["delayed"] == 1 and index(core) == {"doc:7": first["id"]}
    core.advance(3.0)
    second = send(core, "v2")  # due at 3 + 5 = 8 now
    assert second == {"id": first["id"], "replay": False, "replaced": True}
    core.advance(4.0)  # 7 s: past the first window (5 s), not the second
    assert receive(core) is None and inspect(core)["delayed"] == 1
    core.advance(1.0 + 2 * TICK)
    assert drain_data(core) == ["v2"]  # one message, the newest data
    assert index(core) == {}
    third = send(core, "v3")  # delivered: the next send starts a new message
    assert third["replaced"] is False and third["id"] != first["id"]
    core.advance(5.0 + 2 * TICK)
    assert drain_data(core) == ["v3"]


def test_a_message_due_but_not_yet_delivered_is_replaced_and_waits_a_window_again() -> None:
    core = CoreDriver()
    first = send(core, "v1")
    core.advance(5.0 + 2 * TICK)  # due: PENDING in its ready line, no worker yet
    assert inspect(core)["ready"] == 1
    again = send(core, "v2")
    assert again == {"id": first["id"], "replay": False, "replaced": True}
    counts = inspect(core)
    assert (counts["ready"], counts["delayed"]) == (0, 1)
    assert receive(core) is None
    core.advance(5.0 + 2 * TICK)
    assert drain_data(core) == ["v2"]
    assert inspect(core)["ready"] == 0 and index(core) == {}


def test_a_delivered_message_frees_its_key_even_when_it_comes_back() -> None:
    core = CoreDriver()
    first = send(core, "v1")
    core.advance(5.0 + 2 * TICK)
    delivery = receive(core)
    assert delivery["data"] == "v1" and index(core) == {}
    core.call(Op.DELIVERY_RELEASE, {"lease": delivery["lease"]})  # back in its line
    second = send(core, "v2")
    assert second["replaced"] is False and second["id"] != first["id"]
    assert drain_data(core) == ["v1"]  # the released one; the new one waits its window
    core.advance(5.0 + 2 * TICK)
    assert drain_data(core) == ["v2"]


def test_a_message_ended_undelivered_frees_its_key() -> None:
    core = CoreDriver()
    send(core, "v1", key="a")
    core.advance(5.0 + 2 * TICK)
    send(core, "v2", key="b")
    assert len(index(core)) == 2
    core.call(Op.SCOPE_CANCEL, {"scope": "s"})
    core.advance(TICK)
    assert index(core) == {} and core.work.items == {}


def test_a_shorter_window_brings_the_due_instant_forward() -> None:
    core = CoreDriver()
    send(core, "v1", seconds=60)
    send(core, "v2", seconds=1)
    core.advance(1.0 + 2 * TICK)
    assert drain_data(core) == ["v2"]


def test_keys_are_per_queue_and_each_key_is_its_own_message() -> None:
    core = CoreDriver(runs=("s", "t"))
    a = send(core, "a1", key="a")
    b = send(core, "b1", key="b")
    other_run = core.call(Op.MESSAGE_SEND, {
        "scope": "t", "mailbox": "jobs", "data": "t1", "debounce_key": "a",
        "debounce_seconds": 5,
    })
    assert len({a["id"], b["id"], other_run["id"]}) == 3
    assert send(core, "a2", key="a")["id"] == a["id"]
    core.advance(5.0 + 2 * TICK)
    assert sorted(drain_data(core)) == ["a2", "b1"]


def test_many_sends_keep_one_timer_and_one_record_each() -> None:
    core = CoreDriver()
    send(core, 0)
    core.drain()
    wheel = len(core.wheel)
    for n in range(1, 1000):
        core.advance(0.001)
        assert send(core, n)["replaced"] is True
    assert len(core.wheel) == wheel
    core.drain()
    kinds = [rec[0] for rec in core.records[-999:]]
    assert kinds == [Rec.ITEM_DEBOUNCED] * 999
    core.advance(5.0 + 2 * TICK)
    assert drain_data(core) == [999]


def test_priority_and_fairness_key_are_the_first_sends_and_must_match() -> None:
    core = CoreDriver()
    first = send(core, "hi", priority=5, fairness_key="acme")
    assert send(core, "hi2", priority=5, fairness_key="acme")["replaced"] is True
    for other in ({"priority": 4, "fairness_key": "acme"}, {"priority": 5}):
        error = core.refused(Op.MESSAGE_SEND, {
            "scope": "s", "mailbox": "jobs", "data": 1, "debounce_key": "doc:7",
            "debounce_seconds": 5, **other,
        })
        assert error.code is ErrorCode.IDEMPOTENCY_CONFLICT
        assert error.details == {"id": first["id"]}
    core.call(Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": "low"})
    core.advance(5.0 + 2 * TICK)
    assert drain_data(core) == ["hi2", "low"]  # its priority, as sent first


# ---- replay and snapshot -----------------------------------------------------------------


def scenario() -> CoreDriver:
    """Keys in every phase: replaced while DELAYED, replaced while due, delivered and
    running, new; and a plain message between them."""
    core = CoreDriver()
    send(core, "a1", key="a")
    send(core, "b1", key="b", seconds=2)
    core.call(Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": "plain"})
    core.advance(1.0)
    send(core, "a2", key="a")  # a: DELAYED, due at 6
    core.advance(1.0 + 2 * TICK)  # b: due, PENDING; plain ready too
    delivery = receive(core)
    assert delivery["data"] == "plain"
    send(core, "b2", key="b", seconds=3)  # b: back to DELAYED, due at 5
    send(core, "c1", key="c", seconds=10, priority=2)
    core.drain()
    return core


def state_of(core: CoreDriver) -> dict[str, Any]:
    work = core.work
    return {
        "snapshot": [on_disk(rec) for rec in core.snapshot()],
        "index": index(core),
        "items": {item_id: (item.view(), item.data, item.size, item.visible_at, item.queued)
                  for item_id, item in work.items.items()},
        "by_state": dict(work.by_state),
        "usage": {name: usage.view() for name, usage in core.tenants.usage.items()},
        "inspect": {k: v for k, v in inspect(core).items() if k != "consumers"},
    }


@pytest.mark.parametrize("from_snapshot", [False, True])
def test_replay_and_snapshot_rebuild_the_index_and_messages_as_live(from_snapshot: bool) -> None:
    core = scenario()
    rebuilt = core.rebuilt(from_snapshot=from_snapshot)
    assert state_of(rebuilt) == state_of(core)
    assert any(rec[0] == Rec.DEBOUNCE_KEYED for rec in core.snapshot())
    # and both go on alike: a send replaces in each, the messages come out alike
    for each in (core, rebuilt):
        assert send(each, "a3", key="a")["replaced"] is True
    assert state_of(rebuilt) == state_of(core)
    for step, due in ((3.5, ["b2"]), (2.0, ["a3"]), (5.0, ["c1"])):  # to 5.5, 7.5, 12.5
        for each in (core, rebuilt):
            each.advance(step)
        assert drain_data(rebuilt) == drain_data(core) == due
    assert index(rebuilt) == index(core) == {}


def test_a_record_applied_twice_changes_nothing() -> None:
    core = scenario()
    rebuilt = core.replay(core.records + core.records[-6:])
    rebuilt.now = core.now
    assert state_of(rebuilt) == state_of(core)


# ---- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "words"), [
    ({"debounce_key": "k"}, "go together"),
    ({"debounce_seconds": 5}, "go together"),
    ({"debounce_key": "k", "debounce_seconds": 0}, "more than 0"),
    ({"debounce_key": "k", "debounce_seconds": -1}, "between 0"),
    ({"debounce_key": "k", "debounce_seconds": Limits.MAX_DEBOUNCE_SECONDS + 1}, "between 0"),
    ({"debounce_key": "k", "debounce_seconds": float("nan")}, "NaN"),
    ({"debounce_key": "k", "debounce_seconds": "5"}, "must be a number"),
    ({"debounce_key": "k", "debounce_seconds": True}, "must be a number"),
    ({"debounce_key": "", "debounce_seconds": 5}, "debounce_key"),
    ({"debounce_key": 7, "debounce_seconds": 5}, "debounce_key"),
    ({"debounce_key": "k" * (Limits.MAX_KEY_BYTES + 1), "debounce_seconds": 5}, "debounce_key"),
    ({"debounce_key": "k", "debounce_seconds": 5, "work_key": "w"}, "not both"),
    ({"debounce_key": "k", "debounce_seconds": 5, "needs": {"pools": ["gpu"]}}, "needs"),
    ({"debounce_key": "k", "debounce_seconds": 5, "delay_ms": 100}, "delay_ms"),
    ({"debounce_key": "k", "debounce_seconds": 5, "not_before": WALL + 9}, "not_before"),
])
def test_bad_debounce_arguments_are_invalid_and_leave_nothing(
    args: dict[str, Any], words: str
) -> None:
    core = CoreDriver()
    before = len(core.records)
    code, message = refused(core, **args)
    assert code is ErrorCode.INVALID_ARGUMENT and words in message
    assert core.work.items == {} and index(core) == {}
    assert core.drain() == [] and len(core.records) == before


def test_the_longest_window_is_accepted() -> None:
    core = CoreDriver()
    reply = send(core, "x", seconds=Limits.MAX_DEBOUNCE_SECONDS)
    assert core.work.items[reply["id"]].not_before == WALL + Limits.MAX_DEBOUNCE_SECONDS


def test_a_task_is_not_debounced() -> None:
    core = CoreDriver()
    for extra in ({"debounce_key": "k", "debounce_seconds": 5}, {"debounce_seconds": 5}):
        code, message = refused(core, Op.TASK_SUBMIT, **extra)
        assert code is ErrorCode.INVALID_ARGUMENT and "MESSAGE_SEND" in message
    many = core.call(Op.TASK_SUBMIT_MANY, {"scope": "s", "mailbox": "jobs", "items": [
        {"data": 1, "debounce_key": "k", "debounce_seconds": 5}, {"data": 2},
    ]})["results"]
    assert many[0]["error"]["code"] == "INVALID_ARGUMENT" and many[1]["created"] is True


# ---- bounds ------------------------------------------------------------------------------


def test_the_index_is_bounded_by_the_tenants_item_limit() -> None:
    """Each key holds a live message, counted against the tenant's items: distinct keys
    past the limit are refused, while replacing under any held key still works."""
    core = CoreDriver(tenant_limits=TenantLimits(items=50))
    for n in range(50):
        send(core, n, key=f"k{n}")
    for n in range(50, 60):  # trying to grow the index past the limit
        error = core.refused(Op.MESSAGE_SEND, {
            "scope": "s", "mailbox": "jobs", "data": n, "debounce_key": f"k{n}",
            "debounce_seconds": 5,
        })
        assert error.code is ErrorCode.RESOURCE_EXHAUSTED
    assert len(index(core)) == 50 and len(core.work.items) == 50
    assert send(core, "new", key="k3")["replaced"] is True  # no new item: allowed
    core.advance(5.0 + 2 * TICK)
    assert len(drain_data(core)) == 50
    assert index(core) == {} and core.work.items == {}


def test_a_replacement_is_charged_for_its_bigger_data() -> None:
    core = CoreDriver(tenant_limits=TenantLimits(payload_bytes=1000))
    send(core, "x" * 400)
    error = core.refused(Op.MESSAGE_SEND, {
        "scope": "s", "mailbox": "jobs", "data": "y" * 1200, "debounce_key": "doc:7",
        "debounce_seconds": 5,
    })
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED
    assert send(core, "z" * 900)["replaced"] is True  # the old data's bytes are given back
    usage = core.tenants.usage["default"].view()
    core.advance(5.0 + 2 * TICK)
    assert drain_data(core) == ["z" * 900]
    assert usage["payload_bytes"] > 900
    assert core.tenants.usage["default"].view()["payload_bytes"] == 0


# ---- a run moved to another shard ----------------------------------------------------------


def test_a_moved_run_keeps_its_debounced_messages_and_their_keys() -> None:
    a, b = shard("a", 1), shard("b", 2)
    run = placed("d")

    def send_to(core: CoreDriver, data: Any, key: str) -> dict[str, Any]:
        return core.call(Op.MESSAGE_SEND, {
            "scope": run, "mailbox": "jobs", "data": data, "debounce_key": key,
            "debounce_seconds": 5,
        })

    a.create_runs(run)
    first = send_to(a, "a1", "a")
    send_to(a, "b1", "b")
    a.advance(5.0 + 2 * TICK)  # both due; "a" replaced while due: back to DELAYED
    assert send_to(a, "a2", "a")["replaced"] is True
    a.drain()
    b.advance(a.now)  # the two shards' clocks alike
    assert move(a, b, slot(run))["runs"] == 1
    assert send_to(b, "a3", "a") == {"id": first["id"], "replay": False, "replaced": True}
    got = b.call(Op.RECEIVE, {"scope": run, "mailbox": "jobs"})["delivery"]
    assert got["data"] == "b1"  # due, and its key freed by its delivery here
    b.call(Op.DELIVERY_COMPLETE, {"lease": got["lease"]})
    assert send_to(b, "b2", "b")["replaced"] is False
    b.advance(10.0 + 2 * TICK)
    datas = []
    while (got := b.call(Op.RECEIVE, {"scope": run, "mailbox": "jobs"}).get("delivery")):
        datas.append(got["data"])
        b.call(Op.DELIVERY_COMPLETE, {"lease": got["lease"]})
    assert sorted(datas) == ["a3", "b2"]
