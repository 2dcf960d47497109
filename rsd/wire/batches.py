"""The batch runner: a connection's bytes -> frames -> core calls -> replies in its output.

What always holds:
- a connection's frames run in the order they were sent, each exactly once;
- a request is executed only while its connection's output is under the high-water mark
  (connection.py): what does not fit waits, decoded in ``conn.backlog`` or undecoded in
  its decoder, and the connection is not read meanwhile; a read that arrives with the
  output already full is not decoded at all (its bytes are what the client budget
  counts; decoded, they could take 64 times as much), so a backlog holds at most the
  rest of one read;
- a read is decoded a chunk at a time: at most ``_CHUNK`` requests, and about
  ``_CHUNK_BYTES`` of them (``conn.chunk``, from the size of the frames it last decoded),
  so the decoding a share may start is bounded by bytes, not only by count;
- the work one connection's input does in a loop turn is its share of the server-wide
  turn budget (turns.py): once the share has passed (on the loop's clock) since the read
  or resumption began, the connection stops being read and the rest of its input waits
  for a later loop turn (``Output.next_turn``, turns.py), decoded in ``conn.backlog`` or
  undecoded in its decoder, so other connections are read and answered in between; its order is
  kept, and its output still leaves in one write per loop turn. The clock is read after
  each chunk of frames and after each reply over ``_HEAVY`` bytes (a request that may
  have done much work: a batch of submits, renewals, deliveries), never per small
  request, so a share is passed by at most one request;
- the requests before a broken frame run and are answered first; then the framing error
  fails the connection;
- the core's due deadlines are fired before a batch runs, so no request sees a lease
  whose deadline the core has already fired;
- a reply over the frame limit becomes RESOURCE_EXHAUSTED; a bad request an error reply;
  an unexpected exception inside the core INTERNAL for that request (and a log line);
- the reply to a PING, and to a LEASE_RENEW that wrote no record and renewed every lease
  it named, is counted in ``conn.quiet_bytes``: it reveals nothing journaled, so it need
  not wait for another connection's fsync (output.py); every other reply is not. Both
  are also named in ``conn.overtaking``: they need not wait for their own connection's
  held output either (every lease such a renewal names is live, and a client can name
  only a lease whose grant it was told, once durable);
- a request is run only if this shard serves its slot (``slots``, slotowner.py): else it
  is answered MOVED (or INVALID_ARGUMENT, a run apart from its pool) and not executed,
  or, its slot moving, held with the rest of the batch (``hold``, slotmoves.py); a
  server that owns every slot reads one flag a batch for this, nothing per request;
  an op naming a lease that left with its run on a move is refused MOVED by the core
  (forwarded.py), with the details this shard's map gives for the run's slot;
- every request the core answers is counted by op and result (metrics.py): a list bump
  for a reply, a dict bump for an error; the batch's time is observed once per batch;
- while slots move, a request naming a lease (a renewal, a release, a settlement:
  ``_BY_LEASE``) of a run in a moving slot is held as well (``_names_moving``): run after
  the export, its change would be acknowledged here and dropped with the run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any, Final, Protocol

import rsproto as wire
from rsproto import ErrorCode, FrameError, Kind, Op
from rsproto.slots import slot_of

from ..core import DEFERRED, CoreError
from ..core.machine import RENEWED_ONE
from ..policy import Policy
from ..slotowner import HELD, SlotOwner
from .session import SESSION_OPS, session_op

if TYPE_CHECKING:
    from ..core.ground.effects import Effects
    from ..metrics import Metrics
    from .connection import Connection
    from .session import SessionHost
    from .turns import Turns

__all__ = ["Batches", "reply_too_large"]

log = logging.getLogger("rsd")

_REQUEST: Final = int(Kind.REQUEST)
_REPLY: Final = int(Kind.REPLY)
_RENEW: Final = int(Op.LEASE_RENEW)
# The requests that name leases (``lease``; LEASE_RENEW's ``leases``), routed by the
# connection that holds them, not by a slot.
_BY_LEASE: Final = frozenset(int(op) for op in (
    Op.LEASE_RENEW, Op.CLAIM_RELEASE, Op.POOL_RELEASE, Op.DELIVERY_COMPLETE,
    Op.DELIVERY_RETRY, Op.DELIVERY_RELEASE, Op.DELIVERY_REJECT, Op.DELIVERY_SUSPEND,
    Op.DELIVERY_PROGRESS))
_PING: Final = int(Op.PING)
_MAX_BODY: Final = wire.MAX_FRAME_BYTES
# The codec's encoder and header, read once: compiled, ``wire.pack_from_rsd`` looks the
# name up in rsproto's module dict at every reply.
_PACK: Final = wire.pack_from_rsd
_PACK_HEADER: Final = wire.pack_header
_HIGH: Final = Policy.OUTPUT_HIGH_WATER_BYTES
_CHUNK: Final = 128  # requests decoded at a time, at most: the rest of a read waits undecoded
_CHUNK_BYTES: Final = 64 << 10  # about the bytes decoded at a time (``conn.chunk``)
_HEAVY: Final = 1024  # a reply over this many bytes is followed by a look at the clock


def _renewed_heads() -> list[bytes]:
    """The reply frame to a one-lease renewal that succeeded is ``head + packed request
    id + tail``: ``heads[n]`` is the head for a request id packed in ``n`` bytes (its
    header counts the whole body), so the hot path packs only the id."""
    prefix = wire.pack_from_rsd([_REPLY, 0, None])[:2]  # the array's and the kind's bytes
    assert wire.pack_from_rsd([_REPLY, 0, RENEWED_ONE]) == prefix + b"\x00" + _RENEWED_TAIL
    return [wire.pack_header(2 + n + len(_RENEWED_TAIL)) + prefix for n in range(10)]


_RENEWED_TAIL: Final = wire.pack_from_rsd(RENEWED_ONE)
_RENEWED_HEADS: Final = _renewed_heads()
# The session's ops (session.py runs as Python): read here as this module's constant.
_SESSION_OPS: Final = SESSION_OPS
_NOT_A_FRAME: Final = (None, None, None, None)  # what a message that is no 4-item list unpacks as


class BatchCore(Protocol):
    """What a batch asks of the core (``rsd.core.Core``): a structural type, so that the
    compiled module takes the core by its behaviour, and a test may give a stand-in."""

    effects: Effects

    def tick(self, now: float) -> None: ...

    def handle(self, now: float, conn: int, rid: int, op: Any, args: dict[str, Any]) -> Any: ...

    def lease_renew(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any: ...

    def runs_of_leases(self, handles: list[Any]) -> list[str]: ...


def reply_too_large(rid: int, size: int) -> bytes:
    """The one answer to a reply over the frame limit, whether sent at once or deferred."""
    return wire.error_frame(
        rid, ErrorCode.RESOURCE_EXHAUSTED, f"the reply would be {size} bytes, over the frame limit"
    )


def renewed_all(result: Any) -> bool:
    """Whether a LEASE_RENEW's result says every lease was renewed. Such a renewal (one
    that also wrote no record) reveals nothing that is not durable: a client can name a
    lease only once its grant was replied to, so after the fsync covering it, and a
    lease that ended (an end perhaps not yet fsynced) is not renewed but STALE_CLAIM."""
    if result is RENEWED_ONE:
        return True
    results = result.get("results") if type(result) is dict else None
    return type(results) is list and results.count(None) == len(results)


def _never_held(conn: Connection, rest: list[Any]) -> None:
    raise AssertionError("no slot moves here: nothing is held")


# Settlements (of a delivery, a claim, a pool slot): applied even when their connection
# closed after they were read and before they ran (``Batches.settle_what_was_read``).
_SETTLEMENTS: Final = frozenset(int(op) for op in (
    Op.DELIVERY_COMPLETE, Op.DELIVERY_RETRY, Op.DELIVERY_REJECT, Op.DELIVERY_RELEASE,
    Op.DELIVERY_SUSPEND, Op.CLAIM_RELEASE, Op.POOL_RELEASE,
))


class Batches:
    """Runs connections' requests through the core; the output goes to ``dirty``."""

    def __init__(
        self,
        core: BatchCore,
        clock: Callable[[], float],
        turns: Turns[Connection],
        metrics: Metrics,
        session: SessionHost,
        dirty: Callable[[Connection], None],
        next_turn: Callable[[Connection], None],
        slots: SlotOwner | None = None,
        hold: Callable[[Connection, list[Any]], None] | None = None,
    ) -> None:
        """``session``: what the session ops use (session.py); ``dirty``: ``conn`` has
        output for this turn's flush; ``next_turn``: ``conn`` goes on at the next turn
        (both output.py's); ``slots``: which slots are served here (default: all of
        them, and nothing is ever held); ``hold``: ``conn`` waits for a slot move with
        the rest of its batch (slotmoves.py)."""
        self.core = core
        self.clock = clock
        self.output_pauses = 0  # times a connection's requests waited for its output
        self.turns = turns
        self.slice_ends = 0.0  # when the running connection's share of the turn is over
        self.metrics = metrics
        self.session = session
        self.dirty = dirty
        self.next_turn = next_turn
        self.slots = slots if slots is not None else SlotOwner.alone()
        self.hold = hold if hold is not None else _never_held

    def run(self, conn: Connection, data: bytes, now: float) -> int:
        """Decode and execute what ``data`` completes, in chunks, while ``conn``'s output
        allows and its share of the turn lasts (``now`` is when the read began); what does
        not run waits (undecoded, or decoded in ``conn.backlog``). The requests before a
        broken frame run and are answered first; then the framing error fails the
        connection (at once, or once its backlog has run). Returns the number of messages
        decoded."""
        self.slice_ends = now + self.turns.share
        return self._decode(conn, data, now)

    def resume(self, conn: Connection, now: float) -> None:
        """``conn`` goes on (its output drained, or a new turn after its share ran out):
        its backlog, then the undecoded rest of its read, within a fresh share."""
        self.slice_ends = now + self.turns.share
        backlog = conn.take_backlog()  # (not narrowed here: the batch may leave another)
        if backlog is not None:
            self.handle_batch(conn, backlog, now)
            if conn.backlog is not None or conn.closing or conn.yielded:
                return
        if conn.error is None:
            self._decode(conn, b"", now)

    def _decode(self, conn: Connection, data: bytes, now: float) -> int:
        decoder = conn.decoder
        decoded = 0
        if conn.owed or conn.pending() >= _HIGH:
            # Output full: no request could run. The bytes wait undecoded (charged to the
            # client budget as they are), not as decoded messages, which may take 64
            # times their size (a frame of empty arrays) and which the budget never saw.
            try:
                decoder.feed(data, 0)
            except FrameError as exc:  # the first frame's header: after the output
                conn.error = FrameError(exc.code, exc.message)
            conn.block([])
            self.output_pauses += 1
            return 0
        while True:
            waiting = decoder.buffered + len(data)
            try:
                messages = decoder.feed(data, conn.chunk)
            except FrameError as exc:
                if exc.decoded:
                    self.handle_batch(conn, exc.decoded, now)
                if conn.backlog is not None:
                    # after the backlog has run; a copy never raised: the exception's
                    # traceback and context reach this frame, which holds ``conn`` (a
                    # cycle, never freed once the collector has frozen the connection)
                    conn.error = FrameError(exc.code, exc.message)
                else:
                    conn.fail(exc.code, exc.message)
                return decoded + len(exc.decoded)
            if not messages:
                return decoded
            count = len(messages)
            # The next chunk holds about _CHUNK_BYTES of frames like these: 128 frames of
            # 256 submits took 50 ms to decode (and the collections it set off) at once.
            took = max(1, waiting - decoder.buffered)
            conn.chunk = max(1, min(_CHUNK, _CHUNK_BYTES * count // took))
            decoded += count
            data = b""
            self.handle_batch(conn, messages, now)
            if conn.backlog is not None or conn.closing or conn.yielded:
                return decoded
            if decoder.buffered and self.clock() >= self.slice_ends:
                self._cut(conn)  # more may be complete: it runs at the next turn
                return decoded

    def _cut(self, conn: Connection, backlog: list[Any] | None = None) -> None:
        """``conn`` has used its share of this turn: unread until its next one (and
        ``backlog``, what it sent that did not run yet, runs then)."""
        if backlog is not None:
            conn.backlog = backlog
        conn.yield_turn()
        self.next_turn(conn)

    def settle_what_was_read(self, conn: Connection, now: float) -> None:
        """``conn`` closed with requests read but not yet run (its backlog, and frames
        still undecoded in its decoder: at most one read). Its settlements among them
        are applied now, before its leases bound to it end (``Core.disconnected``): a
        worker's ``complete()`` that reached rsd is not lost because its connection
        closed before its turn came. Nothing else runs, and nothing is answered."""
        messages: list[Any] = list(conn.backlog or ())
        conn.backlog = None
        decoder = conn.decoder
        try:
            while decoder.buffered:
                more = decoder.feed(b"", _CHUNK)
                if not more:
                    break
                messages += more
        except FrameError:
            pass  # what follows a broken frame was never a request
        handle = self.core.handle
        for msg in messages:
            if type(msg) is not list or len(msg) != 4:
                continue
            kind, rid, op, args = msg
            if (kind == _REQUEST and type(rid) is int and type(op) is int
                    and op in _SETTLEMENTS and type(args) is dict):
                with contextlib.suppress(CoreError):  # refused: nothing to apply
                    handle(now, conn.id, rid, op, args)

    def handle_batch(self, conn: Connection, messages: list[Any], now: float) -> None:
        """Execute ``messages`` in order while ``conn``'s output is under the high-water
        mark; keep the rest as its backlog (reading paused) once it is not."""
        transport = conn.transport
        if transport is None or conn.closing:
            return
        # Output may grow to the mark (plus the one reply that passes it): what is not
        # this turn's is held for an fsync or in the write buffer, and does not change
        # while the batch runs. Owed deferred replies go first, so nothing runs before them.
        limit = 0 if conn.owed else _HIGH - conn.held_bytes - transport.get_write_buffer_size()
        began = perf_counter()
        self.core.tick(now)  # expire what is due first, so no request sees a lapsed lease
        renewed = self._execute(conn, messages, now, limit)
        self.metrics.ok[_RENEW] += renewed
        self.metrics.batch.observe(perf_counter() - began)
        self.dirty(conn)

    def _execute(self, conn: Connection, messages: list[Any], now: float, limit: int) -> int:
        """``handle_batch``'s loop (one call a batch): how many RENEWED_ONE it answered."""
        core = self.core
        out = conn.out
        overtakes = conn.overtaking.append  # the answers that need not wait (quiet ones)
        handle = core.handle
        renew = core.lease_renew
        effects = core.effects
        pack = wire.pack_from_rsd
        conn_id = conn.id
        renewed = 0
        owns_all = self.slots.owns_all  # a move or a new map comes between batches only
        for index, msg in enumerate(messages):
            if conn.out_bytes >= limit:
                self._pause(conn, messages[index:])
                break
            kind, rid, op, args = msg if type(msg) is list and len(msg) == 4 else _NOT_A_FRAME
            args = {} if args is None else args
            if not (type(kind) is int and kind == _REQUEST and type(rid) is int and rid > 0
                    and type(op) is int and op not in _SESSION_OPS and conn.holder is not None
                    and type(args) is dict):
                if self._screen(conn, kind, rid, op, args):
                    continue
                break
            if not owns_all and (served := self._elsewhere(conn, rid, op, args)) is not None:
                if served:
                    continue  # answered: MOVED, or a run apart from its pool
                self.hold(conn, messages[index:])  # its slot is moving
                break
            try:
                if op == _RENEW:
                    recorded = len(effects.records)
                    result = renew(now, conn_id, rid, args)
                    if result is RENEWED_ONE:  # the commonest reply, pre-encoded; quiet:
                        # the one-lease fast path renews a live lease and writes no record
                        packed_rid = pack(rid)
                        frame = _RENEWED_HEADS[len(packed_rid)] + packed_rid + _RENEWED_TAIL
                        overtakes(len(out))
                        out.append(frame)
                        size = len(frame)
                        conn.out_bytes += size
                        conn.quiet_bytes += size
                        renewed += 1
                        continue
                    quiet = len(effects.records) == recorded and renewed_all(result)
                else:
                    result = handle(now, conn_id, rid, op, args)
                    quiet = False
                if result is not DEFERRED:
                    if (self._reply(conn, rid, op, result, quiet) and index + 1 < len(messages)
                            and self.clock() >= self.slice_ends):
                        self._cut(conn, messages[index + 1:])  # the rest: the next turn's
                        break
                else:
                    self.metrics.deferred[op] += 1
            except Exception as exc:
                self._failed(conn, rid, op, exc)
        return renewed

    def _reply(self, conn: Connection, rid: int, op: int, result: Any, quiet: bool) -> bool:
        """Queue the core's answer ``result`` to request ``rid`` (refused when too large to
        send); whether it was heavy (the batch may be cut after it)."""
        body = _PACK([_REPLY, rid, result])
        size = len(body)
        if size > _MAX_BODY:
            self.metrics.error(op, ErrorCode.RESOURCE_EXHAUSTED)
            conn.put(reply_too_large(rid, size))
            return False
        if quiet:  # one frame, never held (a renewal of several leases: small)
            conn.overtaking.append(len(conn.out))
            conn.out.append(_PACK_HEADER(size) + body)
            conn.quiet_bytes += size + 4
        else:
            conn.out.append(_PACK_HEADER(size))  # joined with the rest at the flush
            conn.out.append(body)
        conn.out_bytes += size + 4
        self.metrics.ok[op] += 1  # the core answered: ``op`` is one of the protocol's
        return size > _HEAVY

    def _screen(self, conn: Connection, kind: Any, rid: Any, op: Any, args: Any) -> bool:
        """A message that is not a well-formed core request from a greeted connection
        (those run inline in ``_execute``, with no call of their own): failed, answered
        as an error, or run as a session op. Whether the batch goes on
        (False: ``conn`` failed, or its session op ended the batch)."""
        if type(kind) is not int or kind != _REQUEST or type(rid) is not int or rid <= 0:
            conn.fail(
                ErrorCode.PROTOCOL_ERROR,
                "a client frame must be [1, request_id (int > 0), op (int), args (map)]",
            )
            return False
        if type(op) is not int:
            if conn.holder is None:
                conn.fail(ErrorCode.PROTOCOL_ERROR, "the first request must be HELLO")
                return False
            self.metrics.error(op, ErrorCode.UNKNOWN_OP)
            conn.put(wire.error_frame(rid, ErrorCode.UNKNOWN_OP, f"unknown op {op!r}"))
            return True
        if op in _SESSION_OPS or conn.holder is None:
            before, at = conn.out_bytes, len(conn.out)
            if not session_op(self.session, conn, rid, op, args):
                return False
            if op == _PING and conn.holder is not None:  # its reply reveals nothing
                conn.quiet_bytes += conn.out_bytes - before
                conn.overtaking.append(at)
            return True
        self.metrics.error(op, ErrorCode.INVALID_ARGUMENT)  # its args are not a map
        conn.put(wire.error_frame(rid, ErrorCode.INVALID_ARGUMENT, "args must be a map"))
        return True

    def _elsewhere(self, conn: Connection, rid: int, op: int, args: dict[str, Any]) -> bool | None:
        """Asked only when this shard does not own every slot: None if ``op`` is served
        here; True if it was answered (MOVED, or INVALID_ARGUMENT: a run apart from its
        pool or quota), not executed; False if its slot is moving (held)."""
        refusal = self.slots.refusal(op, args)
        if refusal is None:
            moving = self.slots.moving is not None and op in _BY_LEASE
            return False if moving and self._names_moving(op, args) else None
        if refusal == HELD:
            return False
        assert not isinstance(refusal, str)
        code, message, details = refusal
        self.metrics.error(op, code)
        conn.put(wire.error_frame(rid, code, message, details))
        return True

    def _names_moving(self, op: int, args: dict[str, Any]) -> bool:
        """Whether request ``op`` names a live lease of a run whose slot is moving."""
        if op == _RENEW:
            items = args.get("leases")
            handles = [item[0] if type(item) is list and item else item
                       for item in (items if type(items) is list else ())]
        else:
            handles = [args.get("lease")]
        return any(map(self.slots.holds_run, self.core.runs_of_leases(handles)))

    def _pause(self, conn: Connection, rest: list[Any]) -> None:
        """``conn``'s output reached the high-water mark: ``rest`` waits as its backlog."""
        conn.block(rest)
        self.output_pauses += 1

    def _failed(self, conn: Connection, rid: int, op: int, exc: Exception) -> None:
        """A request the core refused (its error code) or failed on (INTERNAL, logged)."""
        if isinstance(exc, CoreError):
            self.metrics.error(op, exc.code)
            details = exc.details
            if exc.code is ErrorCode.MOVED and details is not None and "scope" in details:
                details = self._where(details["scope"])  # a lease that left with its run
            conn.put(wire.error_frame(rid, exc.code, exc.message, details))
            return
        log.exception("internal error on op %r from %s", op, conn.peer, exc_info=exc)
        self.metrics.error(op, ErrorCode.INTERNAL)
        conn.put(wire.error_frame(rid, ErrorCode.INTERNAL, "internal server error"))

    def _where(self, run: str) -> dict[str, Any] | None:
        """MOVED's details for run ``run`` (its slot, the slot's owner and primary, the
        map's epoch): the core knows which run a forwarded lease left with (forwarded.py),
        the shell where the run's slot is now."""
        return self.slots.moved(slot_of(run, self.slots.map.slots))[2]
