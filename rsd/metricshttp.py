"""The Prometheus endpoint (``--metrics-listen HOST:PORT``): a tiny HTTP/1.1 responder on
rsd's own event loop that answers ``GET /metrics`` with ``metrics.render``.

Why not ``prometheus_client``: its registry and its HTTP server run in a thread of their
own and read the metrics from there under locks; rsd keeps every figure on the loop's
thread, bumped without locks on the hot path. Writing the text format here (metrics.py)
is a hundred lines, and the parser test checks it to the letter.

What always holds (every scraper is a possible adversary):
- at most ``MAX_CONNECTIONS`` connections at once, at most ``MAX_PER_PEER`` of them from
  one peer (an IPv4 address or an IPv6 /64) and at most ``MAX_PER_NETWORK`` from one
  network (an IPv4 /24 or an IPv6 /56), both as ``ratelimit.peer_keys`` counts HELLO
  failures; a connection over
  its peer's or network's share is closed at once, unread. When every place is taken, a
  newcomer whose network holds at least two fewer than the network holding the most
  takes the place of that network's oldest connection (aborted); otherwise it is closed
  unread. So one slow host (or one network of them) can hold only its share, and a
  scraper from elsewhere is still served while it holds them;
- a connection must have sent its whole request head (at most ``MAX_REQUEST_BYTES``)
  and taken its whole answer within ``DEADLINE_SECONDS`` of connecting, or it is
  aborted: a client that trickles its request or never reads cannot hold a place;
- one request per connection (``Connection: close``), a body is never read;
- rendering costs O(series), bounded (metrics.py), and a scrape within
  ``MIN_RENDER_SECONDS`` of the last render gets the same bytes, so scraping in a loop
  cannot take more than a sliver of the event loop;
- nothing here touches the core: it only reads counters;
- it never takes more than ``DESCRIPTORS`` file descriptors (its listener, the
  connections it serves, and an accept burst of at most ``BACKLOG`` closed at once:
  each accepted connection closes at most one, itself or the one it displaces),
  and cli.py takes them out of the client connections' share of the file limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from .ratelimit import peer_keys

__all__ = [
    "DEADLINE_SECONDS", "DESCRIPTORS", "MAX_CONNECTIONS", "MAX_PER_NETWORK", "MAX_PER_PEER",
    "MAX_REQUEST_BYTES", "MetricsEndpoint",
]

log = logging.getLogger("rsd")

MAX_CONNECTIONS = 16
MAX_PER_PEER = 4  # a scrape takes milliseconds: a well-behaved scraper holds one
MAX_PER_NETWORK = 8  # half the places: the other half is always for other networks
MAX_REQUEST_BYTES = 8192
DEADLINE_SECONDS = 5.0
MIN_RENDER_SECONDS = 0.5
BACKLOG = MAX_CONNECTIONS
DESCRIPTORS = 1 + MAX_CONNECTIONS + BACKLOG
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def _response(status: bytes, body: bytes, content_type: bytes, head_only: bool,
              extra: bytes = b"") -> bytes:
    head = (b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type
            + b"\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\nConnection: close\r\n" + extra + b"\r\n")
    return head if head_only else head + body


class MetricsEndpoint:
    """Serves ``render()`` at /metrics on a listener made by ``bind``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        render: Callable[[], bytes],
        *,
        max_connections: int = MAX_CONNECTIONS,
        max_per_peer: int = MAX_PER_PEER,
        max_per_network: int = MAX_PER_NETWORK,
        deadline: float = DEADLINE_SECONDS,
        max_request: int = MAX_REQUEST_BYTES,
        min_render: float = MIN_RENDER_SECONDS,
    ) -> None:
        self.loop = loop
        self._render = render
        self.max_connections = max_connections
        self.max_per_peer = max_per_peer
        self.max_per_network = max_per_network
        self.deadline = deadline
        self.max_request = max_request
        self.min_render = min_render
        self.open: set[_Scrape] = set()
        self.refused = 0  # closed unread: over a share, or no place to take
        self.displaced = 0  # aborted to make room for a newcomer from a smaller network
        self.scrapes = 0
        self._peers: dict[str, int] = {}  # open connections per peer key
        self._networks: dict[str, list[_Scrape]] = {}  # per network, oldest first
        self._body = b""
        self._rendered_at = float("-inf")
        self._listener: asyncio.base_events.Server | None = None

    async def bind(self, host: str, port: int) -> tuple[str, int]:
        """Take the address (not accepting yet: ``start``). OSError if it cannot."""
        self._listener = await self.loop.create_server(
            lambda: _Scrape(self), host, port, reuse_address=True, backlog=BACKLOG,
            start_serving=False,
        )
        name = self._listener.sockets[0].getsockname()
        return name[0], name[1]

    async def start(self) -> None:
        assert self._listener is not None
        await self._listener.start_serving()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for scrape in list(self.open):
            scrape.abort()

    def admit(self, scrape: _Scrape, host: str) -> bool:
        """Count ``scrape`` (from ``host``) in, displacing the oldest connection of the
        network holding the most if every place is taken; False if it must be closed.
        O(MAX_CONNECTIONS) at worst: the table holds at most that many connections."""
        peer, network = peer_keys(host)
        peers, networks = self._peers, self._networks
        if peers.get(peer, 0) >= self.max_per_peer:
            return False
        own = networks.get(network)
        held = 0 if own is None else len(own)
        if held >= self.max_per_network:
            return False
        if len(self.open) >= self.max_connections:
            largest = max(networks.values(), key=len)
            if len(largest) < held + 2:
                return False  # every network holds about as much as this one
            oldest = largest[0]
            self.forget(oldest)
            self.displaced += 1
            oldest.abort()
        scrape.peer, scrape.network = peer, network
        self.open.add(scrape)
        peers[peer] = peers.get(peer, 0) + 1
        networks.setdefault(network, []).append(scrape)
        return True

    def forget(self, scrape: _Scrape) -> None:
        """``scrape`` no longer holds a place (closed, or displaced). Idempotent."""
        if scrape not in self.open:
            return
        self.open.discard(scrape)
        left = self._peers[scrape.peer] - 1
        if left:
            self._peers[scrape.peer] = left
        else:
            del self._peers[scrape.peer]
        line = self._networks[scrape.network]
        line.remove(scrape)  # at most MAX_PER_NETWORK long
        if not line:
            del self._networks[scrape.network]

    def body(self) -> bytes:
        now = self.loop.time()
        if now - self._rendered_at >= self.min_render:
            self._body = self._render()
            self._rendered_at = now
        self.scrapes += 1
        return self._body


class _Scrape(asyncio.Protocol):
    """One HTTP connection: one request, one answer, closed."""

    def __init__(self, endpoint: MetricsEndpoint) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.answered = False
        self.timer: asyncio.TimerHandle | None = None
        self.peer = ""  # its keys under the shares, set once admitted
        self.network = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = self.transport = cast(asyncio.Transport, transport)  # uvloop's: no subclass
        endpoint = self.endpoint
        peername = transport.get_extra_info("peername")
        host = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        if not endpoint.admit(self, host):
            endpoint.refused += 1
            stream.abort()
            return
        self.timer = endpoint.loop.call_later(endpoint.deadline, self.abort)

    def data_received(self, data: bytes) -> None:
        if self.answered:
            return  # a body or a second request: not read
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > self.endpoint.max_request:
                self._answer(b"431 Request Header Fields Too Large", b"request too large\n")
            return
        if end > self.endpoint.max_request:
            self._answer(b"431 Request Header Fields Too Large", b"request too large\n")
            return
        line = self.buffer[: self.buffer.find(b"\r\n")]
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._answer(b"400 Bad Request", b"bad request line\n")
            return
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            self._answer(b"405 Method Not Allowed", b"only GET and HEAD\n",
                         extra=b"Allow: GET, HEAD\r\n")
        elif target != b"/metrics":
            self._answer(b"404 Not Found", b"the metrics are at /metrics\n",
                         head_only=method == b"HEAD")
        else:
            self._answer(b"200 OK", self.endpoint.body(), CONTENT_TYPE, method == b"HEAD")

    def _answer(self, status: bytes, body: bytes, content_type: bytes = b"text/plain",
                head_only: bool = False, extra: bytes = b"") -> None:
        self.answered = True
        self.buffer = b""
        assert self.transport is not None
        self.transport.write(_response(status, body, content_type, head_only, extra))
        self.transport.close()  # after the answer is flushed; the deadline still holds

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.endpoint.forget(self)
