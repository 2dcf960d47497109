"""A submit's or send's ``trace`` (the W3C trace context, ground/traces.py) on the fake
clock: kept with the item and handed back with each of its deliveries; none given, none
delivered; the same after a replay of the journal, after a snapshot (what a kill -9
restart rebuilds from) and after its run moves to another shard; no part of a task's
input (the same key in another trace is the same task); bad shapes are refused with
INVALID_ARGUMENT."""

from __future__ import annotations

from typing import Any

import pytest
from support.core import CoreDriver, on_disk
from support.twoshards import move, placed, shard, slot

from rsd.core.records import Rec
from rsproto import MAX_TRACEPARENT_BYTES, MAX_TRACESTATE_BYTES, ErrorCode, Op

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE = {"traceparent": PARENT, "tracestate": "rojo=00f067aa0ba902b7"}


def submit(core: CoreDriver, key: str | None = None, scope: str = "s", **extra: Any) -> Any:
    return core.call(Op.TASK_SUBMIT, {"scope": scope, "mailbox": "jobs", "data": key,
                                      "key": key, **extra})


def deliveries(core: CoreDriver, scope: str = "s") -> list[dict[str, Any]]:
    """Receive everything ready (and complete it): the deliveries in order."""
    out = []
    while (got := core.call(Op.RECEIVE, {"scope": scope, "mailbox": "jobs"}).get("delivery")):
        out.append(got)
        core.call(Op.DELIVERY_COMPLETE, {"lease": got["lease"]})
    return out


def traces(core: CoreDriver, scope: str = "s") -> dict[Any, Any]:
    return {got["data"]: got.get("trace", "none") for got in deliveries(core, scope)}


def scenario() -> CoreDriver:
    core = CoreDriver()
    submit(core, "traced", trace=TRACE)
    submit(core, "parent-only", trace={"traceparent": PARENT})
    submit(core, "plain")
    core.call(Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": "sent",
                                "trace": {"traceparent": PARENT, "tracestate": None}})
    core.drain()
    return core


EXPECTED = {
    "traced": TRACE, "parent-only": {"traceparent": PARENT}, "plain": "none",
    "sent": {"traceparent": PARENT},
}


def test_each_delivery_carries_its_submitters_trace_and_an_untraced_one_none() -> None:
    assert traces(scenario()) == EXPECTED


def test_a_retried_delivery_carries_the_trace_again() -> None:
    core = CoreDriver()
    submit(core, "traced", trace=TRACE)
    got = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})["delivery"]
    core.call(Op.DELIVERY_RETRY, {"lease": got["lease"], "delay_ms": 0})
    core.advance(0.1)
    again = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})["delivery"]
    assert again["attempt"] == 2 and again["trace"] == TRACE


def test_the_same_key_in_another_trace_is_the_same_task_with_the_first_trace() -> None:
    core = CoreDriver()
    first = submit(core, "k", trace=TRACE)
    other = {"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}
    again = submit(core, "k", trace=other)
    assert again["id"] == first["id"] and again["created"] is False
    assert traces(core) == {"k": TRACE}


@pytest.mark.parametrize("how", ["replay", "snapshot"])
def test_a_replay_and_a_snapshot_keep_the_trace(how: str) -> None:
    core = scenario()
    rebuilt = core.rebuilt(from_snapshot=how == "snapshot")
    snapshot = [on_disk(rec) for rec in core.snapshot()]
    assert [on_disk(rec) for rec in rebuilt.snapshot()] == snapshot
    assert traces(rebuilt) == traces(core) == EXPECTED


def test_the_journal_holds_the_trace_only_where_one_was_given() -> None:
    core = scenario()
    enqueued = [rec for rec in core.records if rec[0] == Rec.ITEM_ENQUEUED]
    assert [rec.trace for rec in enqueued] == [
        TRACE, {"traceparent": PARENT}, None, {"traceparent": PARENT}]


def test_a_moved_run_keeps_its_items_trace() -> None:
    a, b = shard("a", 1), shard("b", 2)
    run = placed("t")
    a.create_runs(run)
    submit(a, "traced", scope=run, trace=TRACE)
    submit(a, "plain", scope=run)
    a.drain()
    b.advance(a.now)
    assert move(a, b, slot(run))["runs"] == 1
    assert traces(b, run) == {"traced": TRACE, "plain": "none"}


@pytest.mark.parametrize(("trace", "says"), [
    ("00-abc", "trace must be a map"),
    ({}, "traceparent is required"),
    ({"traceparent": 7}, "traceparent must be a string"),
    ({"traceparent": ""}, "traceparent must not be empty"),
    ({"traceparent": "x" * (MAX_TRACEPARENT_BYTES + 1)}, "the limit is"),
    ({"traceparent": PARENT, "tracestate": "x" * (MAX_TRACESTATE_BYTES + 1)}, "the limit is"),
    ({"traceparent": PARENT, "tracestate": 1}, "tracestate must be a string"),
    ({"traceparent": PARENT, "baggage": "k=v"}, "trace has unknown fields ['baggage']"),
])
@pytest.mark.parametrize("op", [Op.TASK_SUBMIT, Op.MESSAGE_SEND])
def test_a_bad_trace_is_refused_and_makes_nothing(op: int, trace: Any, says: str) -> None:
    core = CoreDriver()
    error = core.refused(op, {"scope": "s", "mailbox": "jobs", "data": 1, "trace": trace})
    assert error.code is ErrorCode.INVALID_ARGUMENT and says in error.message
    assert not core.work.items and not core.drain()


def test_submit_many_carries_each_items_trace() -> None:
    core = CoreDriver()
    reply = core.call(Op.TASK_SUBMIT_MANY, {"scope": "s", "mailbox": "jobs", "items": [
        {"data": "traced", "trace": TRACE}, {"data": "plain"}, {"data": "bad", "trace": 1}]})
    assert reply["results"][2]["error"]["code"] == ErrorCode.INVALID_ARGUMENT.value
    assert traces(core) == {"traced": TRACE, "plain": "none"}
