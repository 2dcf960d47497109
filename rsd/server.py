"""The asyncio shell around the core: bytes -> frames -> core calls -> replies and pushes.

What always holds:
- every frame of one read is decoded and applied before anything is written;
- all output produced in one loop turn (replies, deferred replies, pushes to other
  connections) leaves in one ``transport.write`` per connection, from ``_flush``;
- journal records of a batch are written before its replies, and replies that depend on
  records not yet fsynced wait for the fsync (group commit, groupcommit.py: one fsync
  per batch, not per request, and the loop keeps serving while it runs);
- no request creates a task; the timers are one ``call_at`` for the core's next
  deadline and the watchdog's (watchdog.py), none per request;
- a connection's output is bounded before the work is done: a request is executed only
  while its connection's output is under the high-water mark (connection.py), so one
  read, or a thousand deferred replies, cannot grow the server by more than the mark
  plus one reply;
- a client can only hurt its own connection: a broken frame stream gets the answers to
  the requests before it, then an error frame, and that connection is closed; a bad
  request gets an error reply; an unexpected exception inside the core becomes INTERNAL
  for that request and is logged;
- connections are admitted under a total and a per-peer limit (descriptors.py), so the
  descriptors persistence needs are never taken by clients.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import rsproto as wire
from rsproto import ErrorCode, FrameError, Kind, Limits, Op

from . import __version__
from .connection import Connection
from .core import DEFERRED, Core, CoreError
from .groupcommit import GroupCommit
from .journal import Journal
from .policy import Policy, announced_limits
from .snapshots import Snapshots
from .watchdog import Watchdog

__all__ = ["Connection", "Server"]

log = logging.getLogger("rsd")

_TIMER_SLACK = 0.001  # uvloop's timers have millisecond resolution: never wake early
_REQUEST = int(Kind.REQUEST)
_REPLY = int(Kind.REPLY)
_MAX_BODY = wire.MAX_FRAME_BYTES
_SESSION_OPS = frozenset({int(Op.HELLO), int(Op.PING), int(Op.SERVER_STATS)})  # the server's
_HIGH = Policy.OUTPUT_HIGH_WATER_BYTES
_LOW = Policy.OUTPUT_LOW_WATER_BYTES
_CHUNK = 128  # requests decoded at a time: the rest of a read waits undecoded
_REFUSAL_LOG_SECONDS = 1.0  # at most one log line per this long about refused connections


def _reply_too_large(rid: int, size: int) -> bytes:
    """The one answer to a reply over the frame limit, whether sent at once or deferred."""
    return wire.error_frame(
        rid, ErrorCode.RESOURCE_EXHAUSTED, f"the reply would be {size} bytes, over the frame limit"
    )


class Server:
    def __init__(
        self,
        core: Core,
        loop: asyncio.AbstractEventLoop,
        *,
        journal: Journal | None = None,
        snapshots: Snapshots | None = None,
        handshake_timeout: float = Policy.HANDSHAKE_TIMEOUT_SECONDS,
        frame_timeout: float = Policy.FRAME_TIMEOUT_SECONDS,
        max_connections: int = 1000,
        max_connections_per_peer: int = Policy.MAX_CONNECTIONS_PER_PEER,
        max_refused_lingering: int = Policy.MAX_REFUSED_LINGERING,
        backlog: int = Policy.LISTEN_BACKLOG,
    ) -> None:
        """Without a journal nothing is persisted; with one, ``snapshots`` is required.
        The connection limits come from the file limit (descriptors.py, cli.py)."""
        self.core = core
        self.loop = loop
        self.journal = journal
        self.snapshots = snapshots
        self.commit: GroupCommit[Connection] | None = None
        if journal is not None:
            if snapshots is None:
                raise ValueError("a server with a journal needs its snapshots")
            self.commit = GroupCommit(journal, snapshots, loop, self._send_held)
        self.handshake_timeout = handshake_timeout
        self.max_connections = max_connections
        self.max_connections_per_peer = max_connections_per_peer
        self.max_refused_lingering = max_refused_lingering
        self.backlog = backlog
        self.watchdog: Watchdog[Connection] = Watchdog(loop, frame_timeout, self._frame_overdue)
        self.conns: dict[int, Connection] = {}
        self._peers: dict[str, int] = {}  # served connections per peer address
        self._refused: set[Connection] = set()  # refused, lingering until their peer closes
        self.refused_total = 0
        self._refusal_logged = 0.0
        self.output_pauses = 0  # times a connection's requests waited for its output
        self._next_conn = 1
        self._dirty: set[Connection] = set()
        self._flush_scheduled = False
        self._resumable: set[Connection] = set()
        self._resume_scheduled = False
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
            self.protocol_factory, host, port, reuse_address=True, backlog=self.backlog
        )
        self.watchdog.start()
        sockname = self._server.sockets[0].getsockname()
        return sockname[0], sockname[1]

    async def stop(self) -> None:
        """Stop accepting, persist and send what is pending, close, end the journal."""
        if self._server is not None:
            self._server.close()
        if self._timer is not None:
            self._timer.cancel()
        self.watchdog.stop()
        self._flush()
        if self.commit is not None:
            await self.commit.stop()  # everything held is on disk and sent
        for conn in [*self.conns.values(), *self._refused]:
            if conn.transport is not None:
                conn.transport.close()
        if self.journal is not None:
            self.journal.close()
        if self._server is not None:
            await self._server.wait_closed()

    def stats(self) -> dict[str, Any]:
        """Counters for operators and benchmarks (SERVER_STATS). The server's part is O(1):
        counters and sizes, no walk over connections or timers."""
        journal, snapshots = self.journal, self.snapshots
        return {
            "server": f"rsd/{__version__}",
            "time": time.time(),
            "connections": len(self.conns),
            "connections_refused": self.refused_total,
            "max_connections": self.max_connections,
            "max_connections_per_peer": self.max_connections_per_peer,
            "output_pauses": self.output_pauses,
            "loop": self.watchdog.stats(),
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
        """``conn`` is gone: forget it, and free its place under the limits."""
        if conn.served:
            conn.served = False
            del self.conns[conn.id]
            left = self._peers[conn.peer_host] - 1
            if left:
                self._peers[conn.peer_host] = left
            else:
                del self._peers[conn.peer_host]
        self._refused.discard(conn)
        self._dirty.discard(conn)
        self._resumable.discard(conn)
        self.watchdog.frame_done(conn)
        if conn.holder is not None:
            self.core.disconnected(conn.id)
            self._schedule_flush()

    # ---- admission -------------------------------------------------------------------

    def admit(self, conn: Connection) -> str | None:
        """Count ``conn`` in and serve it; or, over a limit, the refusal's message."""
        refusal = None
        if len(self.conns) >= self.max_connections:
            refusal = (
                f"connection limit reached: this server serves at most "
                f"{self.max_connections} connections (--max-connections)"
            )
        elif self._peers.get(conn.peer_host, 0) >= self.max_connections_per_peer:
            refusal = (
                f"per-peer connection limit reached: at most {self.max_connections_per_peer} "
                f"connections from {conn.peer_host} (--max-connections-per-peer)"
            )
        if refusal is not None:
            self.refused_total += 1
            now = self.loop.time()
            if now - self._refusal_logged >= _REFUSAL_LOG_SECONDS:
                self._refusal_logged = now
                log.warning(
                    "refusing connection from %s (%d refused so far): %s",
                    conn.peer, self.refused_total, refusal,
                )
            return refusal
        conn.served = True
        self.conns[conn.id] = conn
        self._peers[conn.peer_host] = self._peers.get(conn.peer_host, 0) + 1
        return None

    def linger_refused(self, conn: Connection) -> bool:
        """Whether a refused ``conn`` may linger until its peer has read the refusal (else
        it is closed at once: refused connections must not eat the descriptor reserve)."""
        if len(self._refused) >= self.max_refused_lingering:
            return False
        self._refused.add(conn)
        return True

    def _frame_overdue(self, conn: Connection) -> None:
        conn.fail(
            ErrorCode.PROTOCOL_ERROR,
            f"frame not completed within {self.watchdog.frame_timeout:g} s of its first byte",
        )

    # ---- requests --------------------------------------------------------------------

    def run(self, conn: Connection, data: bytes, now: float) -> int:
        """Decode and execute what ``data`` completes, in chunks, while ``conn``'s output
        allows; what it does not allow waits (undecoded, or decoded in ``conn.backlog``).
        The requests before a broken frame run and are answered first; then the framing
        error fails the connection (at once, or once its backlog has run). Returns the
        number of messages decoded."""
        decoder = conn.decoder
        decoded = 0
        while True:
            try:
                messages = decoder.feed(data, _CHUNK)
            except FrameError as exc:
                if exc.decoded:
                    self.handle_batch(conn, exc.decoded, now)
                if conn.backlog is not None:
                    conn.error = exc  # after the backlog has run
                else:
                    conn.fail(exc.code, exc.message)
                return decoded + len(exc.decoded)
            if not messages:
                return decoded
            decoded += len(messages)
            data = b""
            self.handle_batch(conn, messages, now)
            if conn.backlog is not None or conn.closing:
                return decoded

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
        core = self.core
        core.tick(now)  # expire what is due first, so no request sees a lapsed lease
        out = conn.out
        handle = core.handle
        pack = wire.pack_body
        header = wire.pack_header
        conn_id = conn.id
        for index, msg in enumerate(messages):
            if conn.out_bytes >= limit:
                conn.block(messages[index:])
                self.output_pauses += 1
                break
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
                conn.put(wire.error_frame(rid, ErrorCode.UNKNOWN_OP, f"unknown op {op!r}"))
                continue
            if op in _SESSION_OPS or conn.holder is None:
                if not self._session_op(conn, rid, op, args):
                    break
                continue
            if type(args) is not dict:
                conn.put(wire.error_frame(rid, ErrorCode.INVALID_ARGUMENT, "args must be a map"))
                continue
            try:
                result = handle(now, conn_id, rid, op, args)
                if result is not DEFERRED:
                    body = pack([_REPLY, rid, result])
                    size = len(body)
                    if size > _MAX_BODY:
                        conn.put(_reply_too_large(rid, size))
                        continue
                    out.append(header(size))  # joined with the rest at the flush
                    out.append(body)
                    conn.out_bytes += size + 4
            except CoreError as exc:
                conn.put(wire.error_frame(rid, exc.code, exc.message, exc.details))
            except Exception:
                log.exception("internal error on op %r from %s", op, conn.peer)
                conn.put(wire.error_frame(rid, ErrorCode.INTERNAL, "internal server error"))
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
            conn.put(wire.error_frame(rid, ErrorCode.PROTOCOL_ERROR, "HELLO was already done"))
        elif type(args) is not dict:
            conn.put(wire.error_frame(rid, ErrorCode.INVALID_ARGUMENT, "args must be a map"))
        elif op == Op.PING:
            conn.put(wire.reply_frame(rid, {"time": time.time()}))
        elif op == Op.SERVER_STATS and not self.core.is_admin(conn.id):
            conn.put(wire.error_frame(
                rid, ErrorCode.PERMISSION_DENIED,
                "SERVER_STATS is an admin operation; this connection's token has the client role",
            ))
        elif op == Op.SERVER_STATS:
            conn.put(wire.reply_frame(rid, self.stats()))
        else:  # a core op before HELLO is refused above; nothing else reaches here
            raise AssertionError(f"op {op} is not a session op")
        return True

    def _hello(self, conn: Connection, rid: int, args: Any) -> bool:
        if type(args) is not dict:
            conn.fail(ErrorCode.PROTOCOL_ERROR, "HELLO args must be a map")
            return False
        version = args.get("version")
        if type(version) is not int or version != wire.PROTOCOL_VERSION:
            conn.put(
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
            conn.put(
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
        conn.put(
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
        (groupcommit.py) to hold until the fsync covering it completes. A deferred reply
        or push for a connection at its high-water mark waits, unencoded, in its ``owed``;
        a failed connection's error frame goes after everything else due to it."""
        self._flush_scheduled = False
        core = self.core
        records = core.effects.take_records()
        must_sync = core.effects.take_sync()
        messages = core.effects.take_messages()
        commit = self.commit
        if commit is not None and records:
            commit.write(records)  # first: nothing below may lose the batch's records
        dirty = self._dirty
        if messages:
            conns = self.conns
            for conn_id, msg in messages:
                conn = conns.get(conn_id)
                if conn is None or conn.finished:
                    continue
                if conn.owed or conn.pending() >= _HIGH:
                    conn.owe(msg)
                else:
                    conn.put(self._encode(msg))
                dirty.add(conn)
        for conn in dirty:
            if conn.final is not None and not conn.owed:
                conn.put(conn.final)
                conn.final = None
        if commit is not None and commit.must_hold(records, must_sync):
            batch = []
            for conn in dirty:
                out = conn.out
                if out:
                    data = b"".join(out)
                    batch.append((conn, data))
                    conn.held_bytes += len(data)
                    out.clear()
                    conn.out_bytes = 0
            commit.hold(batch)
        else:
            for conn in dirty:
                out = conn.out
                if out:
                    self._send(conn, out[0] if len(out) == 1 else b"".join(out))
                    out.clear()
                    conn.out_bytes = 0
        for conn in dirty:
            if conn.closing or conn.waiting_output:
                self._after_output(conn)
        dirty.clear()
        self._arm_timer()
        if commit is not None:
            commit.after_flush()

    # ---- backpressure ----------------------------------------------------------------

    def _after_output(self, conn: Connection) -> None:
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

    def _resume(self) -> None:
        self._resume_scheduled = False
        resumable = list(self._resumable)
        self._resumable.clear()
        for conn in resumable:
            self._resume_one(conn)

    def _resume_one(self, conn: Connection) -> None:
        """Owed deferred output first, then the backlog, then the framing error that
        followed it (or reading again), each only while output stays under the mark."""
        transport = conn.transport
        if transport is None or transport.is_closing() or conn.finished:
            return
        conn.waiting_output = False
        owed = conn.owed
        if owed:
            limit = _HIGH - conn.held_bytes - transport.get_write_buffer_size()
            while owed and conn.out_bytes < limit:
                conn.put(self._encode(owed.popleft()))
            self.dirty(conn)
            if owed:
                conn.waiting_output = True
                return
        if conn.closing:
            self.dirty(conn)  # its error frame goes next
            return
        now = self.loop.time()
        if conn.backlog is not None:
            backlog, conn.backlog = conn.backlog, None
            self.handle_batch(conn, backlog, now)
        if conn.backlog is None and conn.error is None and not conn.closing:
            self.run(conn, b"", now)  # the undecoded rest of the read
        if conn.backlog is not None or conn.closing:
            return
        if conn.error is not None:
            error, conn.error = conn.error, None
            conn.fail(error.code, error.message)
            return
        conn.unblock()

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
        if transport is None or transport.is_closing() or conn.finished:
            return
        transport.write(data)

    def _send_held(self, conn: Connection, data: bytes) -> None:
        """Group commit releases output it held for an fsync."""
        conn.held_bytes -= len(data)
        self._send(conn, data)
        self._after_output(conn)

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
