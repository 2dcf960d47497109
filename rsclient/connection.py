"""One persistent, pipelined connection to rsd, reconnected on demand with backoff, to
the primary of a cluster when given several nodes.

What always holds:
- requests are futures keyed by request id; the read side resolves them; any number
  may be in flight;
- frames queued during one loop turn leave in one ``transport.write`` (a ``call_soon``
  flush joins them), or sooner, as soon as ``WRITE_AT_FRAMES`` are queued, so that the
  server starts on a batch while the rest of the turn is still being made: never one
  write per request, no per-request task, no per-request ``drain()``;
- a lost connection fails every pending request with ``LostConnection`` (an
  UnavailableError: the outcome is unknown); the next request reconnects (exponential
  backoff with jitter); a connect, every attempt and handshake included, ends within
  ``connect_timeout`` (``DEFAULT_CONNECT_TIMEOUT``, 2 s) with one UnavailableError naming
  the address and the cause (refused, timed out, not an rsd, a TLS mix-up), its message
  made by ``unreachable`` (one node) or ``unreachable_nodes`` (several) alone (reach.py);
- several nodes (``"h1:7420,h2:7420"``, ``nodes.py``): a connect goes through them in
  the order of a ``Route`` (the last primary first, then the list, the node whose
  connection was just lost last), with no pause between the nodes of a round and the
  backoff between rounds; a HELLO answered NOT_PRIMARY naming the primary goes there
  next (a few redirects in a row at most), one naming none goes on to the next node.
  Each attempt gets the budget's share of one node of the list, at least
  ``MIN_ATTEMPT`` s and at most ``NODE_ANSWER_SECONDS`` (what a live node needs to
  answer a HELLO, with room: a node that drops packets or accepts TCP and answers
  nothing, a paused process, cannot use up the budget; the node whose connection was
  lost gets ``MIN_ATTEMPT``, and a redirect to it waits for its place at the end of the
  round). Given up, the UnavailableError has code NOT_PRIMARY (the last such answer's
  ``details``: ``primary``, ``epoch``) if a node answered so, else UNAVAILABLE. One node
  given: exactly one node, as it always was;
- the budget of a connect is ``connect_timeout``, but a client of a cluster that was
  connected reconnects for as long as a takeover may take: ``failover_budget``, two
  cluster leases (told in HELLO's ``cluster.lease_seconds``; ``DEFAULT_CLUSTER_LEASE``
  from a node that does not tell) plus ``connect_timeout``, so that a call in flight
  across a takeover (the primary killed, paused or cut off) is answered by the new
  primary, with the default options too; its rounds pause at most ``FAILOVER_PAUSE``;
- a request answered NOT_PRIMARY (its node stepped down; not executed) fails with that
  UnavailableError (code NOT_PRIMARY); the replies read with it are delivered, then the
  connection is given up as lost (every other pending request fails with
  LostConnection) and the next connect starts at the primary it named. A
  connection-level NOT_PRIMARY does the same, its pending requests failing with
  LostConnection (they may have been executed before the node stepped down). What is
  sent again after either is ``failover.py``'s rule;
- a HELLO answered UNAVAILABLE with ``retry_after_ms`` (rsd slows down an address or
  network after many failed HELLOs; never a valid token's own fault) is tried again after
  that long, plus jitter, at most 30 s: within ``connect_timeout`` on a first connect
  (then UnavailableError says it was slowed down), for as long as it lasts when
  reconnecting a client that was connected before;
- a client lives on the event loop it first connected on; any other loop is refused
  with a RunstateError that says so; after ``close()`` every call raises
  UnavailableError("client is closed");
- the connection's life (connected, disconnected, reconnecting, restored) is told to
  ``events`` (``events.py``), which never blocks this side;
- a server certificate that cannot be verified, and TLS to a port that does not speak
  it, are final for a lone node (the same on every attempt); a node of several is
  passed over, its cause named if no node can be reached;
- handshake refusals (version, holder, auth) are final and raised as they are; an
  authentication refusal, or a connection-level UNAUTHENTICATED (rsd revoked the token
  of a live connection), is remembered, and every later connect raises it again at once
  without going back to the server (a token does not become valid by retrying, and
  retrying would only spend the peer's failure budget on the server);
- an address with a scheme other than ``tls://`` (``http://...``) is refused at
  construction, saying what to drop;
- ``tls://HOST:PORT`` or a ``tls`` context: TLS, the server's certificate verified
  (against the system's CAs unless the context says otherwise) for HOST; a ``tls``
  context applies to every node;
- pushes go to the handler registered for their event;
- ``link`` counts the ready connections that ended (lost, or closed by ``close()``):
  a reply read while it had one value came on a connection that is gone once it has
  another. The handlers of ``on_link_lost`` hear each end at once, before the pending
  requests fail (the keeper declares the leases bound to that connection lost there);
- a reply whose future was cancelled goes to the request's orphan handler, if it has
  one, so a grant that raced a cancellation is released rather than leaked;
- of a sharded cluster (``shards.py``, given as ``shards``), a connection serves one
  shard: the first HELLO that names one sets it (``shard``) unless it was made for it,
  and a HELLO naming another shard is refused like a NOT_PRIMARY naming that shard's
  primary (``Shards.greeted``); each connect round starts at the primary the slot map
  names for it; a request answered MOVED fails with ``Moved`` (not executed). A lone
  rsd tells no shard: none of this costs it anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rsproto import sdkrules

from . import wire
from .errors import (
    AuthenticationError,
    InvalidArgumentError,
    RunstateError,
    UnavailableError,
    WaitTimeoutError,
    error_for,
)
from .events import ConnectionEvents
from .nodes import TLS_SCHEME, Node, Route, parse_address, parse_addresses, resolve
from .reach import (
    NOT_TLS,
    describe,
    looks_like_tls,
    not_primary_words,
    unreachable,
    unreachable_nodes,
)
from .retry import Backoff, GiveUpLine, GiveUpLines, gave_up
from .wire import ErrorCode, Op

if TYPE_CHECKING:
    from .shards import Shards

__all__ = [
    "DEFAULT_CLUSTER_LEASE", "DEFAULT_CONNECT_TIMEOUT", "FAILOVER_PAUSE", "MIN_ATTEMPT",
    "NODE_ANSWER_SECONDS", "TLS_SCHEME", "WRITE_AT_FRAMES", "Connection", "LostConnection",
    "Moved", "NotExecuted", "failover_budget", "parse_address", "unreachable", "unreachable_nodes",
]

_pack_body = wire.pack_body
_pack_header = wire.pack_header
_REQUEST = wire.REQUEST
# The frame kinds as plain ints: an IntEnum member is a class attribute lookup (about
# 70 ns) on every message read.
_REPLY = wire.REPLY
_ERROR = wire.ERROR
_PUSH = wire.PUSH
_MAX_FRAME_BYTES = wire.MAX_FRAME_BYTES

log = logging.getLogger("rsclient")

# The values below that both SDKs share are rsproto.sdkrules' (the TypeScript SDK's are
# generated from it); named here as this module has always named them.
CLIENT_NAME = "rsclient-python/0.1.0"
_TIMEOUT_GRACE = sdkrules.WAIT_GRACE_SECONDS  # a wait's time past its limit for the answer
_GRACE_DIVISOR = sdkrules.WAIT_GRACE_DIVISOR  # and this part of its limit more
_BACKOFF_FIRST = sdkrules.RECONNECT_BACKOFF_FIRST_SECONDS  # doubling between connects,
_BACKOFF_MOST = sdkrules.RECONNECT_BACKOFF_MOST_SECONDS  # up to this
DEFAULT_CONNECT_TIMEOUT = sdkrules.CONNECT_TIMEOUT_SECONDS  # the same in every SDK and in rsctl
MAX_SLOWED_PAUSE = sdkrules.MAX_SLOWED_PAUSE_SECONDS  # at most between HELLOs rsd slowed down
# Seconds at least for one attempt at one node of several: above rsd's longest wait
# before it answers a HELLO it slowed down (refusals.py's MAX_ANSWER_WAIT, 0.5 s), so a
# wrong token is told as one, not as a node that does not answer.
MIN_ATTEMPT = sdkrules.MIN_ATTEMPT_SECONDS
# Seconds at most for one attempt at one node of several, TCP, TLS and the HELLO's answer
# together, whatever the budget: a live node answers in milliseconds; one that accepts TCP
# and answers nothing (a paused process) must not hold a client that has other nodes.
NODE_ANSWER_SECONDS = sdkrules.NODE_ANSWER_SECONDS
# The cluster lease assumed of a node that does not tell it in HELLO (rsd's default).
DEFAULT_CLUSTER_LEASE = sdkrules.DEFAULT_CLUSTER_LEASE_SECONDS
# Seconds at most between rounds of the nodes while reconnecting to a cluster (2 s
# otherwise): a takeover ends at a moment no client knows, and a pause of 2 s made the
# new primary's first change wait about a second more (bench/failover.py).
FAILOVER_PAUSE = sdkrules.FAILOVER_PAUSE_SECONDS
# A cluster client's connection that brought nothing for this long is probed with a PING;
# nothing for as long again, and it is given up for another node: a paused or cut-off
# primary (SIGSTOP, a VM frozen, a network partition) closes no socket, and its clients
# would wait on it until it wakes, their leases running out while the new primary keeps
# them. A lone rsd's clients never do this (another attempt would reach the same node).
SILENCE_SECONDS = sdkrules.SILENCE_SECONDS
LOST = "the connection to rsd was lost"
# Queued frames that are written at once rather than at the end of the loop turn: the
# server starts on them while the client still makes the rest of the turn. Chosen by
# measurement (bench.claims and bench.tasks at 64 coroutines, --fsync no and always, on
# a shared 2-core machine): writing at 8 or 16 frames cost 10-60 % more CPU per claim
# pair or task (client + server) under --fsync no and up to twice as much under
# --fsync always (an fsync group split in pieces), with no throughput gained there. At
# 64 a turn of 64 coroutines is still one write; larger turns (hundreds of coroutines)
# leave in 64-frame writes, so the server is never idle behind a long turn.
WRITE_AT_FRAMES = sdkrules.WRITE_AT_FRAMES


def failover_budget(cluster_lease: float, connect_timeout: float) -> float:
    """Seconds a client of a cluster that was connected keeps reconnecting: two cluster
    leases (the longest a takeover should take: the lost primary's lease runs out, a
    standby is elected and promoted) and then a connect's own timeout to reach it."""
    return 2 * cluster_lease + connect_timeout


class LostConnection(UnavailableError):
    """A request's connection was lost before its answer came: it may or may not have
    been executed (code UNAVAILABLE). ``failover.py`` decides what is sent again."""


class NotExecuted(UnavailableError):
    """A request was answered NOT_PRIMARY: its node is not the primary and did not
    execute it (code NOT_PRIMARY, the answer's details). Sent again to the primary
    (``failover.py``). A connect that gives up is never this, whatever its code."""


class Moved(UnavailableError):
    """A request was answered MOVED: another shard of a sharded cluster owns its slot,
    and it was not executed (code MOVED, details ``{"slot", "shard", "primary",
    "map_epoch"}``). ``answered_by``: the connection it came on, which the slot map is
    asked again on before the request goes to the owner (``failover.py``)."""

    def __init__(self, message: str, details: dict[str, Any] | None,
                 answered_by: Connection) -> None:
        super().__init__(message, ErrorCode.MOVED, details)
        self.answered_by = answered_by


class _SlowedDown(UnavailableError):
    """rsd answered the HELLO UNAVAILABLE with ``retry_after_ms``: try again after it."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after_ms / 1000


class _NotPrimary(UnavailableError):
    """The node answered the HELLO NOT_PRIMARY: try the primary it names, or the next."""

    def __init__(self, message: str, details: dict[str, Any]) -> None:
        super().__init__(message, ErrorCode.NOT_PRIMARY, details)
        primary = details.get("primary")
        self.primary = primary if isinstance(primary, str) else None


CLOSED = "client is closed"
OTHER_LOOP = (
    "this client belongs to the event loop it first connected on and cannot be used from "
    "another one: make one client per event loop (or use rsclient.sync.Runstate from threads)"
)


# A wait sent at once (``Connection.send_wait``): its request id, future and give-up line.
SentWait = tuple[int, "asyncio.Future[Any]", GiveUpLine]


def _mark_retrieved(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class _Protocol(asyncio.Protocol):
    """The per-socket half: bytes in, messages out to the Connection."""

    def __init__(self, owner: Connection) -> None:
        self.owner = owner
        self.decoder = wire.Decoder(wire.MAX_FRAME_BYTES, from_rsd=True)
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.writable: asyncio.Event = asyncio.Event()
        self.writable.set()
        self.paused = False  # ``not writable.is_set()``, read as a plain flag per request
        self.heard = False  # bytes came since the last silence check (cluster clients)
        self.probing = False  # a PING was sent because nothing came

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        if not self.heard and not self.owner._ready and looks_like_tls(data):
            # A plain connection to a TLS port: its first bytes say so (rsd's TLS port
            # sends a TLS alert to a client that does not speak TLS).
            self.owner._cause = (
                "the server answered with TLS (is this a TLS port? connect with tls=...)"
            )
            if self.transport is not None:
                self.transport.close()
            return
        self.heard = True
        try:
            messages = self.decoder.feed(data)
        except wire.FrameError as exc:
            log.error("rsd sent a broken frame stream: %s", exc.message)
            self.owner._cause = (
                f"it answered with bytes that are not rsd's protocol ({exc.message})"
            )
            if self.transport is not None:
                self.transport.close()
            return
        self.owner._received(self, messages)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self.paused = False
        self.writable.set()
        self.owner._lost(self, exc)

    def pause_writing(self) -> None:
        self.paused = True
        self.writable.clear()

    def resume_writing(self) -> None:
        self.paused = False
        self.writable.set()


class Connection:
    """The one persistent, pipelined connection of a client: connects on first use,
    reconnects with backoff, and matches replies to requests by id."""
    def __init__(
        self,
        address: str,
        holder: str,
        token: str | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self.nodes = parse_addresses(address)
        node = self.nodes[0]
        self.host, self.port = node.host, node.port  # the node reached (or last tried)
        if tls is not None and not isinstance(tls, ssl.SSLContext):
            raise InvalidArgumentError("tls must be an ssl.SSLContext or None")
        if token is not None and (not isinstance(token, str) or not token):
            raise InvalidArgumentError("token must be a non-empty string or None")
        self._tls_given = tls  # for every node; else the system's CAs for tls:// nodes
        self._tls_default: ssl.SSLContext | None = None
        if tls is None and any(node.tls for node in self.nodes):
            self._tls_default = ssl.create_default_context()
        self.tls = self._context_for(node)  # the TLS context of the node reached, if any
        # Several nodes, or a node that answered NOT_PRIMARY: a cluster, whose requests
        # lost with a primary may be sent again (``failover.py``). A lone rsd never is one.
        self.cluster = len(self.nodes) > 1
        self._primary: Node | None = None  # the node last known as the primary
        self._left: Node | None = None  # the node whose ready connection was lost last
        # The cluster's lease, as a node told it in HELLO (None: not told, or alone).
        self.cluster_lease: float | None = None
        self.holder = holder
        self.token = token
        self._refused: AuthenticationError | None = None  # the server refused our token
        self.connect_timeout = connect_timeout
        self.server_info: dict[str, Any] = {}
        self._proto: _Protocol | None = None
        self._ready = False
        self._closed = False
        self._napping: asyncio.Future[None] | None = None  # a pause between connect attempts
        self._lock: asyncio.Lock | None = None
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._orphans: dict[int, Callable[[Any], None]] = {}
        self._give_ups = GiveUpLines()  # this side's limit on every wait with a timeout
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._push_handlers: dict[int, Callable[[dict[str, Any]], None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._attempts = 0  # connect attempts made, for callers that waited on one
        self._last_failure: UnavailableError | None = None
        self._cause: str | None = None  # why the connection being opened failed, if known
        self._was_connected = False  # a later handshake is a restore, not a first connect
        self.events = ConnectionEvents(f"{self.host}:{self.port}")
        self.link = 0  # ready connections that ended so far (see the module docstring)
        self._link_lost: list[Callable[[], None]] = []
        # Of a sharded cluster: the shard this connection serves (None: whichever its
        # first HELLO names, or none: alone), and the client's slot map keeper.
        self.shard: str | None = None
        self.shards: Shards | None = None

    def _context_for(self, node: Node) -> ssl.SSLContext | None:
        """The TLS context ``node`` is reached with, or None for plain TCP."""
        if self._tls_given is not None:
            return self._tls_given
        if node.tls:
            if self._tls_default is None:  # a redirect to a TLS node not listed
                self._tls_default = ssl.create_default_context()
            return self._tls_default
        return None

    def sibling(self, shard: str, primary: str | None) -> Connection:
        """A connection to shard ``shard`` of a sharded cluster, with this one's options
        (holder, token, TLS, timeouts): its primary ``primary`` first (as a redirect
        names a node: ``resolve``), then this connection's nodes, through which a
        new primary is found when it is lost (``Shards.greeted``). No I/O."""
        here = Node(self.host, self.port, self.tls is not None)
        first = resolve(self.nodes, here, primary)
        nodes = ([first] if first is not None else []) + [
            node for node in self.nodes if node != first
        ]
        address = ",".join(f"{TLS_SCHEME if node.tls else ''}{node}" for node in nodes)
        conn = Connection(address, self.holder, self.token, tls=self._tls_given,
                          connect_timeout=self.connect_timeout)
        conn.shard = shard
        conn.shards = self.shards
        conn.cluster = True
        conn._primary = first
        return conn

    # ---- public ----------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the connection is up and its HELLO answered."""
        return self._ready

    def on_push(self, event: int, handler: Callable[[dict[str, Any]], None]) -> None:
        """Send every push of kind ``event`` to ``handler`` (one handler per kind)."""
        self._push_handlers[event] = handler

    def on_link_lost(self, handler: Callable[[], None]) -> None:
        """Call ``handler()`` the moment a ready connection ends (``link`` grows)."""
        self._link_lost.append(handler)

    def _link_ended(self) -> None:
        self.link += 1
        for handler in self._link_lost:
            try:
                handler()
            except Exception:
                log.exception("connection loss handler failed")

    def request(self, op: int, args: dict[str, Any]) -> Awaitable[Any]:
        """Send one request; await the result for its reply (connecting first if
        needed); an error reply raises its RunstateError. On a ready connection the
        request is sent at once and its future returned: no coroutine per request."""
        proto = self._proto
        if self._ready and proto is not None and not proto.paused:
            return self._send(op, args)[1]
        return self._request(op, args)

    async def _request(self, op: int, args: dict[str, Any]) -> Any:
        if not self._ready:
            await self.connect()
            if (router := self._routed_meanwhile()) is not None:
                return await router.request(op, args)
        proto = self._proto
        if proto is not None and not proto.writable.is_set():
            await proto.writable.wait()  # the socket's buffer is full: wait for the peer
        _, fut = self._send(op, args)
        return await fut

    def _routed_meanwhile(self) -> Shards | None:
        """The router, if the connect a request waited for made its client route (the
        first HELLO of a sharded cluster whose slots several shards own): the request,
        made before the map said where it goes, is routed rather than sent here."""
        shards = self.shards
        return shards if shards is not None and shards.routing and shards.home is self else None

    async def start(
        self, op: int, args: dict[str, Any], orphan: Callable[[Any], None] | None = None
    ) -> tuple[int, asyncio.Future[Any]]:
        """Send a request and return its id and future without awaiting the reply."""
        if not self._ready:
            await self.connect()
        proto = self._proto
        if proto is not None and not proto.writable.is_set():
            await proto.writable.wait()
        rid, fut = self._send(op, args)
        if orphan is not None:
            self._orphans[rid] = orphan
        return rid, fut

    async def request_cancellable(
        self,
        op: int,
        args: dict[str, Any],
        *,
        withdraw: bool,
        give_back: Callable[[Any], None] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """A request that may park on the server (a wait) or hand us something (a grant,
        a delivery). If the caller is cancelled before it returns, nothing stays ours: a
        parked wait is withdrawn with CANCEL (``withdraw``), and a reply that had arrived,
        or arrives anyway, is handed to ``give_back`` to be returned.

        ``timeout``: the wait's own limit. The server enforces it; this side gives up a
        little later too (WaitTimeoutError), for a server that stalls or is cut off; the
        limit covers reconnecting first.
        """
        proto = self._proto
        if self._ready and proto is not None and not proto.paused:
            # The common case, sent at once: no coroutine of ``start`` in between.
            rid, fut = self._send(op, args)
            if give_back is not None:
                self._orphans[rid] = give_back
        else:
            loop = self._loop or asyncio.get_running_loop()
            if not self._ready:
                if timeout is not None:
                    started = loop.time()
                    try:
                        await asyncio.wait_for(self.connect(), timeout + _TIMEOUT_GRACE)
                    except TimeoutError:
                        raise WaitTimeoutError(
                            f"no answer within {timeout:g} s (could not reach the server)"
                        ) from None
                    timeout = max(0.0, timeout - (loop.time() - started))
                else:
                    await self.connect()
                if (router := self._routed_meanwhile()) is not None:
                    return await router.request_cancellable(
                        op, args, withdraw=withdraw, give_back=give_back, timeout=timeout
                    )
            rid, fut = await self.start(op, args, orphan=give_back)
        line = None
        if timeout is not None:  # (a line shared by waits of this length, not a timer each)
            line = self._give_ups.watch(fut, _give_up_after(timeout))
        try:
            return await fut
        except asyncio.CancelledError:
            self._abandon(rid, fut, withdraw, give_back)
            if timeout is not None and gave_up(fut):  # (a line watched it: a timeout)
                raise _no_answer(timeout) from None
            raise
        finally:
            if line is not None:
                line.unwatch(fut)

    def send_wait(self, op: int, args: dict[str, Any], timeout: float) -> SentWait | None:
        """``request_cancellable``'s common case (``withdraw``, no ``give_back``) without
        its coroutine, for a caller that awaits the future itself (``Ticket.result``): on
        a ready connection the wait is sent at once and watched by its give-up line; its
        id, future and line. None when it cannot be sent at once (not connected, or the
        socket's buffer full): the caller uses ``request_cancellable``. The caller
        unwatches the future from the line once it is done, and a cancellation while it
        awaits goes to ``stop_waiting``."""
        proto = self._proto
        if not (self._ready and proto is not None and not proto.paused):
            return None
        rid, fut = self._send(op, args)
        # (``_give_up_after(timeout)``, inlined: a call less per wait)
        return rid, fut, self._give_ups.watch(
            fut, timeout + _TIMEOUT_GRACE + timeout / _GRACE_DIVISOR)

    def stop_waiting(self, rid: int, fut: asyncio.Future[Any], timeout: float) -> None:
        """The caller of a ``send_wait`` was cancelled while it awaited ``fut``: the wait
        is withdrawn (CANCEL), and WaitTimeoutError raised if the cancellation was the
        give-up line's (the caller raises its CancelledError otherwise)."""
        self._abandon(rid, fut, True, None)
        if gave_up(fut):
            raise _no_answer(timeout) from None

    async def request_then_wait(
        self, op: int, args: dict[str, Any], wait_op: int, wait_args: dict[str, Any],
        *, timeout: float,
    ) -> tuple[Any, Any]:
        """``op``, then the wait ``wait_op``, sent together (one write: the server runs
        them in order, so the wait may name what ``op`` made); both answers, ``op``'s
        first. The wait is withdrawn (CANCEL) if ``op`` fails (its error is raised) or
        the caller is cancelled; ``timeout`` as for ``request_cancellable``."""
        proto = self._proto
        if not (self._ready and proto is not None and not proto.paused):
            if not self._ready:
                await self.connect()
                if (router := self._routed_meanwhile()) is not None:
                    return await router.request_then_wait(
                        op, args, wait_op, wait_args, timeout=timeout
                    )
            proto = self._proto
            if proto is not None and not proto.writable.is_set():
                await proto.writable.wait()
        first = self._send(op, args)[1]
        rid, fut = self._send(wait_op, wait_args)
        line = self._give_ups.watch(fut, _give_up_after(timeout))
        try:
            try:
                answer = await first
            except BaseException:
                fut.add_done_callback(_mark_retrieved)  # its answer goes unread
                self._abandon(rid, fut, True, None)
                raise
            try:
                return answer, await fut
            except asyncio.CancelledError:
                self.stop_waiting(rid, fut, timeout)
                raise
        finally:
            line.unwatch(fut)

    def _abandon(
        self,
        rid: int,
        fut: asyncio.Future[Any],
        withdraw: bool,
        give_back: Callable[[Any], None] | None,
    ) -> None:
        """The caller of a cancellable request stopped waiting: leave nothing ours."""
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            if give_back is not None:
                give_back(fut.result())  # answered just before the cancellation
        elif withdraw:
            self.send_nowait(Op.CANCEL, {"request": rid})

    def send_nowait(
        self, op: int, args: dict[str, Any],
        on_done: Callable[[asyncio.Future[Any]], None] | None = _mark_retrieved,
    ) -> asyncio.Future[Any] | None:
        """Fire a request on the current connection, if there is one; None if not. Its
        answer may go unread: an error in it is not reported as never retrieved (by
        default; an ``on_done`` of the caller's must read it itself, in the one
        callback the answer costs). ``on_done=None``: no callback at all, for a caller
        that awaits the future itself (and so reads its error)."""
        if not self._ready:
            return None
        fut = self._send(op, args)[1]
        if on_done is not None:
            fut.add_done_callback(on_done)
        return fut

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called: every later request raises UnavailableError."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise UnavailableError(CLOSED)
        self._check_loop()

    def _check_loop(self) -> None:
        """The client's futures, timers and leases belong to one event loop: refuse any
        other, clearly, rather than fail deep inside asyncio."""
        loop = self._loop
        if loop is not None and loop is not asyncio.get_running_loop():
            raise RunstateError(OTHER_LOOP)

    async def connect(self) -> None:
        """Connect, retrying with backoff for up to ``connect_timeout``. Callers that
        arrive while an attempt runs share its outcome, failure included."""
        self._check_open()
        if self._lock is None:
            self._lock = asyncio.Lock()
        attempt = self._attempts
        async with self._lock:
            if self._ready:
                return
            self._check_open()
            if self._refused is not None:
                raise AuthenticationError(self._refused.message, self._refused.code)
            if self._attempts != attempt and self._last_failure is not None:
                raise self._last_failure  # the attempt we waited for has just failed
            self._attempts += 1
            try:
                await self._connect_with_backoff()
            except UnavailableError as exc:
                self._last_failure = exc
                raise
            except AuthenticationError as exc:
                self._refused = exc
                raise
            self._last_failure = None

    def _budget(self) -> float:
        """Seconds this connect may take: ``connect_timeout``, or a failover's budget for
        a client of a cluster that was connected (the module docstring)."""
        if self.cluster and self._was_connected:
            lease = self.cluster_lease or DEFAULT_CLUSTER_LEASE
            return failover_budget(lease, self.connect_timeout)
        return self.connect_timeout

    async def _connect_with_backoff(self) -> None:
        loop = asyncio.get_running_loop()
        budget = self._budget()
        deadline = loop.time() + budget
        most = FAILOVER_PAUSE if budget > self.connect_timeout else _BACKOFF_MOST
        backoff = Backoff(_BACKOFF_FIRST, most)
        route = Route(self.nodes, self._first(self._primary), self._left)
        causes: dict[Node, str] = {}  # each node's last failure, in the order first tried
        refusal: _NotPrimary | None = None  # the last NOT_PRIMARY answer, if any
        share = self._share(budget)
        if self._was_connected:
            self.events.emit("reconnecting")
        try:
            while True:
                self._check_open()
                node = route.next()
                if node is None:  # the round is over: back off, then the next round
                    pause = backoff.next_pause()
                    if loop.time() + pause >= deadline:
                        raise self._gave_up(causes, refusal, budget) from None
                    await self._next_round(pause, route)
                    continue
                if causes and loop.time() >= deadline:  # (within a round of several)
                    raise self._gave_up(causes, refusal, budget) from None
                self._cause = None
                left = deadline - loop.time()
                # The node given up on gets the least: a live node answers at once.
                bound = min(share, MIN_ATTEMPT) if node == route.last else share
                try:
                    # The whole attempt, handshake included, fits in what is left.
                    async with asyncio.timeout(max(min(left, bound), 0.001)):
                        await self._open(node)
                    route.primary = node
                    self._left = None
                    return
                except ssl.SSLCertVerificationError as exc:  # the same on every attempt
                    self._untrusted(node, exc, route, causes)
                except _NotPrimary as exc:
                    self._check_open()
                    self.cluster = True
                    refusal = exc
                    causes[node] = not_primary_words(exc.details)
                    route.redirect(node, exc.primary)
                except _SlowedDown as exc:
                    self._check_open()
                    route.failed()
                    # Kept now, not only when giving up: the next attempt, cut short by the
                    # deadline, times out, and a timeout keeps an earlier cause.
                    causes[node] = f"rsd slowed this client down ({exc.message})"
                    pause = min(MAX_SLOWED_PAUSE, exc.retry_after * random.uniform(1.0, 1.25))
                    if self._was_connected:  # reconnecting: as long as rsd slows us down
                        deadline = max(deadline, loop.time() + pause + self.connect_timeout)
                    elif loop.time() + pause >= deadline:
                        raise self._gave_up(causes, refusal, budget) from None
                    await asyncio.sleep(pause)
                    route.again(node)
                except (OSError, TimeoutError, UnavailableError) as exc:
                    self._unreached(node, exc, route, causes)
        finally:
            self._primary = route.primary  # where the next connect starts

    def _share(self, budget: float) -> float:
        """One node's share of a connect's ``budget``, no more than a live node needs to
        answer: a node that drops packets or answers nothing cannot eat it all."""
        if len(self.nodes) == 1:
            return budget
        return max(
            min(budget / len(self.nodes), NODE_ANSWER_SECONDS), min(MIN_ATTEMPT, budget)
        )

    async def _next_round(self, pause: float, route: Route) -> None:
        """Every node of the round failed: after ``pause`` (unless closed meanwhile),
        the next round begins."""
        await self._nap(pause)
        self._check_open()
        if self.shards is not None and self.shard is not None:  # where is our shard's primary?
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(NODE_ANSWER_SECONDS):
                    await self.shards.refresh(exclude=self)
            self._check_open()
        route.primary = self._first(route.primary)
        route.new_round()

    def _first(self, known: Node | None) -> Node | None:
        """The node a round starts at: ``known`` (the primary last known or named),
        unless that is none or the node just given up on, and the slot map names
        another primary of this connection's shard (a sharded cluster's)."""
        shards = self.shards
        if shards is None or self.shard is None or (known is not None and known != self._left):
            return known
        here = Node(self.host, self.port, self.tls is not None)
        return resolve(self.nodes, here, shards.primary_of(self.shard)) or known

    def _untrusted(
        self, node: Node, exc: ssl.SSLCertVerificationError, route: Route,
        causes: dict[Node, str],
    ) -> None:
        """``node``'s certificate cannot be trusted: the same on every attempt, so final
        for a lone node (raised); one node of several is passed over, named if all fail."""
        why = exc.verify_message or exc
        if len(self.nodes) == 1:
            raise UnavailableError(
                f"TLS: the certificate of rsd at {node.host}:{node.port} cannot be "
                f"trusted: {why}"
            ) from None
        route.failed()
        causes[node] = f"TLS: the certificate cannot be trusted: {why}"

    def _unreached(
        self, node: Node, exc: Exception, route: Route, causes: dict[Node, str]
    ) -> None:
        """``node`` could not be reached, or did not answer in time: passed over, its
        cause kept. TLS to a lone node's port that does not speak it is final (raised)."""
        self._check_open()
        route.failed()
        if (isinstance(exc, ssl.SSLError) and exc.reason in NOT_TLS
                and len(self.nodes) == 1):
            raise UnavailableError(
                unreachable(node.host, node.port, describe(exc))
            ) from None
        # Our own give-up closes the socket too: a timeout is told as one. A timed-out
        # attempt often had only what was left of the budget (the last one, on a loaded
        # machine): a cause an earlier attempt found says more, and is kept (reach.ts too).
        timed_out = isinstance(exc, TimeoutError)
        if timed_out and node in causes:
            return
        causes[node] = (not timed_out and self._cause) or describe(exc)

    def _gave_up(
        self, causes: dict[Node, str], refusal: _NotPrimary | None, within: float
    ) -> UnavailableError:
        """The error of a connect that gave up after ``within`` s: UNAVAILABLE, or
        NOT_PRIMARY (with the last such answer's details) if a node answered so."""
        if len(self.nodes) == 1 and len(causes) == 1:
            node, cause = next(iter(causes.items()))
            message = unreachable(node.host, node.port, cause, within)
        else:
            message = unreachable_nodes(self.nodes, causes, within)
        if refusal is not None:
            return UnavailableError(message, ErrorCode.NOT_PRIMARY, dict(refusal.details))
        return UnavailableError(message)

    async def _nap(self, seconds: float) -> None:
        """Sleep between connection attempts; ``close`` ends the sleep at once."""
        loop = asyncio.get_running_loop()
        nap = self._napping = loop.create_future()
        timer = loop.call_later(seconds, _wake, nap)
        try:
            await nap
        finally:
            timer.cancel()
            self._napping = None

    async def close(self) -> None:
        """Close the connection. Returns promptly even if the server has stopped reading
        (what could not be sent within half a second is dropped), or if a reconnect is
        pausing between attempts (it ends at once, UNAVAILABLE)."""
        self._closed = True
        if self._ready:
            self._ready = False
            self._link_ended()
        if self._napping is not None:
            _wake(self._napping)
        proto = self._proto
        if self._loop is not None and self._loop is not asyncio.get_running_loop():
            # Closed from another loop (the first one may be gone): drop the socket.
            if proto is not None and proto.transport is not None:
                with contextlib.suppress(RuntimeError):
                    proto.transport.abort()
            return
        if proto is not None and proto.transport is not None:
            self._flush()
            proto.transport.close()
            try:
                await asyncio.wait_for(asyncio.shield(proto.closed), 0.5)
            except TimeoutError:
                proto.transport.abort()
        self._fail_pending(UnavailableError(CLOSED))

    # ---- internals -------------------------------------------------------------------

    async def _open(self, node: Node) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.host, self.port = node.host, node.port
        self.tls = tls = self._context_for(node)
        self.events.address = f"{node.host}:{node.port}"
        transport, proto = await asyncio.wait_for(
            loop.create_connection(
                lambda: _Protocol(self), node.host, node.port, ssl=tls,
                server_hostname=node.host if tls is not None else None,
            ),
            timeout=self.connect_timeout,
        )
        if self._closed:  # closed while we were connecting
            transport.close()
            self._check_open()
        self._proto = proto
        hello = {
            "version": wire.PROTOCOL_VERSION,
            "holder": self.holder,
            "client": CLIENT_NAME,
            "token": self.token,
        }
        _, fut = self._send(Op.HELLO, hello)
        try:
            info = await asyncio.wait_for(fut, timeout=self.connect_timeout)
        except TimeoutError as exc:
            transport.close()
            raise UnavailableError(f"handshake with rsd failed: {exc}") from None
        except UnavailableError as exc:
            transport.close()
            if exc.code == ErrorCode.NOT_PRIMARY:  # a standby: where to go is in details
                raise _NotPrimary(exc.message, exc.details) from None
            wait = exc.details.get("retry_after_ms")
            if type(wait) is int and wait >= 1:  # slowed down, not refused: retried
                raise _SlowedDown(exc.message, wait) from None
            raise UnavailableError(f"handshake with rsd failed: {exc}") from None
        except BaseException:  # refused, or the caller was cancelled: leave no socket
            transport.close()
            raise
        self.server_info = info
        told = info.get("cluster") if isinstance(info, dict) else None
        lease = told.get("lease_seconds") if isinstance(told, dict) else None
        if isinstance(lease, int | float) and not isinstance(lease, bool) and 0 < lease <= 3600:
            self.cluster_lease = float(lease)
        shard = info.get("shard") if isinstance(info, dict) else None
        if shard is not None and self.shards is not None:  # a node of a sharded cluster
            await self._greeted(transport, self.shards, shard)
        self._ready = True
        if self.cluster:
            loop.call_later(SILENCE_SECONDS, self._check_silence, proto)
        self._announce_ready()

    async def _greeted(
        self, transport: asyncio.BaseTransport, shards: Shards, told: object
    ) -> None:
        """The HELLO named a shard (``told``): ``shards`` checks it is this connection's
        (asking the slot map there if need be); another shard's node is refused as a
        NOT_PRIMARY naming the primary of ours, if its map knows one."""
        try:
            refusal = await shards.greeted(self, told)
        except BaseException:
            transport.close()
            raise
        if refusal is not None:
            transport.close()
            raise _NotPrimary(*refusal)

    def ask(self, op: int, args: dict[str, Any]) -> asyncio.Future[Any]:
        """Send ``op`` on this connection at once, also while it is being opened (the
        slot map a HELLO calls for); its future. UnavailableError without a socket."""
        return self._send(op, args)[1]

    def _check_silence(self, proto: _Protocol) -> None:
        """Every SILENCE_SECONDS while ``proto`` is the connection: nothing came, a
        PING; nothing came since the PING either, the connection is given up (requests
        in flight are lost with it, as on any lost connection, and sent again where
        ``failover.py`` says it is safe) and the next attempt tries the other nodes."""
        if proto is not self._proto or self._closed:
            return
        if proto.heard:
            proto.heard = proto.probing = False
        elif proto.probing:
            self._lost(proto, None, f"it answered nothing for {2 * SILENCE_SECONDS:g} s "
                                    "(a node paused or cut off)")
            if proto.transport is not None:
                proto.transport.abort()
            return
        else:
            proto.probing = True
            self.send_nowait(Op.PING, {})
        asyncio.get_running_loop().call_later(SILENCE_SECONDS, self._check_silence, proto)

    def _send(self, op: int, args: dict[str, Any]) -> tuple[int, asyncio.Future[Any]]:
        proto = self._proto
        if proto is None or proto.transport is None or proto.transport.is_closing():
            raise UnavailableError("not connected to rsd")
        loop = self._loop
        flushing = self._flush_scheduled  # (read once: nothing below changes it first)
        if not flushing:  # the first request of a loop turn: on our loop?
            self._check_loop()
        rid = self._next_id
        self._next_id = rid + 1
        # ``wire.request_frame`` inlined (two calls less per request); on any failure
        # the codec itself says what is wrong, in its own words.
        try:
            body = _pack_body([_REQUEST, rid, op, args])
            size = len(body)
            if size > _MAX_FRAME_BYTES:
                raise ValueError(body)
        except (TypeError, ValueError, OverflowError):
            try:
                wire.request_frame(rid, op, args)
            except wire.FrameError as exc:
                raise error_for(ErrorCode.INVALID_ARGUMENT, exc.message) from None
            raise
        assert loop is not None  # set by _open before the first frame
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[rid] = fut
        out = self._out
        out.append(_pack_header(size) + body)
        if not flushing:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        elif len(out) >= WRITE_AT_FRAMES:
            self._write_out(out, proto)
        return rid, fut

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if out:
            self._write_out(out, self._proto)

    @staticmethod
    def _write_out(out: list[bytes], proto: _Protocol | None) -> None:
        """Write the queued frames in one ``transport.write`` and clear the queue."""
        if proto is not None and proto.transport is not None and not proto.transport.is_closing():
            proto.transport.write(b"".join(out) if len(out) > 1 else out[0])
        out.clear()

    def _received(self, proto: _Protocol, messages: list[Any]) -> None:
        pending = self._pending
        stepped_down: str | None = None  # a request was answered NOT_PRIMARY: why
        for msg in messages:
            try:
                kind = msg[0]
                if kind == _REPLY:
                    rid = msg[1]
                    fut = pending.pop(rid, None)
                    orphan = self._orphans.pop(rid, None) if self._orphans else None
                    if fut is None:
                        continue
                    try:  # (no done() call per reply: a future given up is the rare one)
                        fut.set_result(msg[2])
                    except asyncio.InvalidStateError:  # cancelled: given up, or its caller left
                        if orphan is not None:
                            orphan(msg[2])
                elif kind == _ERROR:
                    rid, code, message = msg[1], msg[2], msg[3]
                    details = msg[4] if len(msg) > 4 else None
                    if rid == 0:
                        # (in a handshake the caller is told: no warning per retry)
                        (log.warning if self._ready else log.debug)(
                            "rsd closed the connection: %s: %s", code, message
                        )
                        error = error_for(code, message, details)
                        if isinstance(error, AuthenticationError):  # revoked: final
                            self._refused = error
                        elif code == ErrorCode.NOT_PRIMARY and self._ready:
                            # Stepped down: what was pending may have been executed.
                            self._follow(details)
                            error = LostConnection(f"{LOST}: {self._stepped_down(message)}")
                        self._fail_pending(error)
                        continue
                    if code == ErrorCode.NOT_PRIMARY and self._ready:
                        stepped_down = self._stepped_down(message)
                        self._follow(details)
                        error = NotExecuted(message, code, details)
                    elif code == ErrorCode.MOVED:
                        error = Moved(message, details, self)
                    else:
                        error = error_for(code, message, details)
                    fut = pending.pop(rid, None)
                    if self._orphans:
                        self._orphans.pop(rid, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(error)
                elif kind == _PUSH:
                    handler = self._push_handlers.get(msg[1])
                    if handler is not None:
                        handler(msg[2])
            except Exception:  # a malformed message must not kill the read side
                log.exception("cannot handle message from rsd: %r", msg)
        if stepped_down is not None and proto is self._proto:
            # Every answer read with it was delivered above; the rest is lost with the node.
            transport = proto.transport
            self._lost(proto, None, stepped_down)
            if transport is not None:
                transport.close()

    def _stepped_down(self, message: str) -> str:
        return f"rsd at {self.host}:{self.port} is no longer the primary ({message})"

    def _follow(self, details: object) -> None:
        """The node said NOT_PRIMARY: a cluster, and the next connect starts at the
        primary it named (none: at the list)."""
        self.cluster = True
        primary = details.get("primary") if isinstance(details, dict) else None
        here = Node(self.host, self.port, self.tls is not None)
        self._primary = resolve(self.nodes, here, primary)

    def _lost(self, proto: _Protocol, exc: Exception | None, cause: str | None = None) -> None:
        if proto is not self._proto:
            return
        was_ready, self._ready = self._ready, False
        self._proto = None
        self._out.clear()
        if not was_ready:  # lost during the handshake: the peer is not (yet) an rsd for us
            if exc is not None:  # reset: a node that died or dropped us, not a mix-up
                self._cause = self._cause or describe(exc)
            else:  # closed without a word (a TLS port says so in TLS: data_received)
                hint = " (is it rsd, and is it the port rsd listens on?)" if self.tls else ""
                self._cause = self._cause or (
                    f"the server closed the connection before answering the handshake{hint}"
                )
        elif not self._closed:
            why = cause or str(exc or "closed by the server")
            log.warning(
                "connection to rsd at %s:%s lost: %s", self.host, self.port, why,
                extra={"address": self.events.address},
            )
            self.events.emit("disconnected", why)
        if was_ready:
            # Given up on: the next connect tries it last (nodes.py, Route).
            self._left = Node(self.host, self.port, self.tls is not None)
            self._link_ended()
        self._fail_pending(LostConnection(LOST if cause is None else f"{LOST}: {cause}"))

    def _announce_ready(self) -> None:
        """A handshake succeeded: the first one is ``connected``, later ones ``restored``
        (leases, waits and consumers carry on through it, see ``retry.py``)."""
        if self._was_connected:
            log.warning("connection to rsd at %s:%s restored", self.host, self.port,
                        extra={"address": self.events.address})
            self.events.emit("restored")
        else:
            self._was_connected = True
            self.events.emit("connected")

    def _fail_pending(self, error: RunstateError) -> None:
        pending, self._pending = self._pending, {}
        self._orphans.clear()
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(error)
                # Nobody may be awaiting (fire-and-forget renewals): mark it retrieved.
                fut.exception()


def _give_up_after(timeout: float) -> float:
    """Seconds after which this side gives up a wait of ``timeout`` s the server did not
    answer: its limit, a grace, and a part of the limit more (``send_wait`` reckons it
    inline: a call less per wait)."""
    return timeout + _TIMEOUT_GRACE + timeout / _GRACE_DIVISOR


def _no_answer(timeout: float) -> WaitTimeoutError:
    """The error of a wait this side gave up (``_give_up_after``)."""
    return WaitTimeoutError(f"no answer within {timeout:g} s (the server did not answer in time)")


def _wake(nap: asyncio.Future[None]) -> None:
    if not nap.done():
        nap.set_result(None)
