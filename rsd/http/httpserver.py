"""rsd's HTTP listener (``--http-listen HOST:PORT``, alias ``--metrics-listen``): h11, the
sans-IO HTTP/1.1 state machine, driven by a bounded asyncio protocol on rsd's own loop.
It knows nothing of routes: ``handle(request)`` (dashboard.py) answers each request,
at once or through a future.

Why h11: it parses and frames HTTP/1.1 as our core does the protocol, with no I/O of its
own and a bound on what it buffers, so the bounds below are ours to set and to test.

What always holds (every client is a possible adversary):
- at most ``MAX_CONNECTIONS`` connections at once, at most ``MAX_PER_PEER`` from one peer
  (an IPv4 address or an IPv6 /64) and ``MAX_PER_NETWORK`` from one network (an IPv4 /24
  or an IPv6 /56), as ``ratelimit.peer_keys`` counts them. A newcomer over a share, or
  when every place is taken, takes the place of the connection that has waited longest
  for its whole request (aborted), as httpplaces.py decides; with none to take, it is
  closed at once, unread. So however many networks a slowloris spreads over, a request
  that arrives promptly finds a place;
- one request per connection: the answer carries ``Connection: close`` and nothing
  after the request is read (a dashboard polls at most once a second: a connection per
  poll costs little, and no browser holds a place between polls);
- a request's head is at most ``MAX_HEAD_BYTES`` (431 past it: h11's bound on an
  incomplete event), its body at most ``MAX_BODY_BYTES`` (413, checked on the
  Content-Length before any of it is read, and again on what arrives);
- a connection must have sent its whole request and taken its whole answer within
  ``DEADLINE_SECONDS`` of connecting (an answer still being worked out, an action
  waiting for its fsync, counts against it), or it is aborted: a client that trickles
  or never reads cannot hold a place. An answer made to wait (a wrong token's) is
  written before the deadline (``Request.deadline``), and an answer the kernel took
  whole (without TLS) is never aborted: it is closed the ordinary way;
- a request h11 cannot parse gets 400 (or the status h11 suggests) and the connection
  ends; nothing a client sends raises out of this module;
- with TLS (``tls``, the protocol port's context, tls.py), the handshake begins only
  once the connection holds a place (``tls.tls_layer``, put on the admitted socket as
  the protocol port does), so a connection still shaking hands counts against every
  bound above and must end its handshake, too, within the deadline;
- it never takes more than ``DESCRIPTORS`` file descriptors (its listener, the
  connections it serves, and an accept burst of at most ``BACKLOG`` closed at once),
  and cli.py takes them out of the client connections' share of the file limit.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import ssl
from collections.abc import Callable, KeysView
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import cast
from urllib.parse import parse_qsl, urlsplit

import h11

from ..security.tls import tls_layer
from .httpplaces import Places

__all__ = [
    "BACKLOG", "DEADLINE_SECONDS", "DESCRIPTORS", "MAX_BODY_BYTES", "MAX_CONNECTIONS",
    "MAX_HEAD_BYTES", "MAX_PER_NETWORK", "MAX_PER_PEER", "Handler", "HttpEndpoint", "Request",
    "Response", "host_name",
]

log = logging.getLogger("rsd")

MAX_CONNECTIONS = 64
# A browser opens up to 6 at once to load a page; then each open tab polls one request
# at a time: 16 holds a dozen tabs of one host polling in step.
MAX_PER_PEER = 16
MAX_PER_NETWORK = 32  # half the places: the other half is always for other networks
MAX_HEAD_BYTES = 16384
MAX_BODY_BYTES = 16384  # an action's body: a few names and ids
DEADLINE_SECONDS = 5.0
BACKLOG = MAX_CONNECTIONS
DESCRIPTORS = 1 + MAX_CONNECTIONS + BACKLOG
METHODS = frozenset({"GET", "HEAD", "POST"})


@dataclass(frozen=True, slots=True)
class Request:
    method: str  # GET, HEAD or POST
    path: str  # as sent (percent-encoded: routes split it, then decode), no query
    query: dict[str, str]
    headers: dict[str, str]  # names lower-case; a repeated header: its last value
    body: bytes
    peer_host: str
    deadline: float  # the loop time by which its answer must be written (a handler that
    # makes an answer wait, as a wrong token's does, answers before it)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = field(default=())


# A handler answers at once, or with a future the loop resolves later (an action held
# for its fsync); a future that fails is answered 500.
Handler = Callable[[Request], "Response | asyncio.Future[Response]"]


_HOST = re.compile(
    r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}))"
    r"(?::(?P<port>[0-9]{1,5}))?"
)


def host_name(header: str) -> str | None:
    """The host a ``Host`` header names, lower-case (an IPv6 address without its
    brackets), or None unless the header is exactly ``host[:port]``: a DNS name or an
    IPv4 address, or an IPv6 address in brackets, and a port from 0 to 65535. Nothing
    else passes (``localhost:80@evil.example``, a user part, a path, a second port)."""
    found = _HOST.fullmatch(header)
    if found is None or (found["port"] is not None and int(found["port"]) > 65535):
        return None
    if found["ipv6"] is not None:
        try:
            return str(ipaddress.IPv6Address(found["ipv6"]))
        except ValueError:
            return None
    return str(found["name"]).lower()


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def text(status: int, message: str, *headers: tuple[str, str]) -> Response:
    return Response(status, message.encode() + b"\n", headers=headers)


class HttpEndpoint:
    """Serves ``handle`` on a listener made by ``bind``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        handle: Handler,
        *,
        tls: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        max_per_peer: int = MAX_PER_PEER,
        max_per_network: int = MAX_PER_NETWORK,
        deadline: float = DEADLINE_SECONDS,
        max_head: int = MAX_HEAD_BYTES,
        max_body: int = MAX_BODY_BYTES,
    ) -> None:
        self.loop = loop
        self.handle = handle
        self.tls = tls
        self.max_connections = max_connections
        self.max_per_peer = max_per_peer
        self.max_per_network = max_per_network
        self.deadline = deadline
        self.max_head = max_head
        self.max_body = max_body
        self.places: Places[_Exchange] = Places(max_connections, max_per_peer, max_per_network)
        self.refused = 0  # closed unread: no place to take
        self.displaced = 0  # aborted to make room for a newcomer (httpplaces.py)
        self.answered = 0
        self._turn_marked = False  # a new_turn is scheduled
        self._listener: asyncio.base_events.Server | None = None

    @property
    def open(self) -> KeysView[_Exchange]:
        """The connections holding a place."""
        return self.places.holders()

    async def bind(self, host: str, port: int) -> tuple[str, int]:
        """Take the address (not accepting yet: ``start``). OSError if it cannot."""
        self._listener = await self.loop.create_server(
            lambda: _Exchange(self), host, port, reuse_address=True, backlog=BACKLOG,
            start_serving=False,  # TLS, if any, only on an admitted socket (_start_tls)
        )
        name = self._listener.sockets[0].getsockname()
        return name[0], name[1]

    async def start(self) -> None:
        assert self._listener is not None
        await self._listener.start_serving()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for exchange in list(self.open):
            exchange.abort()

    def admit(self, exchange: _Exchange, host: str) -> bool:
        """Give ``exchange`` (from ``host``) a place, aborting the connection whose place
        it takes, if any; False if it must be closed."""
        admitted, displaced = self.places.admit(exchange, host)
        if not admitted:
            return False
        if not self._turn_marked:  # the places count loop turns: a connection is slow
            self._turn_marked = True  # for having sent nothing only after two of them
            self.loop.call_soon(self._new_turn)
        if displaced is not None:
            self.displaced += 1
            displaced.abort()
        return True

    def _new_turn(self) -> None:
        self._turn_marked = False
        self.places.new_turn()

    def forget(self, exchange: _Exchange) -> None:
        """``exchange`` no longer holds a place (closed, or displaced). Idempotent."""
        self.places.forget(exchange)


class _Exchange(asyncio.Protocol):
    """One HTTP connection: one request, one answer, closed."""

    def __init__(self, endpoint: HttpEndpoint) -> None:
        self.endpoint = endpoint
        self.http = h11.Connection(h11.SERVER, max_incomplete_event_size=endpoint.max_head)
        self.transport: asyncio.Transport | None = None
        self.request: h11.Request | None = None
        self.head = bytearray()  # what came before the head's end, while it has not
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.answered = False  # the answer is written, or being worked out
        self.timer: asyncio.TimerHandle | None = None
        self.tls_pending = False  # in the TLS handshake: nothing of the request read yet
        self.began = 0.0  # the loop time it was admitted: its deadline runs from there
        self.host = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.tls_pending:  # the TLS handshake is done: the request comes over its layer
            self.tls_pending = False
            self.transport = cast(asyncio.Transport, transport)
            return
        stream = self.transport = cast(asyncio.Transport, transport)  # uvloop's: no subclass
        endpoint = self.endpoint
        peername = transport.get_extra_info("peername")
        self.host = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        if not endpoint.admit(self, self.host):
            endpoint.refused += 1
            stream.abort()
            return
        self.began = endpoint.loop.time()
        self.timer = endpoint.loop.call_at(self.began + endpoint.deadline, self.abort)
        if endpoint.tls is not None:
            self._start_tls(stream, endpoint.tls)

    def _start_tls(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        """Put TLS between the admitted socket and this exchange before a byte is read.
        The layer calls ``connection_made`` again with its transport once the handshake
        is done, or fails ``waiter`` (``_tls_failed``)."""
        loop = self.endpoint.loop
        waiter: asyncio.Future[None] = loop.create_future()
        layer = tls_layer(loop, self, context, waiter, self.endpoint.deadline)
        self.tls_pending = True
        raw.set_protocol(layer)
        layer.connection_made(raw)
        waiter.add_done_callback(self._tls_failed)

    def _tls_failed(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.cancelled() and waiter.exception() is None:
            return  # the handshake is done
        self.abort()
        if self.tls_pending:  # the layer tells this exchange nothing more: its place goes
            self.tls_pending = False
            self.connection_lost(None)

    def data_received(self, data: bytes) -> None:
        if self.answered:
            return  # after the request: not read
        if self.request is None:  # the head's size, however it arrives (h11 bounds only
            head = self.head  # an incomplete one)
            start = max(0, len(head) - 3)  # an end cut between two reads is found too,
            head += data  # and a head sent byte by byte is searched once, not each time
            end = head.find(b"\r\n\r\n", start)
            if (end if end >= 0 else len(head)) > self.endpoint.max_head:
                self._send(text(431, "request too large"))
                return
            if end >= 0:
                self.head = bytearray()
        try:
            self.http.receive_data(data)
            self._events()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            self._send(text(status, "request too large" if status == 431 else "bad request"))
        if not self.answered:  # part of a request, not the whole: a slow one's place
            self.endpoint.places.heard(self)

    def eof_received(self) -> bool | None:
        if not self.answered:
            self.abort()  # half a request, and no more coming
        return None

    def _events(self) -> None:
        endpoint = self.endpoint
        while not self.answered:
            event = self.http.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                method = event.method.decode("ascii", "replace")
                if method not in METHODS:
                    self._send(text(405, "only GET, HEAD and POST", ("Allow", "GET, HEAD, POST")))
                    return
                for name, value in event.headers:
                    if name == b"content-length" and int(value) > endpoint.max_body:
                        self._send(text(413, f"a body is at most {endpoint.max_body} bytes"))
                        return
                self.request = event
            elif isinstance(event, h11.Data):
                self.body_bytes += len(event.data)
                if self.body_bytes > endpoint.max_body:
                    self._send(text(413, f"a body is at most {endpoint.max_body} bytes"))
                    return
                self.body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._dispatch()
            elif isinstance(event, h11.ConnectionClosed):
                self.abort()
                return

    def _dispatch(self) -> None:
        event = self.request
        assert event is not None
        self._whole()
        target = urlsplit(event.target.decode("ascii", "replace"))
        request = Request(
            method=event.method.decode("ascii"),
            path=target.path,
            query=dict(parse_qsl(target.query, keep_blank_values=True)),
            headers={name.decode("latin-1"): value.decode("latin-1")
                     for name, value in event.headers},
            body=b"".join(self.body),
            peer_host=self.host,
            deadline=self.began + self.endpoint.deadline,
        )
        self.body = []
        try:
            answer = self.endpoint.handle(request)
        except Exception:
            log.exception("internal error answering %s %s", request.method, request.path)
            answer = text(500, "internal server error")
        if isinstance(answer, Response):
            self._send(answer)
        else:
            answer.add_done_callback(self._answered)

    def _answered(self, future: asyncio.Future[Response]) -> None:
        if self.transport is None or self.transport.is_closing():
            return  # gone, or aborted by the deadline
        if future.cancelled() or future.exception() is not None:
            if not future.cancelled():
                log.error("internal error answering a request: %r", future.exception())
            self._send(text(500, "internal server error"))
        else:
            self._send(future.result())

    def _whole(self) -> None:
        """The request is whole (or answered an error): nothing more is read, and its
        place is no longer a slow one's."""
        self.answered = True
        self.endpoint.places.whole(self)

    def _send(self, response: Response) -> None:
        self._whole()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        head_only = self.request is not None and self.request.method == b"HEAD"
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Connection", "close"),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            *response.headers,
        ]
        http = self.http
        try:
            if http.their_state is h11.ERROR or http.our_state is not h11.SEND_RESPONSE:
                # h11 refuses to answer once the peer broke the protocol: a fresh one
                # frames the error answer (one request per connection: nothing follows)
                http = h11.Connection(h11.SERVER)
                http.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                http.next_event()
            data = http.send(h11.Response(status_code=response.status, headers=headers,
                                          reason=_reason(response.status)))
            if not head_only and response.body:
                data += http.send(h11.Data(data=response.body))
            data += http.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            log.exception("cannot frame an answer")
            transport.abort()
            return
        self.endpoint.answered += 1
        transport.write(data)
        transport.close()  # after the answer is flushed; the deadline still holds,
        if (self.timer is not None and self.endpoint.tls is None
                and transport.get_write_buffer_size() == 0):
            # unless all of it is with the kernel: the close is done (over TLS the
            # layer's count leaves out the socket's own buffer: the deadline stays)
            self.timer.cancel()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.endpoint.forget(self)
