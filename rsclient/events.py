"""Connection events: the life of a client's connection, made visible to its user.

``rs.on_connection_event(callback)`` and ``async for event in rs.connection_events()``
both see the same ``ConnectionEvent`` objects, in the order they happened:

- ``connected``: the first handshake succeeded;
- ``disconnected``: an established connection was lost (not by ``close()``);
- ``reconnecting``: the client is trying to connect again (a request needed it: renewals
  of held leases, pending waits and consumers all do);
- ``restored``: a handshake after a loss succeeded; held leases are renewed, waits and
  consumers parked again, all on their own.

What always holds: telling never blocks the client. A callback runs later on the
client's loop (``call_soon``), and one that raises is logged and kept; an iterator's
queue holds at most ``MAX_QUEUED`` events, and when a reader falls that far behind the
oldest are dropped (``ConnectionEvent.dropped`` on the next one says how many).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["MAX_QUEUED", "ConnectionEvent", "ConnectionEvents", "EventKind"]

log = logging.getLogger("rsclient")

EventKind = Literal["connected", "disconnected", "reconnecting", "restored"]
MAX_QUEUED = 100  # events an iterator keeps for a reader that has not caught up


@dataclass(frozen=True)
class ConnectionEvent:
    """One change in the connection's life: ``kind``, the server's ``address``, the wall
    clock time ``at`` (epoch seconds), the ``cause`` of a disconnect, and how many
    earlier events this iterator ``dropped`` because its reader was behind."""

    kind: EventKind
    address: str
    at: float
    cause: str | None = None
    dropped: int = 0


class _Reader:
    """One ``connection_events()`` iterator's bounded queue and its wake-up."""

    __slots__ = ("dropped", "queue", "waker")

    def __init__(self) -> None:
        self.queue: collections.deque[ConnectionEvent] = collections.deque()
        self.waker: asyncio.Future[None] | None = None
        self.dropped = 0

    def put(self, event: ConnectionEvent) -> None:
        if len(self.queue) >= MAX_QUEUED:
            self.queue.popleft()
            self.dropped += 1
        self.queue.append(event)
        if self.waker is not None and not self.waker.done():
            self.waker.set_result(None)


class ConnectionEvents:
    """The subscribers to one connection's events, and the one way to tell them."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._callbacks: list[Callable[[ConnectionEvent], object]] = []
        self._readers: set[_Reader] = set()

    def subscribe(self, callback: Callable[[ConnectionEvent], object]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event from now on; returns an unsubscribe."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    async def stream(self) -> AsyncIterator[ConnectionEvent]:
        """Every event from now on, for as long as the caller iterates."""
        reader = _Reader()
        self._readers.add(reader)
        try:
            while True:
                while not reader.queue:
                    reader.waker = asyncio.get_running_loop().create_future()
                    await reader.waker
                event = reader.queue.popleft()
                if reader.dropped:
                    event = ConnectionEvent(
                        event.kind, event.address, event.at, event.cause, reader.dropped
                    )
                    reader.dropped = 0
                yield event
        finally:
            self._readers.discard(reader)

    def emit(self, kind: EventKind, cause: str | None = None) -> None:
        """Tell every subscriber; returns at once whatever they do."""
        if not self._callbacks and not self._readers:
            return
        event = ConnectionEvent(kind, self.address, time.time(), cause)
        for reader in self._readers:
            reader.put(event)
        if self._callbacks:
            loop = asyncio.get_running_loop()
            for callback in list(self._callbacks):
                loop.call_soon(_call, callback, event)


def _call(callback: Callable[[ConnectionEvent], object], event: ConnectionEvent) -> None:
    try:
        callback(event)
    except Exception:
        log.exception("connection event callback failed on %s", event.kind)
