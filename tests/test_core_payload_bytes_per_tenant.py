"""Each tenant's stored payload bytes have a limit, on the pure core (fake clock).

A tenant is charged the encoded size of every payload rsd keeps for it: task and message
data, recorded outcomes, dead letters' data (nil costs nothing). A request that would
take it past ``max_payload_bytes_per_tenant`` is refused with RESOURCE_EXHAUSTED naming
the limit and the usage, before anything changes; what it frees (a consumed message, a
tombstoned task, a requeued dead letter) gives the room back; other tenants never notice;
replay and snapshots rebuild the very same usage, and never refuse.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from support.core import ALICE, BOB, CAROL, HOLDERS, CoreDriver, on_disk

from rsd.core.ground.tenants import TenantLimits
from rsd.core.restore import Restore
from rsproto import ErrorCode, Op

TENANTS = {ALICE: ("acme", True), CAROL: ("acme", False), BOB: ("globex", False)}
BOX = {"scope": "s", "mailbox": "jobs"}
LIMIT = "max_payload_bytes_per_tenant"
RETENTION = 3600.0
DATA = "x" * 300  # 303 bytes encoded
SIZE = len(msgpack.packb(DATA))


def budget(limit: int, **options: Any) -> CoreDriver:
    return CoreDriver(
        holders={c: HOLDERS[c] for c in TENANTS}, tenants=TENANTS,
        tenant_limits=TenantLimits(payload_bytes=limit), retention_seconds=RETENTION,
        tombstone_seconds=RETENTION, **options,
    )


def used(core: CoreDriver, tenant: str = "acme") -> int:
    return core.tenant_usage(tenant)["payload_bytes"]


def assert_over_budget(core: CoreDriver, op: int, args: dict[str, Any], conn: int = ALICE) -> None:
    """Refused with RESOURCE_EXHAUSTED naming the limit and the usage; nothing recorded."""
    before = len(core.records) + len(core.effects.records)
    have = used(core, core.tenants.of(conn))
    error = core.refused(op, args, conn)
    assert error.code == ErrorCode.RESOURCE_EXHAUSTED
    assert LIMIT in error.message and f"stores {have} payload bytes" in error.message
    assert error.details == {"limit": LIMIT, "value": core.tenants.byte_limit(
        core.tenants.of(conn)), "usage": have}
    assert len(core.records) + len(core.effects.records) == before


def test_submits_and_sends_past_the_byte_limit_are_refused_before_anything_changes() -> None:
    core = budget(3 * SIZE + 10)
    core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA, "key": "a"})
    core.call(Op.MESSAGE_SEND, {**BOX, "data": DATA}, CAROL)  # the tenant's, not the conn's
    core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA})
    assert used(core) == 3 * SIZE
    assert_over_budget(core, Op.TASK_SUBMIT, {**BOX, "data": DATA})
    assert_over_budget(core, Op.MESSAGE_SEND, {**BOX, "data": DATA}, CAROL)
    # Room for a small one still; nil data costs nothing; joining a task stores nothing new.
    core.call(Op.MESSAGE_SEND, {**BOX, "data": "y" * 5})
    core.call(Op.MESSAGE_SEND, {**BOX, "data": None})
    assert core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA, "key": "a"})["created"] is False
    assert used(core) == 3 * SIZE + 6
    # Another tenant has its own budget, untouched by acme's.
    for _ in range(3):
        core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA}, BOB)
    assert used(core, "globex") == 3 * SIZE and used(core) == 3 * SIZE + 6


def test_a_consumed_message_gives_its_bytes_back() -> None:
    core = budget(2 * SIZE)
    core.call(Op.MESSAGE_SEND, {**BOX, "data": DATA})
    core.call(Op.MESSAGE_SEND, {**BOX, "data": DATA})
    assert_over_budget(core, Op.MESSAGE_SEND, {**BOX, "data": DATA})
    delivery = core.call(Op.RECEIVE, BOX)["delivery"]
    assert used(core) == 2 * SIZE  # delivered is still stored
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": DATA})
    assert used(core) == SIZE  # a message's outcome is not kept, nor is the message
    core.call(Op.MESSAGE_SEND, {**BOX, "data": DATA})


def test_a_result_past_the_budget_is_refused_and_the_delivery_stays_the_workers() -> None:
    core = budget(SIZE + 5)
    task = core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA, "key": "t"})
    core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA}, BOB)  # globex's budget is its own
    delivery = core.call(Op.RECEIVE, BOX)["delivery"]
    assert_over_budget(core, Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": DATA})
    status = core.call(Op.TASK_STATUS, {"scope": "s", "task": task["id"]})
    assert status["state"] == "RUNNING" and status["outcome"] is None
    # The worker still holds it: a result that fits is recorded, and charged.
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": "ok"})
    assert used(core) == SIZE + 3
    status = core.call(Op.TASK_STATUS, {"scope": "s", "task": task["id"]})
    assert status["state"] == "SUCCEEDED" and status["outcome"] == "ok"


def test_results_kept_past_retention_give_their_bytes_back() -> None:
    core = budget(4 * SIZE)
    for n in range(2):
        task = core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA, "key": f"k{n}"})
        delivery = core.call(Op.RECEIVE, BOX)["delivery"]
        core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": DATA})
    assert used(core) == 4 * SIZE
    assert_over_budget(core, Op.TASK_SUBMIT, {**BOX, "data": 1})
    core.advance(RETENTION + 1)  # tombstoned: data and outcome dropped, state kept
    assert used(core) == 0
    assert core.call(Op.TASK_STATUS, {"scope": "s", "task": task["id"]})["tombstoned"] is True
    for n in range(4):
        core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA, "key": f"new{n}"})
    core.advance(RETENTION + 1)  # forgotten: nothing more to give back
    assert used(core) == 4 * SIZE


def test_dead_letters_are_charged_until_requeued_or_pushed_out() -> None:
    core = budget(10 * SIZE)
    core.call(Op.MAILBOX_ENSURE, {"name": "jobs", "max_attempts": 1})
    core.call(Op.MESSAGE_SEND, {**BOX, "data": DATA})
    core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA, "key": "t"})
    for _ in range(2):
        delivery = core.call(Op.RECEIVE, BOX)["delivery"]
        core.call(Op.DELIVERY_REJECT, {"lease": delivery["lease"], "reason": "bad"})
    # The message's data moved to its dead letter; the task keeps its data beside its own.
    assert used(core) == 3 * SIZE
    assert len(core.call(Op.DEAD_LETTERS, BOX)["items"]) == 2
    core.advance(RETENTION + 1)  # the task is tombstoned; its dead letter outlives it
    assert used(core) == 2 * SIZE
    requeued = core.call(Op.DEAD_LETTER_REQUEUE, {**BOX, "all": True})["requeued"]
    assert len(requeued) == 2 and used(core) == 2 * SIZE  # from the list to new items
    for _ in range(2):
        delivery = core.call(Op.RECEIVE, BOX)["delivery"]
        core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})
    core.advance(RETENTION + 1)
    assert used(core) == 0


def test_dead_letters_pushed_out_of_a_full_list_give_their_bytes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("rsd.core.run.queue.Limits.MAX_DEAD_LETTERS", 2)
    core = budget(10 * SIZE)
    core.call(Op.MAILBOX_ENSURE, {"name": "jobs", "max_attempts": 1})
    for n in range(4):
        core.call(Op.MESSAGE_SEND, {**BOX, "data": DATA + str(n)})
        delivery = core.call(Op.RECEIVE, BOX)["delivery"]
        core.call(Op.DELIVERY_REJECT, {"lease": delivery["lease"]})
    assert used(core) == 2 * (SIZE + 1)


def test_a_batch_is_refused_entry_by_entry_as_for_every_other_limit() -> None:
    core = budget(3 * SIZE)
    entries = [{"data": DATA, "key": f"k{n}"} for n in range(5)]
    results = core.call(Op.TASK_SUBMIT_MANY, {**BOX, "items": entries})["results"]
    assert [r.get("created") for r in results[:3]] == [True, True, True]
    for refused in results[3:]:
        assert refused["error"]["code"] == ErrorCode.RESOURCE_EXHAUSTED.value
        assert refused["error"]["details"] == {"limit": LIMIT, "value": 3 * SIZE,
                                               "usage": 3 * SIZE}
    assert used(core) == 3 * SIZE
    assert core.call(Op.TASK_SUBMIT_MANY, {**BOX, "items": [{"data": None}]})["results"][0][
        "created"]


def test_usage_after_replay_and_after_a_snapshot_equals_usage_before() -> None:
    core = budget(100 * SIZE)
    core.call(Op.MAILBOX_ENSURE, {"name": "jobs", "max_attempts": 1})
    for n in range(6):
        core.call(Op.TASK_SUBMIT, {**BOX, "data": {"n": n, "pad": DATA}, "key": f"k{n}",
                                   "subscriber_id": f"w{n}"})
        core.call(Op.MESSAGE_SEND, {**BOX, "data": [n, DATA], "work_key": f"w{n}"}, CAROL)
        core.call(Op.MESSAGE_SEND, {**BOX, "data": n}, BOB)
    for n in range(5):
        delivery = core.call(Op.RECEIVE, BOX)["delivery"]
        if n % 2:
            core.call(Op.DELIVERY_REJECT, {"lease": delivery["lease"]})
        else:
            core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": [DATA] * n})
    core.call(Op.RECEIVE, {**BOX})  # one left running
    core.advance(60)
    core.drain()
    before = {t: core.tenant_usage(t) for t in ("acme", "globex")}
    assert before["acme"]["payload_bytes"] > 0 and before["globex"]["payload_bytes"] > 0
    # Replay never refuses, even under a smaller limit than the journal holds.
    small = CoreDriver(
        holders={}, mailbox=None, runs=(), tenants=TENANTS, retention_seconds=RETENTION,
        tombstone_seconds=RETENTION, tenant_limits=TenantLimits(payload_bytes=1),
    )
    for rec in core.records:
        small.apply(on_disk(rec), core.now)
    for rebuilt in (core.replay(), small):
        assert {t: rebuilt.tenant_usage(t) for t in before} == before
    fresh = core.fresh()
    Restore(fresh).apply([on_disk(rec) for rec in core.snapshot()], core.now)
    assert {t: fresh.tenant_usage(t) for t in before} == before
    fresh = core.fresh()
    for rec in core.snapshot():
        fresh.apply(on_disk(rec), core.now)
    assert {t: fresh.tenant_usage(t) for t in before} == before


def test_subscriptions_are_charged_until_detached_or_forgotten() -> None:
    core = budget(SIZE + 30)
    join = {"scope": "s", "subscriber_id": "w" * 10, "subscriber_scope": "s"}
    task = core.call(Op.TASK_SUBMIT, {**BOX, "data": DATA, "key": "k", "subscriber_id": "a"})
    assert used(core) == SIZE + 2  # "a" in run "s"
    core.call(Op.TASK_JOIN, {**join, "task": task["id"]})
    assert used(core) == SIZE + 2 + 11
    assert_over_budget(core, Op.TASK_JOIN, {**join, "task": task["id"], "subscriber_id": "v" * 20})
    assert_over_budget(core, Op.TASK_SUBMIT, {**BOX, "data": "z" * 15, "subscriber_id": "b"})
    core.call(Op.TASK_DETACH, {"scope": "s", "task": task["id"], "subscriber_id": "a"})
    assert used(core) == SIZE + 11
    delivery = core.call(Op.RECEIVE, BOX)["delivery"]
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})
    core.advance(RETENTION + 1)  # tombstoned: the subscription is kept with the task
    assert used(core) == 11
    core.advance(RETENTION + 1)  # forgotten
    assert used(core) == 0


def test_work_key_dedupe_entries_are_charged_for_their_window() -> None:
    entry = len("job-1") + 128  # the key, and what is kept beside it
    core = budget(SIZE + entry, dedupe_seconds=600.0)
    sent = core.call(Op.MESSAGE_SEND, {**BOX, "data": DATA, "work_key": "job-1"})
    assert used(core) == SIZE + entry
    assert core.call(Op.MESSAGE_SEND, {**BOX, "data": DATA, "work_key": "job-1"}) == {
        "id": sent["id"], "replay": True}  # a replay stores nothing
    delivery = core.call(Op.RECEIVE, BOX)["delivery"]
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})
    assert used(core) == entry  # the message is gone, its key's entry is not
    assert_over_budget(core, Op.MESSAGE_SEND, {**BOX, "data": DATA, "work_key": "job-2"})
    core.advance(601)  # the window has passed: the entry is dropped
    assert used(core) == 0
    core.call(Op.MESSAGE_SEND, {**BOX, "data": DATA, "work_key": "job-2"})
