"""Delayed items, priorities and fair shares (core/itemorder.py, core/lanes.py), on the
fake clock: a delayed item is never early and is delivered within a tick of its time;
higher priorities first, FIFO within one; round robin between fairness keys, however
large one key's backlog; the live-key bound; all of it across replay and snapshots."""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, WALL, CoreDriver

from rsd.core.ground.tenants import TenantLimits
from rsd.core.records import Rec
from rsd.core.work.deliveries import ReceiveWait
from rsd.policy import Policy
from rsproto import ErrorCode, Limits, Op

TICK = 0.005


def submit(core: CoreDriver, data: Any = None, **extra: Any) -> dict[str, Any]:
    return core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": data, **extra})


def send(core: CoreDriver, data: Any = None, **extra: Any) -> dict[str, Any]:
    return core.call(Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": data, **extra})


def receive(core: CoreDriver, **extra: Any) -> Any:
    reply = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs", **extra})
    return reply.get("delivery", reply)


def inspect(core: CoreDriver) -> dict[str, Any]:
    return core.call(Op.QUEUE_INSPECT, {"scope": "s", "mailbox": "jobs"})


def status(core: CoreDriver, task: str) -> dict[str, Any]:
    return core.call(Op.TASK_STATUS, {"scope": "s", "task": task})


def drain_order(core: CoreDriver) -> list[Any]:
    """Receive and complete everything ready: the data in delivery order."""
    out = []
    while (delivery := receive(core)) is not None:
        out.append(delivery["data"])
        core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})
    return out


# ---- delays ------------------------------------------------------------------------


def test_a_delayed_item_is_never_delivered_before_its_time() -> None:
    core = CoreDriver()
    task = submit(core, "later", delay_ms=2000)
    assert task["state"] == "DELAYED" and task["not_before"] == WALL + 2.0
    for _ in range(399):  # up to 1.995 s: never
        core.advance(TICK)
        assert receive(core) is None
    assert status(core, task["id"])["state"] == "DELAYED"


def test_a_delayed_item_is_delivered_within_a_tick_of_its_time() -> None:
    core = CoreDriver()
    submit(core, "later", not_before=WALL + 1.0)
    parked = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True,
                                    "timeout_ms": 60_000})
    assert not isinstance(parked, dict)  # parked
    core.drain()
    core.advance(1.0 + TICK)
    replies = [body for _, (_, _, body) in core.drain()]
    assert [reply["delivery"]["data"] for reply in replies] == ["later"]
    assert any(rec[0] == Rec.ITEM_DUE for rec in core.records)


def test_a_delayed_message_waits_too_and_mailbox_inspect_counts_delayed_items() -> None:
    core = CoreDriver()
    send(core, "m", delay_ms=500)
    submit(core, "t", delay_ms=500)
    submit(core, "now")
    assert inspect(core)["delayed"] == 2 and inspect(core)["ready"] == 1
    assert drain_order(core) == ["now"]
    core.advance(0.5 + TICK)
    assert inspect(core)["delayed"] == 0
    assert drain_order(core) == ["m", "t"]


def test_a_delay_of_zero_or_a_past_not_before_is_no_delay() -> None:
    core = CoreDriver()
    assert submit(core, 1, delay_ms=0)["state"] == "PENDING"
    view = submit(core, 2, not_before=WALL - 5)
    assert view["state"] == "PENDING" and view["not_before"] is None


def test_a_delayed_task_can_be_cancelled_and_expires_by_its_deadline() -> None:
    core = CoreDriver()
    one = submit(core, 1, delay_ms=60_000)["id"]
    two = submit(core, 2, delay_ms=60_000, deadline=WALL + 1)["id"]
    core.call(Op.TASK_CANCEL, {"scope": "s", "task": one})
    core.advance(1.0 + TICK)
    assert status(core, one)["state"] == "CANCELLED"
    assert status(core, two)["state"] == "EXPIRED"
    assert inspect(core)["delayed"] == 0
    core.advance(60)
    assert receive(core) is None


def test_delayed_items_count_against_the_tenants_item_limit() -> None:
    core = CoreDriver(tenant_limits=TenantLimits(items=2))
    submit(core, 1, delay_ms=60_000)
    send(core, 2, delay_ms=60_000)
    refusal = core.refused(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 3})
    assert refusal.code is ErrorCode.RESOURCE_EXHAUSTED


def test_retry_with_a_delay_overrides_the_backoff_once() -> None:
    core = CoreDriver()
    submit(core, "x")
    lease = receive(core)["lease"]
    reply = core.call(Op.DELIVERY_RETRY, {"lease": lease, "delay_ms": 3000})
    assert reply["retry_in_ms"] == 3000
    core.advance(2.9)
    assert receive(core) is None
    core.advance(0.1 + TICK)
    assert receive(core)["attempt"] == 2


@pytest.mark.parametrize("snapshot", [False, True])
def test_delayed_items_keep_their_time_across_replay_snapshot_and_recovery(
    snapshot: bool,
) -> None:
    core = CoreDriver()
    early = submit(core, "early", delay_ms=1000)["id"]
    late = submit(core, "late", delay_ms=5000, priority=3, fairness_key="acme")["id"]
    core.advance(1.0 + TICK)  # early is due (ITEM_DUE recorded), late is not
    core.drain()
    rebuilt = core.rebuilt(from_snapshot=snapshot)
    assert status(rebuilt, early)["state"] == "PENDING"
    view = status(rebuilt, late)
    assert view["state"] == "DELAYED" and view["not_before"] == WALL + 5.0
    assert (view["priority"], view["fairness_key"]) == (3, "acme")
    assert inspect(rebuilt) | {"consumers": 0} == inspect(core) | {"consumers": 0}
    assert drain_order(rebuilt) == ["early"]
    rebuilt.advance(4.9 - rebuilt.now)  # (its clock starts again at 0; timers are wall times)
    assert receive(rebuilt) is None
    rebuilt.advance(0.1 + TICK)
    assert drain_order(rebuilt) == ["late"]


# ---- priorities --------------------------------------------------------------------


def test_higher_priorities_are_delivered_first_and_fifo_within_a_priority() -> None:
    core = CoreDriver()
    for n, priority in enumerate([0, 5, 9, 5, 0, 9, 1]):
        submit(core, [priority, n], priority=priority)
    assert drain_order(core) == [
        [9, 2], [9, 5], [5, 1], [5, 3], [1, 6], [0, 0], [0, 4],
    ]


def test_a_plain_fifo_queue_keeps_its_order_when_priorities_arrive() -> None:
    core = CoreDriver()
    for n in range(3):
        submit(core, n)
    submit(core, "urgent", priority=1)
    submit(core, 3)
    assert drain_order(core) == ["urgent", 0, 1, 2, 3]


def test_the_same_key_with_another_priority_is_an_idempotency_conflict() -> None:
    core = CoreDriver()
    first = submit(core, "x", key="k", priority=2)
    assert submit(core, "x", key="k", priority=2)["id"] == first["id"]
    refusal = core.refused(
        Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": "x", "key": "k"}
    )
    assert refusal.code is ErrorCode.IDEMPOTENCY_CONFLICT
    # the delay and the fairness key are not input: the same task
    assert submit(core, "x", key="k", priority=2, delay_ms=5, fairness_key="a")["id"] == (
        first["id"]
    )


def test_a_priority_0_task_has_the_digest_it_had_before_priorities() -> None:
    core = CoreDriver()
    submit(core, "x", key="k")
    assert submit(core, "x", key="k", priority=0)["created"] is False


# ---- fair shares -------------------------------------------------------------------


@pytest.mark.at_scale
def test_a_huge_backlog_of_one_key_delays_another_keys_next_item_by_at_most_one_round() -> None:
    core = CoreDriver(tenant_limits=TenantLimits(items=200_000))
    for n in range(100_000):
        send(core, ["big", n], fairness_key="big")
    send(core, ["small", 0], fairness_key="small")
    send(core, ["small", 1], fairness_key="small")
    send(core, ["none", 0])
    order = [receive(core)["data"] for _ in range(6)]
    assert order == [
        ["big", 0], ["small", 0], ["none", 0], ["big", 1], ["small", 1], ["big", 2],
    ]


def test_fair_shares_hold_within_a_priority_and_priorities_come_first() -> None:
    core = CoreDriver()
    for n in range(3):
        send(core, ["a", n], fairness_key="a")
        send(core, ["b", n], fairness_key="b", priority=1)
    send(core, ["c", 0], fairness_key="c", priority=1)
    assert drain_order(core) == [
        ["b", 0], ["c", 0], ["b", 1], ["b", 2], ["a", 0], ["a", 1], ["a", 2],
    ]


def test_a_mailbox_refuses_one_live_fairness_key_more_than_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("rsd.core.work.workbook._MAX_KEYS", 3)
    core = CoreDriver()
    for key in "abc":
        send(core, key, fairness_key=key)
    send(core, "a again", fairness_key="a")  # a live key: no new one
    refusal = core.refused(
        Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": "d", "fairness_key": "d"}
    )
    assert refusal.code is ErrorCode.RESOURCE_EXHAUSTED and "3" in refusal.message
    # a key whose items have all finished is no longer live
    drain_order(core)
    assert core.work.mailboxes[("default", "jobs")].fairness_keys == {}
    send(core, "d", fairness_key="d")


def test_keys_that_come_and_go_leave_no_lanes_behind() -> None:
    core = CoreDriver()
    for n in range(5000):
        task = submit(core, n, fairness_key=f"k{n}")["id"]
        core.call(Op.TASK_CANCEL, {"scope": "s", "task": task})
    submit(core, "kept", fairness_key="kept")
    queue = core.scopes[("default", "s")].queues["jobs"]
    lanes = queue.lanes
    assert lanes is not None and lanes.lane_count() == 1
    assert sum(len(ring) for ring in lanes.rings) <= 2 * 1 + 33
    assert core.work.mailboxes[("default", "jobs")].fairness_keys == {"kept": 1}


@pytest.mark.parametrize("snapshot", [False, True])
def test_lanes_and_their_turns_survive_replay_and_snapshot(snapshot: bool) -> None:
    core = CoreDriver()
    for n in range(40):
        send(core, n, fairness_key=f"k{n % 3}", priority=n % 2)
    for _ in range(5):
        delivery = receive(core)
        core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})
    core.drain()
    rebuilt = core.rebuilt(from_snapshot=snapshot)
    want = drain_order(core)
    got = drain_order(rebuilt)
    assert sorted(got) == sorted(want) and len(got) == 35
    # each lane's own order is kept exactly, and priority 1 comes before priority 0
    for key in range(3):
        for priority in range(2):
            lane = [n for n in got if n % 3 == key and n % 2 == priority]
            assert lane == sorted(lane)
    assert all(n % 2 == 1 for n in got[:len([n for n in got if n % 2])])


# ---- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "names"), [
    ({"priority": 10}, "priority"),
    ({"priority": -1}, "priority"),
    ({"priority": "high"}, "priority"),
    ({"priority": True}, "priority"),
    ({"priority": 1.5}, "priority"),
    ({"delay_ms": -1}, "delay_ms"),
    ({"delay_ms": float("nan")}, "delay_ms"),
    ({"delay_ms": 1.5}, "delay_ms"),
    ({"delay_ms": Limits.MAX_DELAY_MS + 1}, "delay_ms"),
    ({"not_before": float("nan")}, "not_before"),
    ({"not_before": "tomorrow"}, "not_before"),
    ({"not_before": WALL + Limits.MAX_DELAY_MS / 1000 + 10}, "not_before"),
    ({"delay_ms": 5, "not_before": WALL + 5}, "not both"),
    ({"fairness_key": "x" * (Limits.MAX_FAIRNESS_KEY_BYTES + 1)}, "fairness_key"),
    ({"fairness_key": 7}, "fairness_key"),
])
@pytest.mark.parametrize("op", [Op.TASK_SUBMIT, Op.MESSAGE_SEND])
def test_bad_order_arguments_are_refused_with_the_field_named(
    op: int, extra: dict[str, Any], names: str
) -> None:
    core = CoreDriver()
    refusal = core.refused(op, {"scope": "s", "mailbox": "jobs", "data": 1, **extra})
    assert refusal.code is ErrorCode.INVALID_ARGUMENT
    assert names in refusal.message
    assert core.work.items == {}


def test_submit_many_items_take_the_same_fields() -> None:
    core = CoreDriver()
    reply = core.call(Op.TASK_SUBMIT_MANY, {"scope": "s", "mailbox": "jobs", "items": [
        {"data": "low"},
        {"data": "high", "priority": 9},
        {"data": "later", "delay_ms": 1000},
        {"data": "bad", "priority": 99},
    ]})
    results = reply["results"]
    assert [r.get("state") for r in results[:3]] == ["PENDING", "PENDING", "DELAYED"]
    assert results[3]["error"]["code"] == "INVALID_ARGUMENT"
    assert drain_order(core) == ["high", "low"]


def test_the_live_key_bound_is_a_policy_constant() -> None:
    assert Policy.MAX_FAIRNESS_KEYS_PER_MAILBOX == 10_000
    assert ALICE == 1 and ReceiveWait is not None
