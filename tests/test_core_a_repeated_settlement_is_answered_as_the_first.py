"""A settlement sent again with the same lease handle is answered as the first was.

The reply to a complete (retry, reject, release) can be lost after rsd recorded it: the
connection drops, or rsd dies between the journal's fsync and the reply. The SDK sends
it again after reconnecting; rsd answers with the first reply's shape and changes
nothing. Only the same handle, the same kind and the same tenant are answered so: a
different settlement, another handle, another tenant, or the late result of a worker
whose lease expired (and whose task went to another worker) stays STALE_CLAIM. The
memory survives replay and a snapshot, lasts one lease length, and is bounded.
On a fake clock (support/core.py); nothing sleeps.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, HOLDERS, CoreDriver, handle, on_disk

from rsd.core import CoreError
from rsproto import ErrorCode, Op

BOX = {"scope": "s", "mailbox": "jobs"}
KINDS = {
    Op.DELIVERY_COMPLETE: {"outcome": {"ok": 1}},
    Op.DELIVERY_RETRY: {"reason": "flaky", "delay_ms": 60_000},
    Op.DELIVERY_REJECT: {"reason": "bad input"},
    Op.DELIVERY_RELEASE: {},
}


def delivered(core: CoreDriver, message: bool = False, conn: int = ALICE,
              lease_seconds: float = 30) -> dict[str, Any]:
    if message:
        core.call(Op.MESSAGE_SEND, {**BOX, "data": "m"}, conn)
    else:
        core.call(Op.TASK_SUBMIT, {**BOX, "data": "t"}, conn)
    reply = core.call(Op.RECEIVE, {**BOX, "lease_seconds": lease_seconds}, conn)
    delivery: dict[str, Any] = reply["delivery"]
    return delivery


def stale(core: CoreDriver, op: Op, args: dict[str, Any], conn: int = ALICE) -> None:
    with pytest.raises(CoreError) as info:
        core.call(op, args, conn)
    assert info.value.code == ErrorCode.STALE_CLAIM


def snapshot_rebuilt(core: CoreDriver) -> CoreDriver:
    rebuilt = core.fresh(holders=HOLDERS)
    for rec in core.snapshot():
        rebuilt.apply(on_disk(rec), core.now)
    rebuilt.drain()
    return rebuilt


@pytest.mark.parametrize("op", list(KINDS), ids=lambda op: op.name)
@pytest.mark.parametrize("message", [False, True], ids=["task", "message"])
def test_a_repeat_gets_the_first_reply_and_changes_nothing(op: Op, message: bool) -> None:
    core = CoreDriver()
    delivery = delivered(core, message)
    args = {"lease": delivery["lease"], **KINDS[op]}
    first = core.call(op, args)
    core.drain()
    core.advance(1.0)
    for again in (core, core.replay(), snapshot_rebuilt(core)):
        repeat = again.call(op, args)
        if op == Op.DELIVERY_RETRY:  # what is left of its backoff now
            assert 0 <= repeat.pop("retry_in_ms") <= first["retry_in_ms"]
            assert repeat == {k: v for k, v in first.items() if k != "retry_in_ms"}
        else:
            assert repeat == first
        assert again.effects.take_records() == []
        assert again.effects.take_messages() == []


def test_a_repeated_complete_leaves_the_one_result() -> None:
    core = CoreDriver()
    delivery = delivered(core)
    args = {"lease": delivery["lease"], "outcome": {"ok": 1}}
    core.call(Op.DELIVERY_COMPLETE, args)
    core.drain()
    assert core.call(Op.DELIVERY_COMPLETE, args) == {"id": delivery["id"], "state": "SUCCEEDED"}
    view = core.call(Op.TASK_STATUS, {"scope": "s", "task": delivery["id"]})
    assert (view["state"], view["outcome"], view["attempt"]) == ("SUCCEEDED", {"ok": 1}, 1)


def test_a_repeat_with_next_takes_no_more_deliveries() -> None:
    core = CoreDriver()
    delivery = delivered(core)
    core.call(Op.TASK_SUBMIT, {**BOX, "data": "second"})
    args = {"lease": delivery["lease"], "next": {"max": 1}}
    first = core.call(Op.DELIVERY_COMPLETE, args)
    assert len(first["next"]) == 1
    assert core.call(Op.DELIVERY_COMPLETE, args) == {**first, "next": []}
    error = core.refused(Op.DELIVERY_COMPLETE, {**args, "next": {"max": 0}})
    assert error.code == ErrorCode.INVALID_ARGUMENT


def test_a_retry_at_the_attempt_limit_is_repeated_as_failed() -> None:
    core = CoreDriver()
    core.call(Op.MAILBOX_ENSURE, {"name": "once", "max_attempts": 1})
    core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "once", "data": 1})
    delivery = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "once"})["delivery"]
    args = {"lease": delivery["lease"]}
    first = core.call(Op.DELIVERY_RETRY, args)
    assert first == {"id": delivery["id"], "state": "FAILED", "retry_in_ms": None}
    core.drain()
    for again in (core, core.replay(), snapshot_rebuilt(core)):
        assert again.call(Op.DELIVERY_RETRY, args) == first
        assert again.effects.take_records() == []


@pytest.mark.parametrize("first", list(KINDS), ids=lambda op: op.name)
def test_another_kind_another_handle_or_another_tenant_is_stale_claim(first: Op) -> None:
    core = CoreDriver(tenants={ALICE: ("acme", True), BOB: ("globex", True)})
    delivery = delivered(core)
    core.call(first, {"lease": delivery["lease"], **KINDS[first]})
    core.drain()
    for other in KINDS:
        if other != first:
            stale(core, other, {"lease": delivery["lease"]})
    stale(core, first, {"lease": handle(int.from_bytes(delivery["lease"][:8], "big"))})
    stale(core, first, {"lease": delivery["lease"], **KINDS[first]}, BOB)
    assert core.effects.take_records() == []


def test_the_late_result_of_a_worker_whose_lease_expired_stays_stale_claim() -> None:
    core = CoreDriver()
    dead = delivered(core, lease_seconds=5)
    core.advance(6.0)  # the worker is presumed dead: its task goes back on the queue
    stale(core, Op.DELIVERY_COMPLETE, {"lease": dead["lease"]})
    taker = core.call(Op.RECEIVE, BOX, BOB)["delivery"]
    assert taker["id"] == dead["id"]
    core.call(Op.DELIVERY_COMPLETE, {"lease": taker["lease"], "outcome": "bob's"}, BOB)
    core.drain()
    for again in (core, core.replay(), snapshot_rebuilt(core)):
        stale(again, Op.DELIVERY_COMPLETE, {"lease": dead["lease"], "outcome": "late"})
        view = again.call(Op.TASK_STATUS, {"scope": "s", "task": dead["id"]})
        assert view["outcome"] == "bob's"


def test_a_cancelled_delivery_is_not_remembered_as_settled() -> None:
    core = CoreDriver()
    delivery = delivered(core)
    core.call(Op.TASK_CANCEL, {"scope": "s", "task": delivery["id"]})
    stale(core, Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})


def test_a_settlement_is_remembered_for_one_lease_length() -> None:
    core = CoreDriver()
    delivery = delivered(core, lease_seconds=10)
    args = {"lease": delivery["lease"]}
    core.call(Op.DELIVERY_COMPLETE, args)
    core.advance(9.5)
    core.call(Op.DELIVERY_COMPLETE, args)
    core.drain()
    core.advance(1.0)
    stale(core, Op.DELIVERY_COMPLETE, args)
    assert len(core.settled) == 0
    # replayed or rebuilt later than that, it is not remembered either
    for again in (core.replay(), snapshot_rebuilt(core)):
        stale(again, Op.DELIVERY_COMPLETE, args)
        assert len(again.settled) == 0


def test_the_memory_is_bounded_per_tenant_oldest_first() -> None:
    core = CoreDriver(tenants={ALICE: ("acme", True), BOB: ("globex", True)})
    core.settled.limit = 3
    bobs = delivered(core, message=True, conn=BOB)
    core.call(Op.DELIVERY_COMPLETE, {"lease": bobs["lease"]}, BOB)
    leases = []
    for _ in range(5):
        lease = delivered(core, message=True)["lease"]
        core.call(Op.DELIVERY_COMPLETE, {"lease": lease})
        leases.append(lease)
    assert len(core.settled) == 3 + 1
    for lease in leases[:2]:
        stale(core, Op.DELIVERY_COMPLETE, {"lease": lease})
    for lease in leases[2:]:
        core.call(Op.DELIVERY_COMPLETE, {"lease": lease})
    core.call(Op.DELIVERY_COMPLETE, {"lease": bobs["lease"]}, BOB)  # another tenant's kept
    core.advance(31.0)  # their lease length passed: all forgotten, the wheel too
    assert len(core.settled) == 0
    assert len(core.settled.line) == 0


def test_the_memory_keeps_one_due_per_tenant_however_many_it_forgot() -> None:
    """A tenant settling more than the limit within one lease length: the dict keeps the
    limit, and the line of dues one entry for the tenant, not one per settlement ever
    remembered (at 20k settlements/s and 600 s leases that was 12 M entries)."""
    core = CoreDriver()
    settled = core.settled
    settled.limit = 3
    for _ in range(200):
        core.call(Op.MESSAGE_SEND, {**BOX, "data": "m"}, ALICE)
        lease = core.call(Op.RECEIVE, {**BOX, "lease_seconds": 600}, ALICE)["delivery"]["lease"]
        core.call(Op.DELIVERY_COMPLETE, {"lease": lease}, ALICE)
    assert len(settled) == 3
    assert len(settled.line) <= 1
    core.advance(601.0)
    assert len(settled) == 0 and len(settled.line) == 0
