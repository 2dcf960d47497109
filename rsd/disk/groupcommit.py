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
  connection's held, and PING replies and quiet renewals: ``conn.overtaking``), so no
  reply ever reveals a change that could still be lost;
- at most one fsync is in flight, on the journal's thread, and the loop keeps serving
  meanwhile; the batches held while it runs are covered by the next one, so there is
  one fsync per group of batches, never one per request;
- under ``everysec``, what was written is fsynced once a second;
- a snapshot starts only with no fsync in flight; it fsyncs while moving the journal to
  a new segment, so everything held is released right after it;
- in a cluster (``replicas``: the primary's feeds, feeds.py), a held batch is released
  only once the synchronous standby has also acknowledged (fsynced) every journal batch
  written up to it: a reply that reports a change leaves only once the change is on two
  machines. Held output that no standby acknowledges is never released, not even at a
  stop: its changes may be lost in a takeover, so they are never reported done. A batch
  fsynced here that no standby has acknowledged within ``sync_wait`` seconds (no
  standby holds it: none is caught up) is not kept waiting for ever: its connections
  are refused (``refuse``: UNAVAILABLE, the outcome unknown to them), never told it
  succeeded.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from ..policy import Policy
from .journal import Journal
from .snapshots import Snapshots

__all__ = ["GroupCommit"]

Conn = TypeVar("Conn")


class Replicas(Protocol):
    """What group commit asks of the primary's feeds (feeds.py)."""

    @property
    def written(self) -> int:
        """The number of the last journal batch written."""

    @property
    def sync_acked(self) -> int:
        """The last batch the synchronous standby holds, fsynced (-1: no standby)."""


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
        replicas: Replicas | None = None,
        refuse: Callable[[Conn, int], None] | None = None,
        sync_wait: float = Policy.SYNC_WAIT_SECONDS,
    ) -> None:
        """``waited`` is told, for each held batch released, how long it was held;
        ``replicas``: a cluster's primary's feeds, whose synchronous standby must hold
        what a released batch reveals (None: one node alone); ``refuse(conn, bytes)``:
        fail a connection whose held output (``bytes`` of it) no standby acknowledged
        within ``sync_wait`` seconds."""
        self.journal = journal
        self.snapshots = snapshots
        self.write = journal.write  # the journal's own method: nothing in between
        self._always = journal.policy == "always"
        self._loop = loop
        self._send = send
        self.held: deque[list[tuple[Conn, bytes]]] = deque()
        self._held_at: deque[float] = deque()  # when each held batch was held
        self.replicas = replicas
        self._needs: deque[int] = deque()  # the journal batch each held batch follows
        # Held batches are numbered from the first ever held: ``held[0]`` is number
        # ``_gone`` (those before it were released or refused); an fsync covers the held
        # batches numbered below ``_fsynced`` (absolute numbers: batches that leave the
        # front while an fsync runs do not shift what it covered).
        self._gone = 0
        self._fsynced = 0
        self._refuse = refuse
        self._sync_wait = sync_wait
        self._sync_timer: asyncio.TimerHandle | None = None
        self._waited = waited
        # ``after_held``: (the number of held batches that must be gone, callback)
        self._after: deque[tuple[int, Callable[[bool], None]]] = deque()
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
        self._needs.append(-1 if self.replicas is None else self.replicas.written)
        if self.replicas is not None and self._sync_timer is None:
            self._sync_timer = self._loop.call_later(self._sync_wait, self._sync_overdue)
        if not self._in_flight:
            self._start_sync()

    def _sync_overdue(self) -> None:
        """Refuse the connections of the first held batches that an fsync covered but
        no standby acknowledged within ``sync_wait``; look again while any is held."""
        self._sync_timer = None
        replicas = self.replicas
        if replicas is None:
            return
        now = self._loop.time()
        held, held_at, needs = self.held, self._held_at, self._needs
        while (
            self._fsynced > self._gone and held and needs[0] > replicas.sync_acked
            and now - held_at[0] >= self._sync_wait
        ):
            batch = held.popleft()
            held_at.popleft()
            needs.popleft()
            self._gone += 1
            if self._refuse is not None:
                for conn, data in batch:
                    self._refuse(conn, len(data))
            self._gone_up_to(False)
        if held:
            wait = max(0.0, held_at[0] + self._sync_wait - now)
            self._sync_timer = self._loop.call_later(wait, self._sync_overdue)

    def oldest_wait(self, now: float) -> tuple[float, bool] | None:
        """How long the oldest held batch has waited at ``now``, and whether an fsync
        covers it already (then it waits for the synchronous standby); None when nothing
        is held. O(1): what /readyz asks (http/probes.py)."""
        if not self.held:
            return None
        return now - self._held_at[0], self._fsynced > self._gone

    def after_held(self, done: Callable[[bool], None]) -> None:
        """Call ``done(True)`` once every batch held now is released (at once if none
        is), ``done(False)`` if one of them is refused instead: what an HTTP action
        (api.py) waits for before it says it is done, as a reply would."""
        if not self.held:
            done(True)
            return
        self._after.append((self._gone + len(self.held), done))

    def _gone_up_to(self, ok: bool) -> None:
        after = self._after
        while after and after[0][0] <= self._gone:
            after.popleft()[1](ok)

    def acked(self) -> None:
        """The synchronous standby acknowledged more: release what is now on both."""
        self._release_ready()

    def after_flush(self) -> None:
        """End of a loop turn: start a snapshot if one is due and no fsync is running."""
        if not self._in_flight and self.snapshots.due():
            self._start_snapshot()

    async def stop(self) -> None:
        """Wait for the fsync in flight, fsync the rest and release everything held;
        end a snapshot writer still running."""
        if self._periodic is not None:
            self._periodic.cancel()
        if self._sync_timer is not None:
            self._sync_timer.cancel()
            self._sync_timer = None
        while self._in_flight:
            self._idle = self._loop.create_future()
            await self._idle
        self.journal.sync_now()
        self._fsynced = self._gone + len(self.held)
        self._release_ready()  # (in a cluster, what no standby holds is never sent)
        self.snapshots.stop()

    def _start_sync(self) -> None:
        """fsync in the background; the held batches as of now are covered by it."""
        covered = self._gone + len(self.held)  # the batches held now, by number
        self._in_flight = True
        if self.journal.unsynced:
            self.journal.sync_in_background(lambda: self._synced(covered))
        else:
            self._loop.call_soon(self._synced, covered)

    def _synced(self, covered: int) -> None:
        self._in_flight = False
        self._fsynced = max(self._fsynced, covered)
        self._release_ready()
        if self._gone + len(self.held) > self._fsynced:  # some not covered (else: acks wait)
            self._start_sync()
        elif self.snapshots.due():
            self._start_snapshot()
        if self._idle is not None and not self._in_flight:
            self._idle.set_result(None)
            self._idle = None

    def _release_ready(self) -> None:
        """Release the first held batches that an fsync has covered and, in a cluster,
        the synchronous standby holds."""
        count = min(self._fsynced - self._gone, len(self.held))
        if self.replicas is not None:
            acked = self.replicas.sync_acked
            needs = self._needs
            ready = 0
            while ready < count and needs[ready] <= acked:
                ready += 1
            count = ready
        if count > 0:
            self._release(count)

    def _release(self, count: int) -> None:
        """Send the oldest ``count`` held batches: one write per connection, in order."""
        send = self._send
        held_at = self._held_at
        self._gone += count
        for _ in range(count):
            self._needs.popleft()
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
            self._gone_up_to(True)
            return
        joined: dict[Conn, list[bytes]] = {}
        for _ in range(count):
            for conn, data in self.held.popleft():
                joined.setdefault(conn, []).append(data)
        for conn, parts in joined.items():
            send(conn, b"".join(parts))
        self._gone_up_to(True)

    def _every_second(self) -> None:
        """Under ``everysec``: fsync what was written in the last second."""
        self._periodic = self._loop.call_later(1.0, self._every_second)
        if self.journal.unsynced and not self._in_flight:
            self._start_sync()

    def _start_snapshot(self) -> None:
        pid = self.snapshots.start()  # fsyncs: everything held is covered
        self._fsynced = self._gone + len(self.held)
        self._release_ready()
        self.snapshots.watch(self._loop, pid)
