"""Progress events: published by the worker holding a task, pushed to every subscriber.

DELIVERY_PROGRESS publishes an event on the task a delivery holds; TASK_EVENTS
subscribes a connection to a task's events (or, with ``stop``, ends that). The task's
retained events and their bounds are eventlog.py's; this book decides who may publish,
what is kept, and who is told.

What always holds:
- a progress event is fenced like a completion: only the live lease of the task's
  delivery publishes it (``Settlement.settled_item``: STALE_CLAIM for a lease lost,
  settled or guessed, SCOPE_CANCELLED in a cancelled run), and a refused one leaves no
  trace;
- an event is refused, and nothing kept, when its data is over ``MAX_EVENT_BYTES``
  (INVALID_ARGUMENT), when the task has used its rate (``PROGRESS_EVENTS_PER_SECOND``,
  bursts of ``PROGRESS_EVENTS_BURST``: RESOURCE_EXHAUSTED), or when its bytes do not fit
  in its tenant's stored payload bytes (RESOURCE_EXHAUSTED, ``room_for_bytes``): an
  event's data is charged there, as a result is, while it is retained;
- each event is one TASK_PROGRESSED record: replayed, and in snapshots
  (SNAP_TASK_EVENTS), the task's retained events are the live ones;
- a task's first follower starts its log as its first progress event would (one
  TASK_FOLLOWED record: where the task is), so that it hears every state change from
  then on; a task that has a log, or has ended, writes nothing more when followed: one
  record a task at most, however often it is followed (and a task nobody follows
  pays nothing);
- a subscription is a connection's, live only, ended by the task's end (its outcome is
  pushed last, with ``done``), by ``stop``, or by its connection's end; a connection
  holds at most ``MAX_EVENT_SUBSCRIPTIONS`` (RESOURCE_EXHAUSTED past it);
- publishing costs O(the task's subscribers): one push message, shared by every
  subscriber (the shell encodes it once); nothing walks other tasks or connections.
  What a slow subscriber is not read fast enough is the shell's to drop and count
  (output.py): the core never queues for it.
"""

from __future__ import annotations

from typing import Any, Final

from rsproto import ErrorCode, Kind, Limits, Op, Push

from ..ground.errors import CoreError
from ..ground.payloads import measured_payload, stored_size
from ..ground.validate import int_arg, invalid, opt_bool
from ..records import Rec
from ..records.itemrecords import TaskFollowed, TaskProgressed
from ..records.snaprecords import SnapTaskEvents
from ..run.eventlog import TaskLog, outcome_event
from ..run.items import Item
from ..state.tables import Applier, Handler, Tables
from .settlement import Settlement
from .tasks import Tasks
from .workbook import Work

__all__ = ["Progress"]

_PUSH: Final = int(Kind.PUSH)
_TASK_EVENTS: Final = int(Push.TASK_EVENTS)
_MAX_EVENT_BYTES: Final = Limits.MAX_EVENT_BYTES
_MAX_SUBSCRIPTIONS: Final = Limits.MAX_EVENT_SUBSCRIPTIONS
_MAX_SEQ: Final = 2**53


class Progress:
    """DELIVERY_PROGRESS, TASK_EVENTS, their records, and the live subscriptions. Owned
    by the Core."""

    def __init__(
        self, tables: Tables, work: Work, settlement: Settlement, tasks: Tasks,
        rate: int = Limits.PROGRESS_EVENTS_PER_SECOND,
    ) -> None:
        self.tables = tables
        # a task's progress rate: the protocol's, or higher in rsd's own tests and bench
        self.rate = float(rate)
        self.burst = float(max(Limits.PROGRESS_EVENTS_BURST, 2 * rate))
        self.work = work
        self.settlement = settlement
        self.tasks = tasks
        self.watching: dict[str, dict[int, None]] = {}  # task id -> subscribed connections
        self.by_conn: dict[int, dict[str, None]] = {}  # connection -> task ids it watches
        self.ops: dict[int, Handler] = {
            Op.DELIVERY_PROGRESS: self.progress, Op.TASK_EVENTS: self.subscribe,
        }
        self.appliers: dict[int, Applier] = {
            Rec.TASK_PROGRESSED: self.apply_progressed,
            Rec.TASK_FOLLOWED: self.apply_followed,
            Rec.SNAP_TASK_EVENTS: self.apply_snapshot,
        }

    # ---- publishing ------------------------------------------------------------------

    def progress(
        self, now: float, conn: int, rid: int, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Publish ``data`` on the task the delivery ``lease`` holds; its ``seq``."""
        item = self.settlement.settled_item(conn, args)  # fenced first: STALE_CLAIM
        if item.is_message:
            raise invalid(
                "a message has no events: progress is published on a task (submit it "
                "with TASK_SUBMIT to let callers follow it)"
            )
        data = args.get("data")
        size = measured_payload("data", data)[1]
        if size > _MAX_EVENT_BYTES:
            raise invalid(
                f"a progress event's data is {size} bytes encoded, over the limit of "
                f"{_MAX_EVENT_BYTES} (max_event_bytes): publish less, or where to find it"
            )
        log = item.events
        if log is not None and not log.take(now, self.rate, self.burst):
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"task {item.id} published progress faster than {self.rate:g} events a "
                f"second (bursts of {self.burst:g}): publish less often",
                {"limit": "progress_events_per_second", "value": self.rate},
            )
        self.tables.tenants.room_for_bytes(item.tenant, size)
        tables = self.tables
        event = tables.commit(
            TaskProgressed(Rec.TASK_PROGRESSED, item.id, data, tables.wall(now), size), now
        )
        if log is None:  # its first: the log made now starts its rate with it (nobody
            # follows a task without a log: its first follower starts one)
            item.events.take(now, self.rate, self.burst)
        self.published(item, event)
        return {"seq": event["seq"]}

    def apply_progressed(self, rec: TaskProgressed, now: float) -> dict[str, Any] | None:
        _, item_id, data, at, size = rec
        item = self.work.items.get(item_id)
        if item is None or item.terminal:
            return None  # (a task ends after its last event: never in a replay)
        log: TaskLog | None = item.events
        if log is None:  # the first
            log = self._start_log(item)
        if size < 0:
            size = stored_size(data)
        event, change = log.progress(data, at, size)
        self._charge(item, change)
        return event  # (``commit`` returns it: the handler's reply and push)

    def apply_followed(self, rec: TaskFollowed, now: float) -> TaskLog | None:
        item = self.work.items.get(rec[1])
        if item is None or item.terminal:
            return None  # (it is followed while live: never in a replay)
        log = item.events
        return self._start_log(item) if log is None else log

    def _start_log(self, item: Item) -> TaskLog:
        """``item``'s log, made by its first progress event or its first follower: its
        first event says where the task is (its state and attempt)."""
        log = item.events = TaskLog()
        self._charge(item, log.state(item.state._value_, item.attempt)[1])
        return log

    def _charge(self, item: Item, change: int) -> None:
        if change:
            item.size += change
            self.tables.tenants.charge(item.tenant, change)

    def apply_snapshot(self, rec: SnapTaskEvents, now: float) -> None:
        _, item_id, next_seq, events = rec
        item = self.work.items.get(item_id)
        if item is None or item.events is not None:
            return
        log = item.events = TaskLog(next_seq)
        for event in events:
            size = stored_size(event["data"]) if event["kind"] == "progress" else 0
            log.events.append(event)
            log.sizes.append(size)
            log.bytes += size
        self._charge(item, log.bytes)

    # ---- subscribers -----------------------------------------------------------------

    def subscribe(
        self, now: float, conn: int, rid: int, args: dict[str, Any]
    ) -> dict[str, Any]:
        """The task's retained events past ``after`` (0: all) and how many of those
        are no longer kept, its state; then its events are pushed to ``conn`` until
        it ends (its outcome last). ``stop``: end this connection's subscription. A
        live task's first follower starts its log (TASK_FOLLOWED)."""
        item = self.tasks.task_of(conn, args)
        if opt_bool(args, "stop", False):
            return {"task": item.id, "stopped": self._drop(conn, item.id)}
        after = int_arg(args, "after", 0, _MAX_SEQ, 0)
        if item.terminal:
            log = item.events
            events, missed = ([], 0) if log is None else log.since(after)
            events.append(outcome_event(item))
        else:
            events, missed = self._follow(now, conn, item).since(after)
        return {
            "task": item.id, "scope": item.scope, "state": item.state._value_,
            "attempt": item.attempt, "events": events, "missed": missed,
            "done": item.terminal,
        }

    def _follow(self, now: float, conn: int, item: Item) -> TaskLog:
        """``conn`` follows the live ``item`` (once however often asked); its log,
        started by its first follower."""
        watched = self.by_conn.get(conn)
        if watched is None:
            watched = self.by_conn[conn] = {}
        new = item.id not in watched
        if new and len(watched) >= _MAX_SUBSCRIPTIONS:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"this connection follows {len(watched)} tasks' events, the most one "
                f"may ({_MAX_SUBSCRIPTIONS}, max_event_subscriptions): stop some, or "
                "use another connection",
                {"limit": "max_event_subscriptions", "value": _MAX_SUBSCRIPTIONS},
            )
        log: TaskLog | None = item.events
        if log is None:  # its first follower: from now on its state changes are events
            started: TaskLog = self.tables.commit(TaskFollowed(Rec.TASK_FOLLOWED, item.id), now)
            log = started
        if new:
            watched[item.id] = None
            conns = self.watching.get(item.id)
            if conns is None:
                conns = self.watching[item.id] = {}
            conns[conn] = None
        return log

    def _drop(self, conn: int, task_id: str) -> bool:
        watched = self.by_conn.get(conn)
        if watched is None or task_id not in watched:
            return False
        del watched[task_id]
        if not watched:
            del self.by_conn[conn]
        conns = self.watching[task_id]
        del conns[conn]
        if not conns:
            del self.watching[task_id]
        return True

    def published(self, item: Item, event: dict[str, Any]) -> None:
        """``event`` of ``item`` to every subscriber: one message, shared. Also heard as
        ``item_event`` (a state change of a task with retained events)."""
        conns = self.watching.get(item.id)
        if conns:
            msg = [_PUSH, _TASK_EVENTS, {
                "task": item.id, "scope": item.scope, "events": [event], "missed": 0,
                "done": False,
            }]
            messages = self.tables.effects.messages
            for conn in conns:
                messages.append((conn, msg))

    def ended(self, now: float, item: Item) -> None:
        """``item_ended``: the outcome, last, to every subscriber; their subscriptions end.
        (Every task's ending hears it: nothing but a test while nobody follows any.)"""
        if not self.watching:
            return
        conns = self.watching.pop(item.id, None)
        if not conns:
            return
        msg = [_PUSH, _TASK_EVENTS, {
            "task": item.id, "scope": item.scope, "events": [outcome_event(item)],
            "missed": 0, "done": True,
        }]
        messages = self.tables.effects.messages
        for conn in conns:
            watched = self.by_conn[conn]
            del watched[item.id]
            if not watched:
                del self.by_conn[conn]
            messages.append((conn, msg))

    def drop_connection(self, conn: int) -> None:
        """A connection's subscriptions end with it. O(its subscriptions)."""
        for task_id in self.by_conn.pop(conn, {}):
            conns = self.watching[task_id]
            del conns[conn]
            if not conns:
                del self.watching[task_id]

    def subscriptions(self) -> int:
        """How many subscriptions are live (stats)."""
        return sum(len(watched) for watched in self.by_conn.values())
