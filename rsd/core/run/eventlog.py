"""A task's retained events: its progress events and the state changes between them.

A task has a log from its first progress event (TASK_PROGRESSED) or its first follower
(TASK_FOLLOWED: one subscribing to its events while it is live), whichever comes first;
the log's first event says where the task was then (its state and attempt). Its events
are kept until the task is tombstoned, as its result is (then only its next seq is), and
the log goes when the task is forgotten; a task that nobody follows and that never
publishes progress has none and costs nothing. Once it has a log, every state change of
the task (``Work.set_state``, the one place an item's state changes) is an event of it
too, but the end: the outcome is the last event, built from the task itself when it is
sent (``outcome_event``), never kept twice.

What always holds:
- each event is a map as the wire shows it (protocol.md, "Task events"): ``seq`` (1, 2,
  ... per task, never reused), ``kind`` ("progress" | "state" | "outcome") and the
  fields of its kind; an event is never changed once made (replies and pushes share it);
- at most ``Limits.EVENTS_RETAINED`` events and ``Limits.EVENTS_RETAINED_BYTES`` bytes
  of their data are kept: the oldest are dropped first, and a reader asking from before
  the oldest kept is told how many it missed (the gap in seqs: nothing else counts);
- the log is rebuilt alike from the records (TASK_PROGRESSED, TASK_FOLLOWED, and the
  item records whose state changes it follows) and from its snapshot record
  (SNAP_TASK_EVENTS): the same events, seqs and bytes, live or replayed;
- the rate bucket (``take``) is live only: a restart starts it full.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

from rsproto import Limits

from ..records import Rec
from ..records.snaprecords import SnapTaskEvents

__all__ = ["TaskLog", "outcome_event"]

_RETAINED: Final = Limits.EVENTS_RETAINED
_RETAINED_BYTES: Final = Limits.EVENTS_RETAINED_BYTES
_RATE: Final = float(Limits.PROGRESS_EVENTS_PER_SECOND)
_BURST: Final = float(Limits.PROGRESS_EVENTS_BURST)


class TaskLog:
    """One task's retained events, oldest first, with the bytes of their data."""

    __slots__ = ("bytes", "events", "filled_at", "next_seq", "sizes", "tokens")

    def __init__(self, next_seq: int = 1) -> None:
        self.events: deque[dict[str, Any]] = deque()
        self.sizes: deque[int] = deque()  # each event's data bytes, as charged
        self.bytes = 0
        self.next_seq = next_seq
        self.tokens = _BURST  # the rate bucket (live only)
        self.filled_at: float | None = None

    def add(self, event: dict[str, Any], size: int) -> int:
        """Keep ``event`` (its ``seq`` given here) whose data is ``size`` bytes, dropping
        the oldest past the bounds. Returns the change of the bytes kept (what its
        tenant's charge moves by)."""
        event["seq"] = self.next_seq
        self.next_seq += 1
        self.events.append(event)
        self.sizes.append(size)
        change = size
        while len(self.events) > _RETAINED or self.bytes + change > _RETAINED_BYTES:
            self.events.popleft()
            change -= self.sizes.popleft()
        self.bytes += change
        return change

    def progress(self, data: Any, at: float, size: int) -> tuple[dict[str, Any], int]:
        """A progress event of ``data`` published at the wall instant ``at``."""
        event = {"seq": 0, "kind": "progress", "data": data, "at": at}
        return event, self.add(event, size)

    def state(self, state: str, attempt: int) -> tuple[dict[str, Any], int]:
        """The task moved to ``state`` (not an end: that is the outcome), its delivery
        count ``attempt``."""
        event = {"seq": 0, "kind": "state", "state": state, "attempt": attempt}
        return event, self.add(event, 0)

    def forget(self) -> None:
        """The task was tombstoned: its events go with its outcome; the seq of what
        comes next (its outcome event) does not change."""
        self.events.clear()
        self.sizes.clear()
        self.bytes = 0

    def since(self, after: int) -> tuple[list[dict[str, Any]], int]:
        """The events kept whose seq is past ``after``, and how many past it are no
        longer kept (dropped before the oldest kept)."""
        events = self.events
        if not events:
            return [], max(0, self.next_seq - 1 - after)
        first = events[0]["seq"]
        missed = max(0, first - 1 - after)
        if after < first:
            return list(events), missed
        return [event for event in events if event["seq"] > after], 0

    def take(self, now: float, rate: float = _RATE, burst: float = _BURST) -> bool:
        """One token of the task's progress rate (``Limits.PROGRESS_EVENTS_PER_SECOND``,
        bursts of ``PROGRESS_EVENTS_BURST``, unless the Core was given others): False
        when none is left."""
        if self.filled_at is None:
            self.tokens = burst
        else:
            self.tokens = min(burst, self.tokens + (now - self.filled_at) * rate)
        self.filled_at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def record(self, item_id: str) -> SnapTaskEvents:
        """The snapshot record of this log (right after its task's SNAP_ITEM)."""
        return SnapTaskEvents(Rec.SNAP_TASK_EVENTS, item_id, self.next_seq, list(self.events))


def outcome_event(item: Any) -> dict[str, Any]:
    """The last event of an ended task: its end state, outcome and reason (the outcome
    nil and ``tombstoned`` once its retention passed), with the seq after its log's."""
    log = item.events
    event = {
        "seq": 1 if log is None else log.next_seq, "kind": "outcome",
        "state": item.state._value_, "outcome": item.outcome, "reason": item.reason,
    }
    if item.tombstoned:
        event["tombstoned"] = True
    return event
