"""Settled: what rsd remembers of recent settlements, to answer one that is sent again.

A worker's settlement (complete, retry, reject, release) can be recorded while its reply
is lost: the connection drops, or rsd is killed after the journal's fsync and before
the reply is written. The SDK then sends it again, with the same lease handle, after it
reconnects; the lease is gone (that settlement ended it), so without this memory the
repeat would be STALE_CLAIM and the handler would see a failure for work that was done.

What always holds:
- a settlement is remembered only when its own delivery's handle ended the delivery
  (``remember``, called by the appliers of FINISHED and REQUEUED, so live operation and
  replay remember the same): an expired lease, a cancellation or a deadline leaves
  nothing, so the late result of a worker whose lease ran out stays STALE_CLAIM;
- a repeat is answered (``answer``) only with the same handle, the same kind and from
  the same tenant, with the reply shape of the first answer: a retry's ``retry_in_ms``
  is what is left of its backoff now, and a ``next`` gets no deliveries (``[]``);
  anything else is left to the caller, which refuses it (STALE_CLAIM) as before;
- an entry lives one lease length (the settled lease's) from the settlement, in wall-clock
  time, so that replay and a snapshot rebuild exactly what the live server holds; a
  repeat sent after a restart that took less than that is answered;
- memory is bounded: at most ``Policy.MAX_SETTLED_PER_TENANT`` entries per tenant (the
  oldest is forgotten first, never a refusal), and at most one due per tenant on the line
  of dues (dueline.py), for its oldest entry: an entry past its instant is never answered
  (``answer`` checks it), and is dropped when the oldest ones are swept (at most
  ``_SWEEP`` per due); an entry costs O(1) to add, find and forget;
- the memory is in every snapshot (SNAP_SETTLED) and rebuilt by journal replay, so a
  repeat sent after a kill -9 and restart is answered as one sent before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Final

from ...policy import Policy
from ..ground.batching import next_args
from ..ground.dueline import DueLine
from ..ground.wallclock import WallClock
from ..records import Rec
from ..records.snaprecords import SnapSettled

__all__ = ["Settled"]

_ROW: Final = 6  # fields per entry in a SNAP_SETTLED record's rows
_PER_RECORD: Final = 4096  # entries per SNAP_SETTLED record (each ~60 bytes encoded)
_SWEEP: Final = 512  # entries past their instant dropped per due, at most (then due again)

# handle -> (kind, item id, state, visible_at wall (a retry's backoff end) or None,
#            forget at wall)
_Entry = tuple[str, str, str, float | None, float]


class _Memory:
    """One tenant's remembered settlements, oldest first."""

    __slots__ = ("armed", "entries", "tenant")

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.armed = False  # a due of its own is on the line (exactly while it has entries)
        # An OrderedDict: a dict whose oldest keys were deleted scans their dead slots for
        # its first key (the eviction below), O(n) each (see rsclient/retry.py).
        self.entries: OrderedDict[bytes, _Entry] = OrderedDict()


class Settled:
    __slots__ = ("_by_tenant", "_clock", "_shortest_lease", "limit", "line")

    def __init__(
        self, clock: WallClock, shortest_lease: float,
        limit: int = Policy.MAX_SETTLED_PER_TENANT,
    ) -> None:
        self._clock = clock
        self._shortest_lease = shortest_lease  # a repeat's ``next`` is checked as the first's
        self._by_tenant: dict[str, _Memory] = {}
        self.limit = limit
        self.line = DueLine(clock, self._forget_due)

    def __len__(self) -> int:
        return sum(len(memory.entries) for memory in self._by_tenant.values())

    def remember(
        self, now: float, tenant: str, handle: bytes, kind: str, item_id: str, state: str,
        visible_at: float | None, forget_at: float,
    ) -> None:
        """``handle``'s delivery of ``item_id`` was settled by ``kind``, leaving it in
        ``state``: remember it until the wall-clock instant ``forget_at``. One already
        past (only a replay or a snapshot meets it) is kept only behind an entry, never
        as the oldest: the live memory is swept from its oldest entry, so it holds a
        past entry only behind a living one, and a replay rebuilds just that. O(1)."""
        memory = self._by_tenant.get(tenant)
        if (memory is None or not memory.entries) and not self._clock.after(forget_at, now):
            return
        if memory is None:
            memory = self._by_tenant[tenant] = _Memory(tenant)
        entries = memory.entries
        if handle in entries:
            return  # replayed again
        if len(entries) >= self.limit:
            entries.popitem(last=False)  # the oldest goes first
        entries[handle] = (kind, item_id, state, visible_at, forget_at)
        if not memory.armed:  # one due per tenant, for its oldest entry
            memory.armed = True
            self.line.add(next(iter(entries.values()))[4], memory)

    def answer(
        self, now: float, tenant: str, handle: bytes, kind: str, args: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The reply to a repeat of a recorded settlement, or None when ``handle`` was not
        settled by ``kind`` for ``tenant`` within its lease length."""
        memory = self._by_tenant.get(tenant)
        entry = None if memory is None else memory.entries.get(handle)
        if entry is None or entry[0] != kind or not self._clock.after(entry[4], now):
            return None  # (past its instant: forgotten, swept later)
        _, item_id, state, visible_at, _ = entry
        reply: dict[str, Any] = {"id": item_id, "state": state}
        if kind == "retry":
            reply["retry_in_ms"] = None if visible_at is None else max(
                0, int((visible_at - self._clock.wall(now)) * 1000)
            )
        if args.get("next") is not None:
            # a bad ``next`` is INVALID_ARGUMENT, as on the first
            next_args(args, self._shortest_lease)
            reply["next"] = []
        return reply

    def _forget_due(self, now: float, memory: _Memory) -> None:
        """The oldest entry of ``memory`` came due: drop the oldest entries that are past
        their instant (at most ``_SWEEP``), then be due again for the oldest left."""
        memory.armed = False
        entries, after = memory.entries, self._clock.after
        for _ in range(_SWEEP):
            if not entries:
                break
            handle, entry = next(iter(entries.items()))
            if after(entry[4], now):
                break
            del entries[handle]
        if not entries:
            if self._by_tenant.get(memory.tenant) is memory:
                del self._by_tenant[memory.tenant]
            return
        memory.armed = True
        self.line.add(max(next(iter(entries.values()))[4], self._clock.wall(now)), memory)

    # ---- the snapshot ----------------------------------------------------------------
    # (SNAP_SETTLED, tenant, [handle, kind, item id, state, visible_at, forget_at,
    #  handle, ...]), instants wall clock.

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        for tenant, memory in self._by_tenant.items():
            rows: list[Any] = []
            for handle, entry in memory.entries.items():
                rows.append(handle)
                rows += entry
                if len(rows) >= _PER_RECORD * _ROW:
                    yield SnapSettled(Rec.SNAP_SETTLED, tenant, rows)
                    rows = []
            if rows:
                yield SnapSettled(Rec.SNAP_SETTLED, tenant, rows)

    def rows_of(self, tenant: str, item_ids: set[str] | dict[str, Any]) -> Iterator[SnapSettled]:
        """The SNAP_SETTLED records of ``tenant``'s remembered settlements of the items
        ``item_ids`` (moved runs', transfer.py): a walk over that tenant's memory, at
        most ``limit`` entries whatever else the server holds."""
        memory = self._by_tenant.get(tenant)
        rows: list[Any] = []
        for handle, entry in [] if memory is None else memory.entries.items():
            if entry[1] in item_ids:
                rows.append(handle)
                rows += entry
                if len(rows) >= _PER_RECORD * _ROW:
                    yield SnapSettled(Rec.SNAP_SETTLED, tenant, rows)
                    rows = []
        if rows:
            yield SnapSettled(Rec.SNAP_SETTLED, tenant, rows)

    def apply_snapshot(self, rec: tuple[Any, ...], now: float) -> None:
        _, tenant, rows = rec
        for at in range(0, len(rows), _ROW):
            handle, kind, item_id, state, visible_at, forget_at = rows[at:at + _ROW]
            self.remember(now, tenant, handle, kind, item_id, state, visible_at, forget_at)
