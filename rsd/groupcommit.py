"""Group commit: one journal write per loop turn, one fsync for every batch held behind
it, and replies held until the fsync that covers them has completed.

The server calls, once per loop turn (its flush): ``write(records)`` first, then
``must_hold(records, must_sync)``; if true it hands that turn's output to ``hold``,
otherwise it sends the output itself; then ``after_flush()``. At stop: ``await stop()``.

What always holds:
- a batch's records are written before any of its output leaves;
- output that depends on records not yet fsynced (under ``always``, or a batch that
  asks for it) is held, in order, until an fsync covering it completes; while anything
  is held, later output is held behind it (the caller, output.py, hands over all of it
  but a connection's output that reveals nothing journaled with nothing of that
  connection's held), so no reply ever reveals a change that could still be lost;
- at most one fsync is in flight, on the journal's thread, and the loop keeps serving
  meanwhile; the batches held while it runs are covered by the next one, so there is
  one fsync per group of batches, never one per request;
- under ``everysec``, what was written is fsynced once a second;
- a snapshot starts only with no fsync in flight; it fsyncs while moving the journal to
  a new segment, so everything held is released right after it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .journal import Journal
from .snapshots import Snapshots

__all__ = ["GroupCommit"]

Conn = TypeVar("Conn")


class GroupCommit(Generic[Conn]):
    """Held output is a batch per loop turn: (connection, bytes) pairs, handed to
    ``send`` once released."""

    def __init__(
        self,
        journal: Journal,
        snapshots: Snapshots,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[Conn, bytes], None],
        waited: Callable[[float], None] | None = None,
    ) -> None:
        """``waited`` is told, for each held batch released, how long it was held."""
        self.journal = journal
        self.snapshots = snapshots
        self.write = journal.write  # the journal's own method: nothing in between
        self._always = journal.policy == "always"
        self._loop = loop
        self._send = send
        self.held: deque[list[tuple[Conn, bytes]]] = deque()
        self._held_at: deque[float] = deque()  # when each held batch was held
        self._waited = waited
        self._in_flight = False  # an fsync is running (or its completion is queued)
        self._idle: asyncio.Future[None] | None = None  # set when the fsyncs are done
        self._periodic: asyncio.TimerHandle | None = None
        if journal.policy == "everysec":
            self._periodic = loop.call_later(1.0, self._every_second)

    def must_hold(self, records: list[Any], must_sync: bool) -> bool:
        """Whether this turn's output must wait for an fsync."""
        return bool(self.held or must_sync or (records and self._always))

    def hold(self, batch: list[tuple[Conn, bytes]]) -> None:
        """Keep ``batch`` until an fsync covering it completes (one is started if none
        is running; else the next one, started when it ends, covers it)."""
        self.held.append(batch)
        self._held_at.append(self._loop.time())
        if not self._in_flight:
            self._start_sync()

    def after_flush(self) -> None:
        """End of a loop turn: start a snapshot if one is due and no fsync is running."""
        if not self._in_flight and self.snapshots.due():
            self._start_snapshot()

    async def stop(self) -> None:
        """Wait for the fsync in flight, fsync the rest and release everything held;
        end a snapshot writer still running."""
        if self._periodic is not None:
            self._periodic.cancel()
        while self._in_flight:
            self._idle = self._loop.create_future()
            await self._idle
        self.journal.sync_now()
        self._release(len(self.held))
        self.snapshots.stop()

    def _start_sync(self) -> None:
        """fsync in the background; the held batches as of now are released after it."""
        covered = len(self.held)
        self._in_flight = True
        if self.journal.unsynced:
            self.journal.sync_in_background(lambda: self._synced(covered))
        else:
            self._loop.call_soon(self._synced, covered)

    def _synced(self, covered: int) -> None:
        self._in_flight = False
        self._release(covered)
        if self.held:
            self._start_sync()
        elif self.snapshots.due():
            self._start_snapshot()
        if self._idle is not None and not self._in_flight:
            self._idle.set_result(None)
            self._idle = None

    def _release(self, count: int) -> None:
        """Send the oldest ``count`` held batches: one write per connection, in order."""
        send = self._send
        held_at = self._held_at
        if self._waited is not None and count:
            now = self._loop.time()
            for _ in range(count):
                self._waited(now - held_at.popleft())
        else:
            for _ in range(count):
                held_at.popleft()
        if count == 1:
            for conn, data in self.held.popleft():
                send(conn, data)
            return
        joined: dict[Conn, list[bytes]] = {}
        for _ in range(count):
            for conn, data in self.held.popleft():
                joined.setdefault(conn, []).append(data)
        for conn, parts in joined.items():
            send(conn, b"".join(parts))

    def _every_second(self) -> None:
        """Under ``everysec``: fsync what was written in the last second."""
        self._periodic = self._loop.call_later(1.0, self._every_second)
        if self.journal.unsynced and not self._in_flight:
            self._start_sync()

    def _start_snapshot(self) -> None:
        pid = self.snapshots.start()  # fsyncs: everything held is covered
        self._release(len(self.held))
        self.snapshots.watch(self._loop, pid)
