"""Memory follows recent history, not all of it.

A finished task is tombstoned after the retention window and forgotten after the
tombstone window (a record, so replay forgets it too); and nothing the core is done with
(a forgotten task, the messages of a cancelled scope) stays referenced from a ready line
or a timer.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import CoreDriver

from rsd.core import Core, CoreError, Rec
from rsproto import ErrorCode, Op

RETENTION = 1.0
TOMBSTONE = 2.0
WORKER = 1


def make_core() -> CoreDriver:
    """One connection (a worker) and the mailbox "jobs"; short windows."""
    return CoreDriver(holders={WORKER: "worker"}, scope_ids=lambda: "scope",
                      retention_seconds=RETENTION, tombstone_seconds=TOMBSTONE)


def call(core: CoreDriver, now: float, op: int, args: dict[str, Any]) -> Any:
    return core.call(op, args, WORKER, now=now)


def finished_task(core: Core, key: str = "k") -> str:
    task = call(core, 0.0, Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "key": key,
                                            "data": {"n": 1}})["id"]
    got = call(core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})["delivery"]
    call(core, 0.0, Op.DELIVERY_COMPLETE, {"lease": got["lease"], "outcome": "done"})
    return task


def status(core: Core, task: str) -> dict[str, Any]:
    return call(core, 0.0, Op.TASK_STATUS, {"scope": "s", "task": task})


def test_a_task_is_tombstoned_after_retention_and_forgotten_after_the_tombstone_window():
    core = make_core()
    task = finished_task(core)
    core.tick(RETENTION + 0.01)
    view = status(core, task)
    assert (view["tombstoned"], view["outcome"], view["state"]) == (True, None, "SUCCEEDED")
    core.tick(RETENTION + TOMBSTONE - 0.01)
    assert status(core, task)["tombstoned"] is True  # not a moment sooner
    core.tick(RETENTION + TOMBSTONE + 0.01)
    with pytest.raises(CoreError) as info:
        status(core, task)
    assert info.value.code == ErrorCode.NOT_FOUND


def test_a_forgotten_key_starts_new_work() -> None:
    core = make_core()
    task = finished_task(core)
    core.tick(RETENTION + TOMBSTONE + 0.01)
    again = call(core, 5.0, Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "key": "k",
                                              "data": {"n": 2}})
    assert again["created"] is True
    assert again["id"] != task


def test_forgetting_is_a_record_and_replays() -> None:
    core = make_core()
    task = finished_task(core)
    core.tick(RETENTION + TOMBSTONE + 0.01)
    core.drain()
    records = core.records
    assert (Rec.FORGOTTEN, task) in records
    fresh = core.fresh()
    for rec in records:
        fresh.apply(rec, 10.0)
    assert task not in fresh.work.items
    assert list(fresh.snapshot()) == list(core.snapshot())


def test_a_snapshot_taken_between_tombstone_and_forget_still_forgets_in_time() -> None:
    core = make_core()
    task = finished_task(core)
    core.tick(RETENTION + 0.01)
    fresh = core.fresh()
    for rec in core.snapshot():
        fresh.apply(rec, 1.5)
    fresh.connected(1, "worker")
    assert status(fresh, task)["tombstoned"] is True
    fresh.tick(RETENTION + TOMBSTONE + 0.01)
    assert task not in fresh.work.items


# ---- nothing finished stays referenced ------------------------------------------------------


def _referrers_outside(core: Core, obj: Any) -> list[str]:
    """Where the core still holds ``obj`` (ready lines and wheel buckets)."""
    where = []
    for scope in core.scopes.values():
        for name, queue in scope.queues.items():
            if any(item is obj for item in queue.ready):
                where.append(f"ready line of {scope.id}/{name}")
    for bucket in core.wheel._buckets.values():
        for entry in bucket:
            if getattr(entry, "arg", None) is obj:
                where.append(f"wheel timer {entry.fn.__name__}")
    return where


def test_messages_of_a_cancelled_scope_are_let_go() -> None:
    core = CoreDriver(recovered=True)
    call(core, 0.0, Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": b"x" * 1000})
    item = next(iter(core.work.items.values()))
    call(core, 0.0, Op.SCOPE_CANCEL, {"scope": "s"})
    core.drain()
    assert core.stats()["items"] == 0
    assert _referrers_outside(core, item) == []


def test_a_forgotten_task_is_no_longer_held_anywhere() -> None:
    """A cancelled task on a queue nobody receives from any more, and a finished task
    whose deadline is far away: once forgotten, neither ready line nor timer keeps it."""
    core = CoreDriver(
        recovered=True, retention_seconds=10, tombstone_seconds=10, runs=("s", "idle")
    )
    # a queue nobody receives from any more: nothing pops the stale slot
    pending = call(core, 0.0, Op.TASK_SUBMIT, {"scope": "idle", "mailbox": "jobs", "data": 1})
    call(core, 0.0, Op.TASK_CANCEL, {"scope": "idle", "task": pending["id"]})
    far = call(core, 0.0, Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 2,
                                            "deadline": 1e11})
    lease = call(core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})["delivery"]["lease"]
    call(core, 0.0, Op.DELIVERY_COMPLETE, {"lease": lease})
    held = {pending["id"]: core.work.items[pending["id"]], far["id"]: core.work.items[far["id"]]}
    for now in (5.0, 11.0, 25.0):
        core.tick(now)
    core.drain()
    assert core.stats()["items"] == 0, "both tasks are forgotten"
    where = {task_id: _referrers_outside(core, item) for task_id, item in held.items()}
    assert where == {pending["id"]: [], far["id"]: []}
