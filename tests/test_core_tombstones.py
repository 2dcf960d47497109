"""Tombstones are bounded: a task is tombstoned after the retention window and forgotten
after the tombstone window, so memory follows recent history, not all of it."""

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
