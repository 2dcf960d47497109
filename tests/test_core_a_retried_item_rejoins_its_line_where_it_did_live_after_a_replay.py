"""A retried item waits out its backoff, then joins the end of its ready line; a replay
of the journal (after a crash) or of a snapshot and the journal after it puts it in the
same place, not ahead of the items submitted while it waited: the end of its backoff is
a record (ITEM_DUE), applied where it happened, never the replay's own clock reading.
"""

from __future__ import annotations

import itertools
from typing import Any

from support.core import CoreDriver, on_disk

from rsd.core import Core
from rsd.core.restore import Restore
from rsproto import Op


def _core() -> CoreDriver:
    return CoreDriver(holders={}, mailbox=None, scope_ids=lambda: "unused")


def _line(core: Core) -> list[Any]:
    queue = core.work.find_queue("default", "s", "jobs")
    assert queue is not None
    return [item.data for item in queue.queued()]


class Journaled:
    """A live core whose records are kept as a journal: "a" retried with a 2 s backoff at
    t=1, "b" submitted at t=1.5, during it."""

    def __init__(self) -> None:
        self.core = core = _core()
        core.recovered(0.0, clean=True)
        core.connected(1, "alice")
        self.rids = itertools.count(1)
        self.log: list[Any] = [on_disk(rec) for rec in core.effects.take_records()]
        self.call(0.0, Op.MAILBOX_ENSURE, {"name": "jobs", "max_attempts": 5})
        self.call(0.0, Op.SCOPE_CREATE, {"scope": "s"})
        self.submit(0.0, "a")
        got = self.call(1.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "lease_seconds": 30})
        self.call(1.0, Op.DELIVERY_RETRY, {"lease": got["delivery"]["lease"], "delay_ms": 2000})
        self.submit(1.5, "b")

    def call(self, now: float, op: int, args: dict[str, Any]) -> Any:
        try:
            return self.core.handle(now, 1, next(self.rids), op, args)
        finally:
            self.log.extend(on_disk(rec) for rec in self.core.effects.take_records())
            self.core.effects.take_messages()

    def submit(self, now: float, key: str) -> None:
        self.call(now, Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "key": key, "data": key})

    def tick(self, now: float) -> None:
        self.core.tick(now)
        self.log.extend(on_disk(rec) for rec in self.core.effects.take_records())


def test_a_retried_item_rejoins_behind_what_came_during_its_backoff_after_a_replay() -> None:
    live = Journaled()
    snapshot = [on_disk(rec) for rec in live.core.snapshot()]  # "a" still in its backoff
    snapshot_at = len(live.log)
    live.submit(2.0, "c")
    live.tick(3.5)  # the backoff is over: "a" joins the end
    live.submit(4.0, "d")
    assert _line(live.core) == ["b", "c", "a", "d"]

    from_log = _core()
    for rec in live.log:
        from_log.apply(rec, 10.0)  # a replay long after: every backoff has run out
    assert _line(from_log) == ["b", "c", "a", "d"]

    from_snapshot = _core()
    restore = Restore(from_snapshot)
    restore.apply(snapshot, 10.0)
    restore.apply(live.log[snapshot_at:], 10.0)
    assert _line(from_snapshot) == ["b", "c", "a", "d"]


def test_a_retry_whose_backoff_ran_out_unrecorded_rejoins_at_the_first_tick() -> None:
    """A crash between the end of a backoff and its record: after the replay the item
    waits for the first tick, which records its end and puts it at the end of its line."""
    live = Journaled()
    replayed = _core()
    for rec in live.log:
        replayed.apply(rec, 10.0)
    assert _line(replayed) == ["b"]  # "a" waits for its record
    replayed.recovered(10.0, clean=False)
    replayed.tick(10.0)
    assert _line(replayed) == ["b", "a"]
