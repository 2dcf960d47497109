"""The output path: each loop turn's output written once per connection, held for an
fsync when it must be, and connections resumed once their output has drained.

What always holds:
- all output produced in one loop turn (replies, deferred replies, pushes to other
  connections) leaves in one ``transport.write`` per connection, from ``flush``;
- journal records of a batch are written before its replies, and replies that depend on
  records not yet fsynced wait for the fsync (group commit, groupcommit.py); while any
  output is held, a connection's output waits behind it too unless all of it is quiet
  (``conn.quiet_bytes``: PING replies, renewals that renewed every lease and wrote no
  record, its error frame) and nothing of that connection's is held: its replies leave
  in order, and none reveals a change before it is durable. One exception to the
  order: a PING's reply and a quiet renewal's (``conn.overtaking``, batches.py) are
  never held. They reveal nothing, journaled or not, and no client may rely on the
  order of replies (protocol.md), so they leave at the flush of their turn, in their
  order, ahead of that connection's held output (which keeps its own order): a client
  whose writes wait for a synchronous standby being replaced still hears its probe
  answered, and keeps a primary that is alive, and its leases, renewed, are confirmed
  before their deadlines. Never between two replies about one lease: a renewal that
  follows a release or settlement of that lease is STALE_CLAIM, not quiet, and keeps
  its place (a primary that may have lapsed sends nothing at all, these replies
  included);
- a deferred reply or push for a connection at its high-water mark waits, unencoded, in
  its ``owed``; a failed connection's error frame goes after everything else due to it;
- a task's event push (TASK_EVENTS) for a connection at its high-water mark is dropped,
  not owed, and counted for that task and connection (``missed_events``): the next push
  of that task to it says how many it lost, so a subscriber that does not read never
  grows rsd; only the last push of a subscription (``done``: the outcome) is owed, one
  per subscription at most. A push shared by several connections is encoded once;
- a connection waiting for its output is resumed in a callback of its own once its output
  is at or below the low-water mark (or, after its share of a loop turn, in a later
  turn, round robin, as many a turn as the turn budget allows: turns.py): owed output
  first, then its backlog, then the undecoded rest of its read, then reading again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import rsproto as wire
from rsproto import ErrorCode, Kind, Limits, Push

from ..logs import NoteLog
from ..policy import Policy
from .batches import reply_too_large

if TYPE_CHECKING:
    from ..core import Core
    from ..disk.groupcommit import GroupCommit
    from ..metrics import Metrics
    from .batches import Batches
    from .clientbudget import ClientBudget
    from .connection import Connection
    from .coretimer import CoreTimer
    from .feeds import Feeds
    from .remoteneeds import RemoteNeeds
    from .turns import Turns

__all__ = ["Output", "OutputHost", "encode_message"]

log = logging.getLogger("rsd")

_REPLY = int(Kind.REPLY)
_PUSH = int(Kind.PUSH)
_TASK_EVENTS = int(Push.TASK_EVENTS)
_MAX_MISSED_TASKS = Limits.MAX_EVENT_SUBSCRIPTIONS
_MAX_BODY = wire.MAX_FRAME_BYTES
_HIGH = Policy.OUTPUT_HIGH_WATER_BYTES
_ERROR = Kind.ERROR
_LOW = Policy.OUTPUT_LOW_WATER_BYTES


def encode_message(msg: list[Any]) -> bytes:
    """A deferred reply or push as a frame. One that cannot be encoded still answers
    its request (INTERNAL) rather than leaving it unanswered; a push is dropped."""
    try:
        body = wire.pack_from_rsd(msg)
        if len(body) <= _MAX_BODY:
            return wire.pack_header(len(body)) + body
        if msg[0] == _REPLY:
            return reply_too_large(msg[1], len(body))
        log.error("dropping a push of %d bytes, over the frame limit", len(body))
        return b""
    except Exception as exc:
        log.error("cannot encode message %r: %s", msg[:2], exc)
        if msg[0] == _REPLY:
            return wire.error_frame(msg[1], ErrorCode.INTERNAL, "reply cannot be encoded")
        return b""


def _put_events(conn: Connection, msg: list[Any], frame: bytes) -> bytes:
    """A task's event push to ``conn`` (see the module docstring): dropped and counted
    while its output is at the mark (but the last, owed); else put, with the count of
    what it missed before. ``frame``: the push already encoded (b"" if not yet); the
    frame encoded for others, or ``frame`` again."""
    body = msg[2]
    task = body["task"]
    missed = conn.missed_events
    at_mark = bool(conn.owed) or conn.pending() >= _HIGH
    if at_mark and not body["done"]:
        if missed is None:
            missed = conn.missed_events = {}
        elif task not in missed and len(missed) >= _MAX_MISSED_TASKS:
            del missed[next(iter(missed))]  # (a subscription stopped long ago)
        missed[task] = missed.get(task, 0) + len(body["events"])
        return frame
    if missed and task in missed:  # this connection's own count: a push of its own
        msg = [msg[0], msg[1], {**body, "missed": body["missed"] + missed.pop(task)}]
        if at_mark:
            conn.owe(msg)
        else:
            conn.put(encode_message(msg))
        return frame
    if at_mark:
        conn.owe(msg)
        return frame
    if not frame:
        frame = encode_message(msg)
    conn.put(frame)
    return frame


def _send_overtaking(conn: Connection) -> list[bytes]:
    """Send ``conn``'s answers of this turn that are never held (``conn.overtaking``) now,
    ahead of the rest of its output, which is held (the module docstring); that rest,
    in order."""
    out, overtaking = conn.out, conn.overtaking
    if len(overtaking) == 1:
        index = overtaking[0]
        _send(conn, out[index])
        return out[:index] + out[index + 1:]
    sent = set(overtaking)
    _send(conn, b"".join(out[index] for index in overtaking))
    return [frame for index, frame in enumerate(out) if index not in sent]


def _send(conn: Connection, data: bytes) -> None:
    transport = conn.transport
    if transport is None or transport.is_closing() or conn.finished:
        return
    transport.write(data)


class OutputHost(Protocol):
    """What the output side uses of the server (server.py's ``Server`` is one). Read at
    each flush, not kept: group commit ends (``commit`` is None) when the server stops."""

    loop: asyncio.AbstractEventLoop
    core: Core
    conns: dict[int, Connection]
    commit: GroupCommit[Connection] | None
    metrics: Metrics
    budget: ClientBudget
    turns: Turns[Connection]
    timer: CoreTimer
    batches: Batches
    feeds: Feeds | None  # a cluster's primary: the standbys' feeds
    needs: RemoteNeeds  # needs of another shard: grants asked of it
    # A cluster's primary: until when (monotonic) it may lead; past it, it may have been
    # replaced (None: one node alone).
    leadership: Callable[[], float] | None

    def snapshot_asked(self) -> None: ...

    def lapsed(self) -> None: ...


class Output:
    def __init__(self, server: OutputHost) -> None:
        self.server = server
        self.loop = server.loop
        self._dirty: set[Connection] = set()
        self._flush_scheduled = False
        self._resumable: set[Connection] = set()
        self._resume_scheduled = False
        self._replied: list[Callable[[bool], None]] = []  # when_replied's, this turn
        self.notes = NoteLog(self.loop)  # the core's notes of rare events, to the log

    def dirty(self, conn: Connection) -> None:
        """``conn`` has output: write it in this turn's flush."""
        self._dirty.add(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def when_replied(self, done: Callable[[bool], None]) -> None:
        """``done(True)`` once a reply to what the core has done so far would have left
        (at this turn's flush, or once group commit releases it), ``done(False)`` if
        group commit refuses it: an HTTP action (api.py) answers no sooner."""
        self._replied.append(done)
        self.schedule_flush()

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def forget(self, conn: Connection) -> None:
        """``conn`` is gone: nothing more is written or resumed for it."""
        self._dirty.discard(conn)
        self._resumable.discard(conn)

    def flush(self) -> None:
        """Once per loop turn: records to the journal, then every connection's output,
        sent now or, when it depends on records not yet fsynced, handed to group commit
        (groupcommit.py) to hold until the fsync covering it completes."""
        self._flush_scheduled = False
        server = self.server
        leadership = server.leadership
        if leadership is not None and leadership() <= server.loop.time():  # may have lapsed
            server.lapsed()
            return
        core = server.core
        records = core.effects.take_records()
        must_sync = core.effects.take_sync()
        messages = core.effects.take_messages()
        if core.effects.notes:  # rare events (expired leases, dead letters): logged
            self.notes.log(*core.effects.take_notes())
        if core.effects.snapshot_asks:  # SNAPSHOT_NOW: rare, admin-only
            server.snapshot_asked()
            messages += core.effects.take_messages()
        grants = core.blocked.grants  # needs of another shard: asks, and grants that ended
        if grants.asks or grants.changes != server.needs.changes:
            server.needs.kick()
        commit = server.commit
        if commit is not None and records:
            commit.write(records)  # first: nothing below may lose the batch's records
            if server.feeds is not None:  # a cluster's primary: to every standby at once
                server.feeds.publish(records)
        if server.feeds is not None and server.feeds.joining:  # standbys that just came
            server.feeds.start_copies()
        if messages:
            self._put_messages(messages)
        self._write_out(records, must_sync)
        self._account()
        if commit is not None:
            commit.after_flush()

    def _put_messages(self, messages: list[Any]) -> None:
        """``flush``'s deferred replies and pushes, each into its connection's output
        (or owed, behind what it owes already or while its output is at the mark)."""
        conns = self.server.conns
        late_error = self.server.metrics.late_error
        dirty = self._dirty
        shared: list[Any] | None = None  # the last event push encoded, and its frame
        frame = b""
        for conn_id, msg in messages:
            kind = msg[0]
            if kind == _ERROR:
                late_error(msg[2])  # a deferred request answered with an error
            conn = conns.get(conn_id)
            if conn is None or conn.finished or (conn.closing and conn.final is None):
                continue  # gone, or its error frame is out: nothing may follow it
            if kind == _PUSH and msg[1] == _TASK_EVENTS:
                if msg is not shared:
                    shared, frame = msg, b""
                frame = _put_events(conn, msg, frame)
            elif conn.owed or conn.pending() >= _HIGH:
                conn.owe(msg)
            else:
                conn.put(encode_message(msg))
            dirty.add(conn)

    def _write_out(self, records: list[Any], must_sync: bool) -> None:
        """``flush``'s output of every written-to connection: sent now, or held by group
        commit when it reveals ``records`` (or a sync asked for) not yet fsynced."""
        dirty = self._dirty
        commit = self.server.commit
        for conn in dirty:
            if conn.final is not None and not conn.owed:
                conn.put(conn.final)  # reveals nothing: quiet if all before it is
                conn.quiet_bytes += len(conn.final)
                conn.final = None
        if commit is not None and commit.must_hold(records, must_sync):
            batch = []
            for conn in dirty:
                out = conn.out
                if not out:
                    continue
                if conn.quiet_bytes == conn.out_bytes and not conn.held_bytes:
                    # Reveals nothing journaled and nothing of its is held before it:
                    # no fsync, of this turn or another connection's, is awaited.
                    _send(conn, out[0] if len(out) == 1 else b"".join(out))
                else:
                    rest = _send_overtaking(conn) if conn.overtaking else out
                    if rest:
                        data = b"".join(rest)
                        batch.append((conn, data))
                        conn.held_bytes += len(data)
                out.clear()
                conn.out_bytes = conn.quiet_bytes = 0
                if conn.overtaking:
                    conn.overtaking.clear()
            if batch or records or must_sync:  # else nothing here awaits an fsync
                commit.hold(batch)
        else:
            for conn in dirty:
                out = conn.out
                if out:
                    _send(conn, out[0] if len(out) == 1 else b"".join(out))
                    out.clear()
                    conn.out_bytes = conn.quiet_bytes = 0
                    if conn.overtaking:
                        conn.overtaking.clear()

    def _account(self) -> None:
        """After ``flush``'s output: each connection charged to the output budget (and
        closed or resumed once its output is out), the timer armed, the replied-to
        callbacks run (or held behind the fsync that covers their records)."""
        server = self.server
        commit = server.commit
        dirty = self._dirty
        charge = server.budget.charge
        for conn in dirty:
            charge(conn)
            if conn.closing or conn.waiting_output:
                self.after_output(conn)
        dirty.clear()
        budget = server.budget
        if budget.total > budget.limit:
            budget.enforce()
        server.timer.arm()
        if self._replied:
            replied, self._replied = self._replied, []
            for done in replied:
                if commit is None:
                    done(True)
                else:
                    commit.after_held(done)

    def refuse_held(self, conn: Connection, size: int) -> None:
        """Group commit gave up on ``size`` bytes of ``conn``'s held output: no standby
        acknowledged what it reports in time (a cluster's primary). The connection is
        told UNAVAILABLE (its requests' outcome is unknown) and closed; nothing of that
        output is sent."""
        conn.held_bytes -= size
        if conn.feed:  # a standby's feed waits for nothing it could be refused
            return
        conn.fail(
            ErrorCode.UNAVAILABLE,
            "no standby of the cluster acknowledged this connection's changes in time: "
            "their outcome is unknown (they are on the primary's disk only)",
        )
        self.dirty(conn)
        self.schedule_flush()

    def send_held(self, conn: Connection, data: bytes) -> None:
        """Group commit releases output it held for an fsync."""
        server = self.server
        leadership = server.leadership
        if leadership is not None and leadership() <= server.loop.time():  # nothing leaves
            server.lapsed()
            return
        conn.held_bytes -= len(data)
        _send(conn, data)
        self.server.budget.charge(conn)
        self.after_output(conn)

    # ---- backpressure ----------------------------------------------------------------

    def after_output(self, conn: Connection) -> None:
        """``conn``'s output moved on: a closing connection with nothing left to send is
        shut; one waiting for its output to drain is resumed if it has."""
        if (
            conn.closing
            and not conn.finished
            and conn.final is None
            and not conn.owed
            and not conn.out
            and not conn.held_bytes
        ):
            conn.finish()
        elif conn.waiting_output:
            self.maybe_resume(conn)

    def maybe_resume(self, conn: Connection) -> None:
        """If ``conn`` waits for its output to drain and it has (to the low-water mark),
        resume it in a callback of its own, soon: not inside the write that drained it."""
        if (
            conn.waiting_output
            and conn not in self._resumable
            and conn.transport is not None
            and conn.pending() <= _LOW
        ):
            self._resumable.add(conn)
            if not self._resume_scheduled:
                self._resume_scheduled = True
                self.loop.call_soon(self._resume)

    def next_turn(self, conn: Connection) -> None:
        """``conn`` used its share of this turn (batches.py): go on with it at the next
        loop turn, after other connections have been read, in the order they were cut."""
        self.server.turns.yielded(conn)
        if not self._resume_scheduled:
            self._resume_scheduled = True
            self.loop.call_soon(self._resume)

    def _resume(self) -> None:
        """A turn: connections whose output drained, then those cut short, in the order
        they were cut, while the turn budget lasts (turns.py); the rest go on at the
        next turn, after the loop has polled its sockets."""
        self._resume_scheduled = False
        turns = self.server.turns
        clock = self.server.batches.clock
        turns.begin(clock())  # also this turn's share for everyone
        resumable = list(self._resumable)
        self._resumable.clear()
        for conn in resumable:
            if conn.waiting_output:
                self._resume_one(conn)
        first = True
        while (cut := turns.next(clock(), first)) is not None:
            first = False
            if cut.yielded:
                self._resume_one(cut)
        if turns.cut and not self._resume_scheduled:
            self._resume_scheduled = True
            self.loop.call_soon(self._resume)

    def _resume_one(self, conn: Connection) -> None:
        """Owed deferred output first, then the backlog, then the framing error that
        followed it (or reading again), each only while output stays under the mark."""
        transport = conn.transport
        if transport is None or transport.is_closing() or conn.finished:
            return
        conn.waiting_output = False
        conn.yielded = False
        owed = conn.owed
        if owed:
            limit = _HIGH - conn.held_bytes - transport.get_write_buffer_size()
            while owed and conn.out_bytes < limit:
                conn.put(encode_message(owed.popleft()))
            self.dirty(conn)
            if owed:
                conn.waiting_output = True
                return
        if conn.closing:
            self.dirty(conn)  # its error frame goes next
            return
        self.server.batches.resume(conn, self.loop.time())  # backlog, then the rest read
        if conn.backlog is not None or conn.closing or conn.yielded:
            return
        if conn.error is not None:
            error, conn.error = conn.error, None
            conn.fail(error.code, error.message)
            return
        conn.unblock()
