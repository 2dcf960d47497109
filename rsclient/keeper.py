"""The lease keeper: one per client, it renews every lease the client holds, in batches.

What always holds:
- a lease is renewed at about a third of its length; every lease due within a sixth of
  its length of the earliest one rides in the same LEASE_RENEW request, so a thousand
  leases cost one frame per renewal round, not a thousand; a round larger than the
  server's batch limit is split;
- one timer, armed at the earliest deadline in a heap, drives every renewal: nothing
  polls, and tracking, forgetting or rescheduling a lease is O(log n);
- a lease whose renewal the server answers MOVED left that shard with its run: it is
  not lost. The map is asked for again if need be (``Shards.lease_moved``), and the
  lease is kept (``leases.rebind``) and renewed at once by the keeper of the shard that
  owns its run now; until the map says where, it is tried again soon, until its
  deadline, as an unanswered renewal is. Nothing of this runs unless a server said MOVED;
- the keeper declares a lease lost when the server says STALE_CLAIM or pushes
  LEASE_LOST, or when its timer finds the lease past its deadline (``lease_seconds``
  after the send time of the last renewal the server confirmed, less the safety margin
  of ``leases.loss_margin``; the lease itself also checks that deadline whenever it is
  asked); it never re-acquires;
- a renewal the server could not answer (not reachable) is tried again soon, until the
  lease's deadline; every renewal in flight is strongly referenced until it ends;
- a lease granted with ``release_on_disconnect`` (``bind``) is declared lost the moment
  the connection it was granted on ends (the server ends it then): never renewed from
  another connection, never believed held once the server may have freed it; one whose
  connection ended before it was bound here is lost at once;
- the heap holds O(live leases) entries: entries of forgotten or rescheduled leases are
  dropped when they surface, and all at once (O(n), so O(1) per forget amortised) when
  they outnumber the live ones by ``_STALE_SLACK``, so a client that acquires and
  releases quickly does not keep every released lease alive until its renewal time.

The third, the sixth and the retry interval are ``rsproto.sdkrules``', which both SDKs
follow.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import weakref
from typing import TYPE_CHECKING, Any

from rsproto.sdkrules import RENEWAL_BATCH_DIVISOR, RENEWAL_RETRY_SECONDS

from .errors import RunstateError, UnavailableError
from .failover import send_again
from .leases import Lease, confirm_renewal, declare_lost, rebind
from .retry import GiveUps
from .wire import ErrorCode, Limits, Op, Push

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["LeaseKeeper"]

log = logging.getLogger("rsclient")

_STALE_SLACK = 1024  # heap entries allowed beyond twice the live ones before a compaction
_UNBOUND = (
    "its connection to rsd ended, and the server ends a lease granted with "
    "release_on_disconnect with it"
)


class LeaseKeeper:
    """Renews every live lease of one client in batches; declares losses.

    Deadlines sit in a heap of ``(when, seq, handle)``; an entry is live only while
    ``seq`` is the one last armed for its lease, so rescheduling is a push and a stale
    entry is skipped when it surfaces. An entry names its lease by handle, never holds
    it: a settled delivery's lease is freed at once, not kept alive by its stale entry
    until a compaction (a thousand leases at a time, each one then old enough for the
    garbage collector's older generations to walk it again and again).
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._leases: dict[bytes, Lease] = {}
        self._armed: dict[bytes, int] = {}  # lease handle -> seq of its live heap entry
        self._heap: list[tuple[float, int, bytes]] = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._in_flight: set[bytes] = set()
        self._renewals: set[asyncio.Task[None]] = set()
        self.give_ups = GiveUps()  # unanswered releases, given up at their deadline
        conn.on_push(Push.LEASE_LOST, self._on_lost_push)
        self._known: weakref.WeakValueDictionary[bytes, Lease] = weakref.WeakValueDictionary()
        # leases that end with this client's current connection (``bind``)
        self._bound: weakref.WeakValueDictionary[bytes, Lease] = weakref.WeakValueDictionary()
        conn.on_link_lost(self._link_lost)

    def __len__(self) -> int:
        return len(self._leases)

    def track(self, lease: Lease) -> None:
        """Renew ``lease`` from now on, until it is forgotten or lost."""
        handle = lease.handle
        self._leases[handle] = lease
        if handle in self._in_flight:
            self._schedule(lease)
            return
        # ``_schedule`` inlined for a lease not in flight (once per delivery or grant)
        when = lease.renew_at if lease.renew_at < lease.lost_at else lease.lost_at
        self._seq = seq = self._seq + 1
        self._armed[handle] = seq
        heapq.heappush(self._heap, (when, seq, handle))
        timer_at = self._timer_at
        if timer_at is None or when < timer_at:
            self._arm(when)

    def forget(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (released, settled, lost or abandoned)."""
        if self._leases.pop(lease.handle, None) is not None:
            del self._armed[lease.handle]
            if len(self._heap) > 2 * len(self._armed) + _STALE_SLACK:
                self._compact()

    def renews(self, lease: Lease) -> bool:
        """Whether ``lease`` is renewed here (tracked, not forgotten)."""
        return self._leases.get(lease.handle) is lease

    def know(self, lease: Lease) -> None:
        """Hear about ``lease``'s loss even if it is not renewed here (a received delivery)."""
        self._known[lease.handle] = lease

    def bind(self, lease: Lease, link: int) -> None:
        """``lease`` was granted with ``release_on_disconnect`` on the connection whose
        ``link`` number was ``link`` (read when its request was sent): lost when that
        connection ends, or at once if it has ended already."""
        if link != self.conn.link:
            declare_lost(lease, _UNBOUND)
        else:
            self._bound[lease.handle] = lease

    def _link_lost(self) -> None:
        """The connection ended: every lease bound to it is lost (the server ends them)."""
        bound = list(self._bound.values())
        self._bound.clear()
        for lease in bound:
            declare_lost(lease, _UNBOUND)

    def leases(self) -> list[Lease]:
        """The leases held now, in the order they were granted."""
        return list(self._leases.values())

    def close(self) -> None:
        """Stop renewing (the client is closing); held leases are not released here."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = None

    async def renew_now(self, leases: list[Lease], lease_seconds: float | None) -> None:
        """Renew ``leases`` at once (optionally with a new length), outside the rounds."""
        limit = self._batch_limit()
        for start in range(0, len(leases), limit):
            part = leases[start : start + limit]
            sent_at = asyncio.get_running_loop().time()
            items: list[Any] = [
                lease.handle if lease_seconds is None else [lease.handle, lease_seconds]
                for lease in part
            ]
            args = {"leases": items}
            try:
                reply = await self.conn.request(Op.LEASE_RENEW, args)
            except UnavailableError as exc:  # sent again (``failover.py``); dated from the
                reply = await send_again(self.conn, exc, Op.LEASE_RENEW, args)  # first: safe
            moved = self._settle(part, reply, sent_at, lease_seconds)
            if moved:
                for keeper, leases_there in (await self._follow(moved)).items():
                    await keeper.renew_now(leases_there, lease_seconds)

    # ---- internals -------------------------------------------------------------------

    def _schedule(self, lease: Lease) -> None:
        """(Re)arm the lease's next deadline: renewal, or loss while a renewal is out."""
        if lease.handle not in self._leases:
            return
        when = lease.lost_at if lease.handle in self._in_flight else min(
            lease.renew_at, lease.lost_at
        )
        self._seq += 1
        self._armed[lease.handle] = self._seq
        heapq.heappush(self._heap, (when, self._seq, lease.handle))
        if self._timer_at is None or when < self._timer_at:
            self._arm(when)

    def _arm(self, when: float) -> None:
        """Make the one timer fire at ``when``."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_at(when, self._due)

    def _compact(self) -> None:
        """Drop every stale heap entry at once (see the module docstring)."""
        armed = self._armed
        heap = self._heap  # in place: ``_due`` may be walking this very list
        heap[:] = [entry for entry in heap if armed.get(entry[2]) == entry[1]]
        heapq.heapify(heap)

    def _on_lost_push(self, body: dict[str, Any]) -> None:
        handle = body.get("lease")
        if type(handle) is not bytes:
            return
        lease = self._leases.get(handle) or self._known.get(handle)
        if lease is not None:
            declare_lost(lease, f"the server ended it ({body.get('reason', 'expired')})")

    def _settle(
        self,
        leases: list[Lease],
        reply: dict[str, Any],
        sent_at: float,
        lease_seconds: float | None,
    ) -> list[Lease] | None:
        """Each lease's outcome applied; the leases answered MOVED (for ``_follow``; None
        if none was: nothing made per round), each tried again soon here meanwhile, as an
        outcome this client does not know."""
        moved: list[Lease] | None = None
        for lease, outcome in zip(leases, reply["results"], strict=True):
            if outcome is None:
                if lease_seconds is not None:
                    lease.lease_seconds = lease_seconds
                confirm_renewal(lease, sent_at)
                self._schedule(lease)
            elif outcome == ErrorCode.STALE_CLAIM:
                declare_lost(lease, "the server no longer knows it (STALE_CLAIM)")
            else:  # MOVED, or an outcome this client does not know: again soon, until
                if outcome == ErrorCode.MOVED:  # its deadline (a moved lease: elsewhere)
                    if moved is None:
                        moved = []
                    moved.append(lease)
                lease.renew_at = min(sent_at + RENEWAL_RETRY_SECONDS, lease.lost_at)
                self._schedule(lease)
        return moved

    async def _follow(self, moved: list[Lease]) -> dict[LeaseKeeper, list[Lease]]:
        """``moved`` left this connection's shard with their runs (renewals answered
        MOVED): each is kept from now on by the keeper of the shard that owns its run
        (``Shards.lease_moved``: the map asked for again if it still says here); those
        keepers and their leases, to renew at once. A lease whose new shard the map does
        not tell yet stays here, tried again soon (``_settle``)."""
        shards = self.conn.shards
        there: dict[LeaseKeeper, list[Lease]] = {}
        if shards is None:
            return there
        for lease in moved:
            if lease.released or lease.is_lost:
                continue  # ended meanwhile
            session = await shards.lease_moved(lease.scope, self.conn)
            if session is not None and session.keeper is not self:
                rebind(lease, session.keeper)
                there.setdefault(session.keeper, []).append(lease)
        return there

    async def _renew_moved(self, moved: list[Lease]) -> None:
        """A round's leases answered MOVED: followed (``_follow``), each renewed at once
        by its new keeper."""
        for keeper, leases in (await self._follow(moved)).items():
            try:
                await keeper.renew_now(leases, None)
            except RunstateError as exc:  # unreachable: its own rounds try again soon
                log.info("renewal of moved leases failed, retrying: %s", exc)

    def _due(self) -> None:
        self._timer = None
        self._timer_at = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        heap = self._heap
        armed = self._armed
        batch: list[Lease] = []
        watch: list[Lease] = []
        leases = self._leases
        while heap:
            when, seq, handle = heap[0]
            if armed.get(handle) != seq:
                heapq.heappop(heap)
                continue
            lease = leases[handle]  # (armed: tracked, ``track`` and ``forget`` keep both)
            if when > now + lease.lease_seconds / RENEWAL_BATCH_DIVISOR:
                break
            heapq.heappop(heap)
            if lease.is_lost:  # past its deadline (read from the clock): declared lost now
                pass
            elif lease.handle in self._in_flight:
                watch.append(lease)  # not yet answered: watch for its loss deadline
            else:
                batch.append(lease)
        if batch:
            self._in_flight.update(lease.handle for lease in batch)
            renewal = loop.create_task(self._renew_batch(batch, now))
            self._renewals.add(renewal)  # the loop keeps only a weak reference
            renewal.add_done_callback(self._renewals.discard)
        for lease in batch + watch:
            self._schedule(lease)  # in flight now: armed at its loss deadline
        self._rearm()

    def _rearm(self) -> None:
        """Make the one timer fire at the earliest live deadline in the heap."""
        heap = self._heap
        armed = self._armed
        while heap and armed.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        if not heap:
            return
        when = heap[0][0]
        if self._timer_at is not None and self._timer_at <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_at(when, self._due)

    def _batch_limit(self) -> int:
        limits = self.conn.server_info.get("limits") or {}
        return int(limits.get("max_renew_batch", Limits.MAX_RENEW_BATCH))

    async def _renew_batch(self, batch: list[Lease], sent_at: float) -> None:
        limit = self._batch_limit()
        if len(batch) > limit:  # the server takes so many per request: split the round
            await asyncio.gather(*(
                self._renew_batch(batch[i : i + limit], sent_at)
                for i in range(0, len(batch), limit)
            ))
            return
        try:
            reply = await self.conn.request(
                Op.LEASE_RENEW, {"leases": [lease.handle for lease in batch]}
            )
        except RunstateError as exc:
            # Not reachable right now: try again soon, until each lease's deadline.
            retry_at = asyncio.get_running_loop().time() + RENEWAL_RETRY_SECONDS
            self._in_flight.difference_update(lease.handle for lease in batch)
            log.info("lease renewal failed, retrying: %s", exc)
            for lease in batch:
                lease.renew_at = min(retry_at, lease.lost_at)
                self._schedule(lease)
            return
        self._in_flight.difference_update(lease.handle for lease in batch)
        moved = self._settle(batch, reply, sent_at, None)
        if moved:  # their runs are on another shard now: renewed there at once
            await self._renew_moved(moved)
