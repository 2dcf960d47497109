"""The asyncio shell around the core: bytes -> frames -> core calls -> replies and pushes.

What always holds:
- every frame of one read is decoded and applied before anything is written;
- all output produced in one loop turn (replies, deferred replies, pushes to other
  connections) leaves in one ``transport.write`` per connection, from ``_flush``;
- journal records of a batch are written before its replies, and replies that depend on
  records not yet fsynced wait for the fsync (group commit, groupcommit.py: one fsync
  per batch, not per request, and the loop keeps serving while it runs);
- no request creates a task; the only timer is one ``call_at`` for the core's next
  deadline;
- a client can only hurt its own connection: a broken frame stream gets an error frame
  and that connection is closed, a bad request gets an error reply, and an unexpected
  exception inside the core becomes INTERNAL for that request and is logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import rsproto as wire
from rsproto import ErrorCode, FrameError, Kind, Limits, Op

from . import __version__
from .core import DEFERRED, Core, CoreError
from .groupcommit import GroupCommit
from .journal import Journal
from .policy import Policy, announced_limits
from .snapshots import Snapshots

__all__ = ["Server"]

log = logging.getLogger("rsd")

_TIMER_SLACK = 0.001  # uvloop's timers have millisecond resolution: never wake early
_REQUEST = int(Kind.REQUEST)
_REPLY = int(Kind.REPLY)
_MAX_BODY = wire.MAX_FRAME_BYTES
_SESSION_OPS = frozenset({int(Op.HELLO), int(Op.PING), int(Op.SERVER_STATS)})  # the server's


def _reply_too_large(rid: int, size: int) -> bytes:
    """The one answer to a reply over the frame limit, whether sent at once or deferred."""
    return wire.error_frame(
        rid, ErrorCode.RESOURCE_EXHAUSTED, f"the reply would be {size} bytes, over the frame limit"
    )


class Connection(asyncio.Protocol):
    __slots__ = (
        "closing", "decoder", "handshake_timer", "holder", "id", "out", "paused", "peer",
        "server", "transport",
    )

    def __init__(self, server: Server, conn_id: int) -> None:
        self.server = server
        self.id = conn_id
        self.decoder = wire.Decoder(Limits.MAX_FRAME_BYTES)
        self.transport: asyncio.Transport | None = None
        self.holder: str | None = None  # set by HELLO; None until the handshake is done
        self.out: list[bytes] = []
        self.paused = False
        self.closing = False  # failed: close once its output is flushed
        self.peer = "?"
        self.handshake_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.server.conns[self.id] = self
        self.handshake_timer = self.server.loop.call_later(
            self.server.handshake_timeout, self._handshake_expired
        )

    def _handshake_expired(self) -> None:
        if self.holder is None:
            self.fail(ErrorCode.PROTOCOL_ERROR, "no HELLO within the handshake timeout")

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            messages = self.decoder.feed(data)
        except FrameError as exc:
            # Apply nothing from a stream that broke framing: we cannot trust its sync.
            self.fail(exc.code, exc.message)
            return
        if messages:
            self.server.handle_batch(self, messages)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.handshake_timer is not None:
            self.handshake_timer.cancel()
        self.server.drop(self)

    def pause_writing(self) -> None:
        # The peer is not reading its replies: stop reading its requests until it does.
        self.paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.transport is not None and not self.transport.is_closing() and not self.closing:
            self.transport.resume_reading()

    def fail(self, code: ErrorCode, message: str) -> None:
        """Answer with a connection-level error frame (request id 0), then close.

        The frame leaves with the connection's other output in the next flush, after
        the journal has taken the batch's records; nothing more is read from the peer.
        """
        transport = self.transport
        if transport is None or transport.is_closing() or self.closing:
            return
        log.info("closing connection %s (%s): %s", self.peer, code, message)
        self.closing = True
        transport.pause_reading()
        if self.holder is not None:
            self.server.core.disconnected(self.id)  # nothing more may be granted to it
        self.out.append(wire.error_frame(0, code, message))
        self.server.dirty(self)


class Server:
    def __init__(
        self,
        core: Core,
        loop: asyncio.AbstractEventLoop,
        *,
        journal: Journal | None = None,
        snapshots: Snapshots | None = None,
        handshake_timeout: float = Policy.HANDSHAKE_TIMEOUT_SECONDS,
    ) -> None:
        """Without a journal nothing is persisted; with one, ``snapshots`` is required."""
        self.core = core
        self.loop = loop
        self.journal = journal
        self.snapshots = snapshots
        self.commit: GroupCommit[Connection] | None = None
        if journal is not None:
            if snapshots is None:
                raise ValueError("a server with a journal needs its snapshots")
            self.commit = GroupCommit(journal, snapshots, loop, self._send)
        self.handshake_timeout = handshake_timeout
        self.conns: dict[int, Connection] = {}
        self._next_conn = 1
        self._dirty: set[Connection] = set()
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._server: asyncio.base_events.Server | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def protocol_factory(self) -> Connection:
        conn = Connection(self, self._next_conn)
        self._next_conn += 1
        return conn

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await self.loop.create_server(
            self.protocol_factory, host, port, reuse_address=True, backlog=1024
        )
        sockname = self._server.sockets[0].getsockname()
        return sockname[0], sockname[1]

    async def stop(self) -> None:
        """Stop accepting, persist and send what is pending, close, end the journal."""
        if self._server is not None:
            self._server.close()
        if self._timer is not None:
            self._timer.cancel()
        self._flush()
        if self.commit is not None:
            await self.commit.stop()  # everything held is on disk and sent
        for conn in list(self.conns.values()):
            if conn.transport is not None:
                conn.transport.close()
        if self.journal is not None:
            self.journal.close()
        if self._server is not None:
            await self._server.wait_closed()

    def stats(self) -> dict[str, Any]:
        """Counters for operators and benchmarks (SERVER_STATS)."""
        journal, snapshots = self.journal, self.snapshots
        return {
            "server": f"rsd/{__version__}",
            "time": time.time(),
            "connections": len(self.conns),
            "core": self.core.stats(),
            "journal": None if journal is None or snapshots is None else {
                "fsync": journal.policy,
                "segment": journal.seq,
                "bytes_since_snapshot": snapshots.bytes_since,
                "snapshot_running": snapshots.pid is not None,
                **journal.stats,
                **snapshots.stats,
            },
            "held_batches": 0 if self.commit is None else len(self.commit.held),
        }

    def dirty(self, conn: Connection) -> None:
        """``conn`` has output: write it in this turn's flush."""
        self._dirty.add(conn)
        self._schedule_flush()

    def drop(self, conn: Connection) -> None:
        self.conns.pop(conn.id, None)
        self._dirty.discard(conn)
        if conn.holder is not None:
            self.core.disconnected(conn.id)
            self._schedule_flush()

    # ---- requests --------------------------------------------------------------------

    def handle_batch(self, conn: Connection, messages: list[Any]) -> None:
        now = self.loop.time()
        core = self.core
        core.tick(now)  # expire what is due first, so no request sees a lapsed lease
        out = conn.out
        handle = core.handle
        pack = wire.pack_body
        header = wire.pack_header
        conn_id = conn.id
        for msg in messages:
            if (
                type(msg) is not list
                or len(msg) != 4
                or msg[0] != _REQUEST
                or type(msg[0]) is not int
                or type(msg[1]) is not int
                or msg[1] <= 0
            ):
                conn.fail(
                    ErrorCode.PROTOCOL_ERROR,
                    "a client frame must be [1, request_id (int > 0), op (int), args (map)]",
                )
                break
            _, rid, op, args = msg
            if args is None:
                args = {}
            if type(op) is not int:
                if conn.holder is None:
                    conn.fail(ErrorCode.PROTOCOL_ERROR, "the first request must be HELLO")
                    break
                out.append(wire.error_frame(rid, ErrorCode.UNKNOWN_OP, f"unknown op {op!r}"))
                continue
            if op in _SESSION_OPS or conn.holder is None:
                if not self._session_op(conn, rid, op, args):
                    break
                continue
            if type(args) is not dict:
                out.append(
                    wire.error_frame(rid, ErrorCode.INVALID_ARGUMENT, "args must be a map")
                )
                continue
            try:
                result = handle(now, conn_id, rid, op, args)
                if result is not DEFERRED:
                    body = pack([_REPLY, rid, result])
                    if len(body) > _MAX_BODY:
                        out.append(_reply_too_large(rid, len(body)))
                        continue
                    out.append(header(len(body)))  # joined with the rest at the flush
                    out.append(body)
            except CoreError as exc:
                out.append(wire.error_frame(rid, exc.code, exc.message, exc.details))
            except Exception:
                log.exception("internal error on op %r from %s", op, conn.peer)
                out.append(wire.error_frame(rid, ErrorCode.INTERNAL, "internal server error"))
        self._dirty.add(conn)
        self._schedule_flush()

    def _session_op(self, conn: Connection, rid: int, op: int, args: Any) -> bool:
        """The ops the server answers itself (HELLO, PING, SERVER_STATS), and the rule that
        HELLO comes first. False: the connection failed, stop reading its batch."""
        if conn.holder is None:
            if op != Op.HELLO:
                conn.fail(ErrorCode.PROTOCOL_ERROR, "the first request must be HELLO")
                return False
            return self._hello(conn, rid, args)
        if op == Op.HELLO:
            conn.out.append(
                wire.error_frame(rid, ErrorCode.PROTOCOL_ERROR, "HELLO was already done")
            )
        elif type(args) is not dict:
            conn.out.append(
                wire.error_frame(rid, ErrorCode.INVALID_ARGUMENT, "args must be a map")
            )
        elif op == Op.PING:
            conn.out.append(wire.reply_frame(rid, {"time": time.time()}))
        elif op == Op.SERVER_STATS:
            conn.out.append(wire.reply_frame(rid, self.stats()))
        else:  # a core op before HELLO is refused above; nothing else reaches here
            raise AssertionError(f"op {op} is not a session op")
        return True

    def _hello(self, conn: Connection, rid: int, args: Any) -> bool:
        if type(args) is not dict:
            conn.fail(ErrorCode.PROTOCOL_ERROR, "HELLO args must be a map")
            return False
        version = args.get("version")
        if type(version) is not int or version != wire.PROTOCOL_VERSION:
            conn.out.append(
                wire.error_frame(
                    rid,
                    ErrorCode.UNSUPPORTED_VERSION,
                    f"protocol version {version!r} is not supported; this server speaks "
                    f"{wire.PROTOCOL_VERSION}",
                    {"supported": [wire.PROTOCOL_VERSION]},
                )
            )
            conn.fail(ErrorCode.UNSUPPORTED_VERSION, "handshake failed")
            return False
        holder = args.get("holder")
        if (
            not isinstance(holder, str)
            or not holder
            or len(holder.encode()) > Limits.MAX_HOLDER_BYTES
        ):
            conn.out.append(
                wire.error_frame(
                    rid,
                    ErrorCode.INVALID_ARGUMENT,
                    f"holder must be a non-empty string of at most {Limits.MAX_HOLDER_BYTES} "
                    "bytes",
                )
            )
            conn.fail(ErrorCode.INVALID_ARGUMENT, "handshake failed")
            return False
        conn.holder = holder
        if conn.handshake_timer is not None:
            conn.handshake_timer.cancel()
            conn.handshake_timer = None
        self.core.connected(conn.id, holder)
        conn.out.append(
            wire.reply_frame(
                rid,
                {
                    "version": wire.PROTOCOL_VERSION,
                    "server": f"rsd/{__version__}",
                    "connection": conn.id,
                    "time": time.time(),
                    "limits": announced_limits(self.handshake_timeout),
                },
            )
        )
        return True

    # ---- output ----------------------------------------------------------------------

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Once per loop turn: records to the journal, then every connection's output,
        sent now or, when it depends on records not yet fsynced, handed to group commit
        (groupcommit.py) to hold until the fsync covering it completes."""
        self._flush_scheduled = False
        core = self.core
        records = core.effects.take_records()
        must_sync = core.effects.take_sync()
        messages = core.effects.take_messages()
        commit = self.commit
        if commit is not None and records:
            commit.write(records)  # first: nothing below may lose the batch's records
        if messages:
            conns = self.conns
            for conn_id, msg in messages:
                conn = conns.get(conn_id)
                if conn is not None:
                    conn.out.append(self._encode(msg))
                    self._dirty.add(conn)
        if commit is not None and commit.must_hold(records, must_sync):
            batch = []
            for conn in self._dirty:
                if conn.out or conn.closing:
                    batch.append((conn, b"".join(conn.out)))
                    conn.out.clear()
            commit.hold(batch)
        else:
            for conn in self._dirty:
                out = conn.out
                if out or conn.closing:
                    self._send(conn, out[0] if len(out) == 1 else b"".join(out))
                    out.clear()
        self._dirty.clear()
        self._arm_timer()
        if commit is not None:
            commit.after_flush()

    @staticmethod
    def _encode(msg: list[Any]) -> bytes:
        """A deferred reply or push as a frame. One that cannot be encoded still answers
        its request (INTERNAL) rather than leaving it unanswered; a push is dropped."""
        try:
            body = wire.pack_body(msg)
            if len(body) <= _MAX_BODY:
                return wire.pack_header(len(body)) + body
            if msg[0] == _REPLY:
                return _reply_too_large(msg[1], len(body))
            log.error("dropping a push of %d bytes, over the frame limit", len(body))
            return b""
        except Exception as exc:
            log.error("cannot encode message %r: %s", msg[:2], exc)
            if msg[0] == _REPLY:
                return wire.error_frame(msg[1], ErrorCode.INTERNAL, "reply cannot be encoded")
            return b""

    @staticmethod
    def _send(conn: Connection, data: bytes) -> None:
        transport = conn.transport
        if transport is None or transport.is_closing():
            return
        if data:
            transport.write(data)
        if conn.closing:
            transport.close()

    def _arm_timer(self) -> None:
        deadline = self.core.next_deadline()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            self._timer = self.loop.call_at(deadline + _TIMER_SLACK, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.core.tick(self.loop.time())
        self._flush()
