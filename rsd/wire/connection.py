"""One client connection: its bytes in, its output out, and how it ends.

What always holds:
- a connection's output (``pending()``: bytes queued for this turn's write, held for an
  fsync, and in the transport's write buffer) is what bounds its work: at or above
  ``Policy.OUTPUT_HIGH_WATER_BYTES`` its requests wait (at most one read of them: a few
  decoded, the ``backlog``, the rest undecoded) and its socket is not read; deferred
  replies and pushes for it wait unencoded (``owed``). All resume at or below
  ``Policy.OUTPUT_LOW_WATER_BYTES`` (server.py, ``maybe_resume``);
- answers before goodbyes: a connection that fails (``fail``) first gets every reply
  and push already produced for it, in order, then its connection-level error frame;
  only then is its sending side shut (``write_eof``). Its input is read and discarded
  until the peer closes, so closing never resets replies still in flight; a peer that
  neither reads nor closes is cut off after ``Policy.CLOSE_LINGER_SECONDS``;
- a connection over a connection limit is refused the same way, with RESOURCE_EXHAUSTED,
  before any of its bytes is decoded (over TLS it is closed before the TLS handshake:
  an error frame could not be read without one);
- ``quiet_bytes`` never exceeds ``out_bytes``: only a reply known to reveal nothing
  journaled adds to it, and both are zeroed together when ``out`` leaves (output.py);
  ``overtaking`` names only answers in ``out`` that reveal nothing, journaled or not (a
  PING's, a renewal's that wrote no record and renewed every lease it named), and is
  cleared with it;
- a connection whose input has used its share of the loop turn (``yielded``, batches.py,
  turns.py) is not read until the rest of that input has run, at the next turns;
- what a connection holds (undecoded input and output) is charged to the server-wide
  client budget after every read and flush (clientbudget.py); a failing connection is no
  longer charged, and its undecoded input is dropped at once.
- over TLS, the handshake starts only once the connection is admitted, so handshaking
  connections count against the limits; it must end within the handshake timeout, and
  nothing is read as a frame before it has;
- a connection whose HELLO refusal is held back (``hold``, refusals.py) runs nothing
  more, as a closing one: its input is read and dropped until the refusal leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

import rsproto as wire
from rsproto import ErrorCode, FrameError, Limits

from ..policy import Policy
from ..security.tls import behind_first_bytes, peer_common_name, tls_layer

if TYPE_CHECKING:
    import ssl

    from ..core import Core
    from ..metrics import Metrics
    from ..security.auth import Authenticator
    from ..watchdog import Watchdog

__all__ = ["Connection", "ConnectionHost"]

log = logging.getLogger("rsd")


class _Budget(Protocol):
    """The server-wide client budget, as a connection charges it (clientbudget.py)."""

    @property
    def total(self) -> int: ...
    @property
    def limit(self) -> int: ...
    def charge(self, conn: Connection) -> None: ...
    def forget(self, conn: Connection) -> None: ...
    def enforce(self) -> None: ...


class ConnectionHost(Protocol):
    """What a connection uses of its server (server.py's ``Server`` is one): its limits
    and admission, the parts its bytes go through (``run``: batches.py, ``dirty`` and
    ``maybe_resume``: output.py), bound once on the server so the hot path pays one
    attribute lookup each, as before."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def core(self) -> Core: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def budget(self) -> _Budget: ...
    @property
    def watchdog(self) -> Watchdog[Connection]: ...
    @property
    def auth(self) -> Authenticator: ...
    @property
    def tls(self) -> ssl.SSLContext | None: ...
    @property
    def handshake_timeout(self) -> float: ...
    @property
    def run(self) -> Callable[[Connection, bytes, float], int]: ...
    @property
    def dirty(self) -> Callable[[Connection], None]: ...
    @property
    def maybe_resume(self) -> Callable[[Connection], None]: ...

    def admit(self, conn: Connection) -> tuple[ErrorCode, str] | None: ...
    def linger_refused(self, conn: Connection) -> bool: ...
    def drop(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    __slots__ = (
        "auth_entry", "backlog", "cert_name", "charged", "chunk", "closing", "decoder",
        "discarded", "error", "feed", "final", "finished", "handshake_timer", "held_bytes",
        "holder",
        "id", "linger", "missed_events", "out", "out_bytes", "overtaking", "owed", "peer",
        "peer_host", "quiet_bytes",
        "reading", "served", "server",
        "tls_pending", "transport", "waiting_output", "yielded",
    )

    def __init__(self, server: ConnectionHost, conn_id: int) -> None:
        self.server = server
        self.id = conn_id
        self.decoder = wire.Decoder(Limits.MAX_FRAME_BYTES, "request")
        self.transport: asyncio.Transport | None = None
        self.holder: str | None = None  # set by HELLO; None until the handshake is done
        self.out: list[bytes] = []  # this turn's output, written (or held) at the flush
        self.out_bytes = 0  # bytes in ``out``
        # Bytes of ``out`` known to reveal nothing journaled (batches.py: PING replies,
        # renewals that wrote no record and all succeeded): when they are all of ``out``
        # and nothing is held for it, its output need not wait for another's fsync.
        self.quiet_bytes = 0
        # Where in ``out`` this turn's answers that reveal nothing, journaled or not, are
        # (batches.py: PING replies, quiet renewals): they are never held, and leave at
        # the flush even when the rest of ``out`` is held, ahead of it (output.py).
        self.overtaking: list[int] = []
        self.held_bytes = 0  # bytes held by group commit until an fsync
        self.charged = 0  # what the server-wide client budget counts for it (clientbudget.py)
        self.owed: deque[Any] | None = None  # deferred replies and pushes, not yet encoded
        # task id -> its events dropped for this slow reader since its last push of that
        # task (output.py): told in that task's next push; at most a subscription's worth
        self.missed_events: dict[str, int] | None = None
        # Requests decoded but not executed while output drains (the rest of the read
        # waits undecoded in the decoder).
        self.backlog: list[Any] | None = None
        self.chunk = 128  # requests decoded at a time (batches.py: about 64 KiB of them)
        self.error: FrameError | None = None  # the framing error that follows the backlog
        self.waiting_output = False  # stopped at the high-water mark: resume once drained
        self.reading = True  # the transport is being read
        self.yielded = False  # its slice of the loop turn is used: the rest runs next turn
        self.served = False  # admitted under the connection limits (counted in them)
        # A standby's feed of the journal (feeds.py): bounded by the feeds' own limits,
        # not by the client budget, and never refused what it waits for.
        self.feed = False
        self.closing = False  # failed or refused: send what is due, then the final frame
        self.final: bytes | None = None  # the connection-level error frame, sent last
        self.finished = False  # everything sent and the sending side shut
        self.discarded = 0  # bytes read and dropped while closing
        self.peer = "?"
        self.peer_host = "?"
        self.handshake_timer: asyncio.TimerHandle | None = None
        self.linger: asyncio.TimerHandle | None = None
        self.tls_pending = False  # in the TLS handshake: no frame in or out yet
        self.cert_name: str | None = None  # the verified client certificate's subject CN
        self.auth_entry: bytes | str | None = None  # the tokens file entry that admitted it

    # ---- asyncio callbacks -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.tls_pending:  # the TLS handshake is done: frames flow over its transport
            self._tls_ready(transport)
            return
        # A stream's transport (uvloop's is no subclass of asyncio.Transport: no isinstance)
        raw = self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer, self.peer_host = f"{peer[0]}:{peer[1]}", str(peer[0])
        else:
            self.peer = self.peer_host = str(peer)
        # resume_writing (a wake-up for a connection waiting for its output to drain)
        # comes whenever the write buffer has been above the low-water mark.
        low = Policy.OUTPUT_LOW_WATER_BYTES
        raw.set_write_buffer_limits(high=low, low=low // 2)
        server = self.server
        refusal = server.admit(self)
        if refusal is not None:
            self._refuse(*refusal)
            return
        self.handshake_timer = server.loop.call_later(
            server.handshake_timeout, self._handshake_expired
        )
        if server.tls is not None:
            self._start_tls(raw, server.tls)

    def _start_tls(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        """Put TLS between the admitted socket and this connection, before a byte is read
        (the loop starts reading right after ``connection_made``). The TLS layer calls
        ``connection_made`` again with its own transport when the handshake is done, or
        fails ``waiter`` (``_tls_failed``)."""
        server = self.server
        waiter = server.loop.create_future()
        layer = tls_layer(server.loop, self, context, waiter, server.handshake_timeout)
        self.tls_pending = True
        raw.set_protocol(behind_first_bytes(raw, layer))  # a plain client is told in TLS
        layer.connection_made(raw)
        waiter.add_done_callback(self._tls_failed)

    def _tls_ready(self, transport: asyncio.BaseTransport) -> None:
        self.tls_pending = False
        tls = self.transport = cast(asyncio.Transport, transport)  # the TLS layer's
        low = Policy.OUTPUT_LOW_WATER_BYTES
        tls.set_write_buffer_limits(high=low, low=low // 2)
        self.cert_name = peer_common_name(transport)

    def _tls_failed(self, waiter: asyncio.Future[None]) -> None:
        exc = None if waiter.cancelled() else waiter.exception()
        if exc is None and not waiter.cancelled():
            return
        log.info("TLS handshake with %s failed: %s", self.peer, exc or type(exc).__name__)
        if self.transport is not None:
            self.transport.abort()
        if self.tls_pending:  # the TLS layer tells this connection nothing more
            self.tls_pending = False
            self.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            self._discard(len(data))
            return
        server = self.server
        now = server.loop.time()
        decoded = server.run(self, data, now)
        budget = server.budget
        budget.charge(self)
        if budget.total > budget.limit:
            budget.enforce()
        if self.closing or self.backlog is not None or self.yielded:
            return  # not read any more (its frame clock was stopped)
        watchdog = server.watchdog
        if not self.decoder.buffered:
            watchdog.frame_done(self)
        elif decoded:
            watchdog.frame_begun(self, now)  # a frame completed: what is left began now
        else:
            watchdog.frame_pending(self, now)

    def connection_lost(self, exc: BaseException | None) -> None:
        for timer in (self.handshake_timer, self.linger):
            if timer is not None:
                timer.cancel()
        if self.auth_entry is not None:
            self.server.auth.forget(self.auth_entry, self)
        self.server.drop(self)

    def resume_writing(self) -> None:
        self.server.budget.charge(self)  # its write buffer drained
        self.server.maybe_resume(self)

    # ---- output ------------------------------------------------------------------------

    def pending(self) -> int:
        """Output not yet handed to the kernel, in bytes."""
        transport = self.transport
        buffered = 0 if transport is None else transport.get_write_buffer_size()
        return self.out_bytes + self.held_bytes + buffered

    def put(self, frame: bytes) -> None:
        self.out.append(frame)
        self.out_bytes += len(frame)

    def owe(self, message: Any) -> None:
        """Keep a deferred reply or push, unencoded, until output has room for it."""
        if self.owed is None:
            self.owed = deque()
        self.owed.append(message)
        self.waiting_output = True

    def block(self, rest: list[Any]) -> None:
        """Output is at the high-water mark: keep ``rest`` of the batch, stop reading."""
        self.backlog = rest
        self.waiting_output = True
        self.server.watchdog.frame_done(self)  # its clock stops while it is not read
        if self.reading and self.transport is not None:
            self.transport.pause_reading()
            self.reading = False

    def take_backlog(self) -> list[Any] | None:
        """The backlog, handed over to run (none is left): the batch that runs it may
        leave a new one."""
        backlog, self.backlog = self.backlog, None
        return backlog

    def wait_for_slots(self, rest: list[Any]) -> None:
        """``rest[0]`` names a slot that is moving (slotmoves.py): ``rest`` waits as the
        backlog and reading stops, as at the high-water mark, but the output draining
        does not resume it: the move's end does."""
        self.block(rest)
        self.waiting_output = False

    def yield_turn(self) -> None:
        """This read has had its slice of the loop turn: stop reading until the next."""
        self.yielded = True
        self.server.watchdog.frame_done(self)  # its clock stops while it is not read
        if self.reading and self.transport is not None:
            self.transport.pause_reading()
            self.reading = False

    def unblock(self) -> None:
        """Output has drained and the backlog has run: read again."""
        if not self.reading and self.transport is not None:
            self.transport.resume_reading()
            self.reading = True
            if self.decoder.buffered:
                self.server.watchdog.frame_pending(self, self.server.loop.time())

    # ---- ending ------------------------------------------------------------------------

    def _handshake_expired(self) -> None:
        self.handshake_timer = None
        if self.tls_pending:  # still in the TLS handshake: nothing can be said
            if self.transport is not None:
                self.transport.abort()
            return
        if self.holder is None:
            self.fail(ErrorCode.PROTOCOL_ERROR, "no HELLO within the handshake timeout")

    def fail(self, code: ErrorCode, message: str, quiet: bool = False) -> None:
        """End with a connection-level error frame (request id 0), after every reply and
        push already produced for this connection. Nothing more it sent is executed.
        ``quiet``: logged at DEBUG only, its caller logs it (refused HELLOs are summed up
        in one line per interval, refusals.py)."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.closing:
            return
        if self.tls_pending:  # no frame can reach a peer still shaking hands
            transport.abort()
            return
        (log.debug if quiet else log.info)(
            "closing connection %s (%s): %s", self.peer, code, message
        )
        self.server.metrics.connection_error(str(code))
        self.closing = True
        self.backlog = None
        self.error = None
        server = self.server
        server.budget.forget(self)
        if self.decoder.buffered:  # nothing more it sent is executed: its input goes
            self.decoder = wire.Decoder(Limits.MAX_FRAME_BYTES, "request")
        if self.holder is not None:
            # nothing more may be granted to it; what is bound to it ends
            server.core.disconnected(self.id, server.loop.time())
        self.final = wire.error_frame(0, code, message)
        server.watchdog.frame_done(self)
        self.linger = server.loop.call_later(Policy.CLOSE_LINGER_SECONDS, self._cut_off)
        if not self.reading:  # read (and drop) its input: unread input would reset the close
            transport.resume_reading()
            self.reading = True
        server.dirty(self)

    def hold(self) -> None:
        """Its HELLO's refusal waits (refusals.py): nothing more it sent runs, its input is
        dropped as it comes (as while closing), and the refusal, not the handshake
        timeout, ends it (``release_refusal``). Until then it is, like a connection
        refused at admission, closing and finished: the output side skips it."""
        self.closing = True
        self.finished = True
        self.backlog = None
        server = self.server
        server.budget.forget(self)
        if self.decoder.buffered:
            self.decoder = wire.Decoder(Limits.MAX_FRAME_BYTES)
        server.watchdog.frame_done(self)
        if self.handshake_timer is not None:
            self.handshake_timer.cancel()
            self.handshake_timer = None

    def release_refusal(self, frame: bytes, code: ErrorCode, message: str) -> None:
        """The held refusal's moment: its ``frame``, then fail with ``code``."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return  # gone while it waited
        self.closing = self.finished = False
        self.put(frame)
        self.fail(code, message, quiet=True)

    def _refuse(self, code: ErrorCode, message: str) -> None:
        """Over a connection limit: the error frame, then close, reading nothing. Over
        TLS, closed at once: the frame would need a TLS handshake first."""
        transport = self.transport
        assert transport is not None
        self.closing = True
        self.finished = True
        if self.server.tls is not None:
            with contextlib.suppress(Exception):
                transport.close()
            return
        transport.write(wire.error_frame(0, code, message))
        if not self.server.linger_refused(self):
            transport.close()
            return
        self.linger = self.server.loop.call_later(Policy.REFUSED_LINGER_SECONDS, self._cut_off)
        self._shut()

    def finish(self) -> None:
        """Everything due has been handed to the transport: shut the sending side once it
        is flushed; the peer, having read it all, closes."""
        self.finished = True
        self._shut()

    def _shut(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if transport.can_write_eof():
            transport.write_eof()
        else:
            transport.close()

    def _discard(self, size: int) -> None:
        self.discarded += size
        if self.discarded > Policy.DISCARD_LIMIT_BYTES and self.transport is not None:
            self.transport.abort()

    def _cut_off(self) -> None:
        """The linger time is over: drop the connection and whatever it has not taken."""
        self.linger = None
        if self.transport is not None:
            self.transport.abort()
