"""Fewer round trips per task, in the core: batched RECEIVE (``max``), settle and receive
next (``next`` on DELIVERY_COMPLETE / RETRY / REJECT), TASK_SUBMIT_MANY and ``slim``.

Each rule is checked on the pure core with the fake clock (support/core.py); every run
used is made with SCOPE_CREATE first.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CoreDriver

from rsd.core import DEFERRED, Rec
from rsproto import ErrorCode, Kind, Limits, Op


@pytest.fixture
def core() -> CoreDriver:
    return CoreDriver()


def new_run(core: CoreDriver) -> str:
    return core.call(Op.SCOPE_CREATE, {})["scope"]


def put(core: CoreDriver, run: str, n: int, data: Any = None) -> list[str]:
    """``n`` new tasks (no key) in ``run``'s "jobs"; their ids."""
    items = [{"data": data if data is not None else i} for i in range(n)]
    results = core.call(Op.TASK_SUBMIT_MANY, {"scope": run, "mailbox": "jobs", "items": items})
    return [r["id"] for r in results["results"]]


def receive(core: CoreDriver, run: str, conn: int = ALICE, **args: Any) -> Any:
    return core.call(Op.RECEIVE, {"scope": run, "mailbox": "jobs", **args}, conn)


def state(core: CoreDriver, run: str, task: str) -> str:
    return core.call(Op.TASK_STATUS, {"scope": run, "task": task})["state"]


# ---- batched receive -------------------------------------------------------------------


def test_receive_with_max_gives_up_to_max_deliveries_in_line_order(core: CoreDriver) -> None:
    run = new_run(core)
    ids = put(core, run, 5)
    got = receive(core, run, max=3)["deliveries"]
    assert [d["id"] for d in got] == ids[:3]
    assert len({d["lease"] for d in got}) == 3  # each its own lease
    assert [d["id"] for d in receive(core, run, max=10)["deliveries"]] == ids[3:]
    assert receive(core, run, max=10) == {"deliveries": []}
    for d in got:  # each settles on its own
        core.call(Op.DELIVERY_COMPLETE, {"lease": d["lease"]})
    assert state(core, run, ids[0]) == "SUCCEEDED"


def test_receive_without_max_keeps_the_single_delivery_reply(core: CoreDriver) -> None:
    run = new_run(core)
    put(core, run, 2)
    assert set(receive(core, run)) == {"delivery"}
    assert receive(core, run)["delivery"] is not None
    assert receive(core, run) == {"delivery": None}


@pytest.mark.parametrize("bad", [0, -1, Limits.MAX_RECEIVE_BATCH + 1, 2.0, True, "3"])
def test_receive_max_out_of_range_is_invalid_and_takes_nothing(
    core: CoreDriver, bad: Any
) -> None:
    run = new_run(core)
    put(core, run, 1)
    core.drain()
    error = core.refused(Op.RECEIVE, {"scope": run, "mailbox": "jobs", "max": bad})
    assert error.code == ErrorCode.INVALID_ARGUMENT and "max" in error.message
    assert core.effects.take_records() == []


def test_a_batch_stops_before_its_data_passes_the_byte_limit(core: CoreDriver) -> None:
    run = new_run(core)
    big = "x" * (200 * 1024)  # three pass MAX_RECEIVE_BATCH_BYTES (512 KiB), two do not
    ids = put(core, run, 4, big)
    got = receive(core, run, max=4)["deliveries"]
    assert [d["id"] for d in got] == ids[:2]
    assert [d["id"] for d in receive(core, run, max=4)["deliveries"]] == ids[2:]


def test_the_first_delivery_of_a_batch_is_given_whatever_its_size(core: CoreDriver) -> None:
    run = new_run(core)
    huge = "y" * (Limits.MAX_PAYLOAD_BYTES - 16)
    put(core, run, 1, huge)
    assert len(receive(core, run, max=256)["deliveries"]) == 1


def test_a_parked_batched_receive_is_served_in_its_turn(core: CoreDriver) -> None:
    run = new_run(core)
    assert receive(core, run, BOB, max=4, wait=True) is DEFERRED
    assert receive(core, run, ALICE, max=4, wait=True) is DEFERRED
    core.drain()
    [first] = put(core, run, 1)
    [(conn, (kind, _, body))] = core.effects.take_messages()
    assert (conn, kind) == (BOB, Kind.REPLY)  # the longest-parked first
    assert [d["id"] for d in body["deliveries"]] == [first]


def test_a_parked_batched_receive_that_times_out_gets_an_empty_list(core: CoreDriver) -> None:
    run = new_run(core)
    assert receive(core, run, BOB, max=4, wait=True, timeout_ms=1000) is DEFERRED
    core.drain()
    core.advance(1.01)
    [(_, (_, _, body))] = core.effects.take_messages()
    assert body == {"deliveries": []}


# ---- settle and receive next -----------------------------------------------------------


@pytest.mark.parametrize("op", [Op.DELIVERY_COMPLETE, Op.DELIVERY_RETRY, Op.DELIVERY_REJECT])
def test_a_settlement_with_next_returns_the_next_deliveries(core: CoreDriver, op: Op) -> None:
    run = new_run(core)
    ids = put(core, run, 4)
    lease = receive(core, run)["delivery"]["lease"]
    reply = core.call(op, {"lease": lease, "next": {"max": 2, "lease_seconds": 10}})
    assert reply["id"] == ids[0]
    assert [d["id"] for d in reply["next"]] == ids[1:3]
    assert all(d["lease_seconds"] == 10 for d in reply["next"])
    again = core.call(Op.DELIVERY_COMPLETE, {"lease": reply["next"][0]["lease"], "next": {}})
    assert [d["id"] for d in again["next"]] == [ids[3]]  # max defaults to one


def test_a_settlement_with_next_on_an_empty_queue_gets_an_empty_list(core: CoreDriver) -> None:
    run = new_run(core)
    put(core, run, 1)
    lease = receive(core, run)["delivery"]["lease"]
    reply = core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "next": {"max": 5}})
    assert reply == {"id": reply["id"], "state": "SUCCEEDED", "next": []}


def test_next_never_jumps_ahead_of_a_parked_receive(core: CoreDriver) -> None:
    """ALICE retries at once and asks for the next; BOB is parked: the retried item is
    BOB's, and ALICE gets nothing while BOB waits."""
    run = new_run(core)
    [task] = put(core, run, 1)
    lease = receive(core, run)["delivery"]["lease"]
    assert receive(core, run, BOB, wait=True) is DEFERRED
    core.drain()
    reply = core.call(Op.DELIVERY_RETRY, {"lease": lease, "delay_ms": 0, "next": {"max": 5}})
    assert reply["next"] == []
    [(conn, (_, _, body))] = core.effects.take_messages()
    assert conn == BOB and body["delivery"]["id"] == task


def test_next_takes_nothing_while_any_receive_is_parked(core: CoreDriver) -> None:
    run = new_run(core)
    put(core, run, 1)
    lease = receive(core, run)["delivery"]["lease"]
    assert receive(core, run, BOB, wait=True) is DEFERRED
    reply = core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "next": {"max": 5}})
    assert reply["next"] == []


@pytest.mark.parametrize(
    ("bad", "named"),
    [(5, "next must be a map"), ({"max": 0}, "next.max"), ({"max": 1.5}, "next.max"),
     ({"lease_seconds": 1}, "next.lease_seconds"), ([], "next must be a map")],
)
def test_a_bad_next_is_invalid_and_settles_nothing(
    core: CoreDriver, bad: Any, named: str
) -> None:
    run = new_run(core)
    [task] = put(core, run, 2)[:1]
    lease = receive(core, run)["delivery"]["lease"]
    core.drain()
    error = core.refused(Op.DELIVERY_COMPLETE, {"lease": lease, "next": bad})
    assert error.code == ErrorCode.INVALID_ARGUMENT and named in error.message
    assert core.effects.take_records() == []
    assert state(core, run, task) == "RUNNING"
    core.call(Op.DELIVERY_COMPLETE, {"lease": lease})  # still ours


def test_a_stale_lease_with_a_bad_next_is_stale_claim(core: CoreDriver) -> None:
    run = new_run(core)
    put(core, run, 1)
    lease = receive(core, run)["delivery"]["lease"]
    core.call(Op.DELIVERY_RELEASE, {"lease": lease})  # (a repeated complete is answered)
    error = core.refused(Op.DELIVERY_COMPLETE, {"lease": lease, "next": {"max": 0}})
    assert error.code == ErrorCode.STALE_CLAIM


def test_a_bad_outcome_with_next_settles_and_takes_nothing(core: CoreDriver) -> None:
    run = new_run(core)
    put(core, run, 2)
    lease = receive(core, run)["delivery"]["lease"]
    core.drain()
    deep: Any = 0
    for _ in range(Limits.MAX_PAYLOAD_DEPTH + 1):
        deep = [deep]
    error = core.refused(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": deep, "next": {}})
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert core.effects.take_records() == []


def test_next_deliveries_are_rebuilt_from_the_journal(core: CoreDriver) -> None:
    run = new_run(core)
    ids = put(core, run, 3)
    lease = receive(core, run)["delivery"]["lease"]
    nxt = core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "next": {"max": 2}})["next"]
    core.drain()
    again = core.replay()
    again.connected(ALICE, "alice")
    assert [state(again, run, t) for t in ids] == ["SUCCEEDED", "RUNNING", "RUNNING"]
    again.call(Op.DELIVERY_COMPLETE, {"lease": nxt[1]["lease"]})  # the lease lives on


# ---- TASK_SUBMIT_MANY and slim ---------------------------------------------------------


def test_submit_many_answers_each_item_on_its_own(core: CoreDriver) -> None:
    run = new_run(core)
    core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "key": "k", "data": 1})
    items = [
        {"data": "a", "key": "fresh"},
        {"data": 2, "key": "k"},  # same key, other input
        "not a map",
        {"key": "nodata"},
        {"data": "a", "key": "fresh"},  # joins the first
        {"data": 1, "scope": "elsewhere"},
        {"data": 1, "key": "k"},  # joins the existing task
    ]
    results = core.call(
        Op.TASK_SUBMIT_MANY, {"scope": run, "mailbox": "jobs", "items": items}
    )["results"]
    assert len(results) == len(items)
    assert results[0] == {"id": results[0]["id"], "state": "PENDING", "created": True}
    assert results[1]["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    assert results[1]["error"]["details"] == {"task": results[6]["id"]}
    assert results[2]["error"]["code"] == "INVALID_ARGUMENT"
    assert "items[2] must be a map" in results[2]["error"]["message"]
    assert results[3]["error"]["code"] == "INVALID_ARGUMENT"
    assert results[4] == {"id": results[0]["id"], "state": "PENDING", "created": False}
    assert results[5]["error"]["code"] == "INVALID_ARGUMENT"
    assert results[6]["created"] is False
    assert core.call(Op.QUEUE_INSPECT, {"scope": run, "mailbox": "jobs"})["ready"] == 2


def test_submit_many_over_the_item_limit_submits_nothing(core: CoreDriver) -> None:
    run = new_run(core)
    core.drain()
    items = [{"data": i} for i in range(Limits.MAX_SUBMIT_BATCH + 1)]
    error = core.refused(Op.TASK_SUBMIT_MANY, {"scope": run, "mailbox": "jobs", "items": items})
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert str(Limits.MAX_SUBMIT_BATCH) in error.message
    assert core.effects.take_records() == []


@pytest.mark.parametrize(
    ("args", "code"),
    [({"mailbox": "nope", "items": []}, ErrorCode.NOT_FOUND),
     ({"mailbox": "jobs"}, ErrorCode.INVALID_ARGUMENT),
     ({"mailbox": "jobs", "items": {"data": 1}}, ErrorCode.INVALID_ARGUMENT)],
)
def test_submit_many_refuses_a_bad_request_as_a_whole(
    core: CoreDriver, args: dict[str, Any], code: ErrorCode
) -> None:
    run = new_run(core)
    assert core.refused(Op.TASK_SUBMIT_MANY, {"scope": run, **args}).code == code


def test_submit_many_in_a_cancelled_run_is_scope_cancelled(core: CoreDriver) -> None:
    run = new_run(core)
    core.call(Op.SCOPE_CANCEL, {"scope": run})
    error = core.refused(
        Op.TASK_SUBMIT_MANY, {"scope": run, "mailbox": "jobs", "items": [{"data": 1}]}
    )
    assert error.code == ErrorCode.SCOPE_CANCELLED


def test_submit_many_writes_one_record_per_created_task_and_replays(core: CoreDriver) -> None:
    run = new_run(core)
    core.drain()
    before = len(core.records)
    ids = put(core, run, 3)
    core.drain()
    assert [rec[0] for rec in core.records[before:]] == [Rec.ITEM_ENQUEUED] * 3
    again = core.replay()
    again.connected(ALICE, "alice")
    assert [state(again, run, t) for t in ids] == ["PENDING"] * 3


def test_submit_many_hands_items_to_a_parked_consumer(core: CoreDriver) -> None:
    run = new_run(core)
    assert receive(core, run, BOB, wait=True) is DEFERRED
    core.drain()
    [first, _] = put(core, run, 2)
    [(conn, (_, _, body))] = core.effects.take_messages()
    assert conn == BOB and body["delivery"]["id"] == first


def test_slim_submit_answers_id_state_and_created_only(core: CoreDriver) -> None:
    run = new_run(core)
    args = {"scope": run, "mailbox": "jobs", "key": "k", "data": 1, "slim": True}
    first = core.call(Op.TASK_SUBMIT, args)
    assert first == {"id": first["id"], "state": "PENDING", "created": True}
    assert core.call(Op.TASK_SUBMIT, args) == {**first, "created": False}
    error = core.refused(Op.TASK_SUBMIT, {**args, "slim": 1})
    assert error.code == ErrorCode.INVALID_ARGUMENT and "slim" in error.message
