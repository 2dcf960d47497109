"""Moving runs to another shard with their slots: the core half of a slot move (issue 32).

A slot move of slots that hold runs goes, in the shell (the wiring comes next):
pause the slots on the source (requests for them held, as SLOTS_MOVE does today) →
``Core.answer_moved_waits`` (every wait on them answered MOVED, so that nothing the
source's timers do to them until the drop grants or delivers anything to anyone) →
``Core.export_slots(lo, hi)`` on the source → send the records to the target →
``Core.import_runs`` on the target (journaled, fsynced and replicated like any batch,
before its answer) → switch the map by compare-and-swap → ``Core.drop_slots`` on the
source (its waits on them answered MOVED, one RUNS_DROPPED record), and the shell
answers MOVED for them from then on. A move that fails before the switch leaves the
source as it was (nothing was changed there); the target then holds a copy nobody
routes to, which it must drop (``drop_slots`` on the target) before the slots are
offered to it again: an import refuses runs it has.

The form of the state: the snapshot records (snaprecords.py) of exactly the moved runs,
in the order a snapshot writes them, inside RUNS_IMPORTED records of at most
``PART_BYTES`` each (a journal frame holds at most 8 MiB), imported in order; the
target journals each part as one record (a crash keeps all of a part or none of it)
and replays it, on a restart or a standby, through the very appliers recovery uses. A
move cut short between parts leaves the target a part of the runs, which nobody routes
to (the map has not switched): it is dropped before the move is tried again.

What always holds:
- ``export`` looks only at the moved runs: it finds them by their slots
  (``Tables.runs_by_slot``, kept in a sharded cluster: one CRC-32 and one dict insert
  per run made, one delete per run freed) and walks each one's own state (claims, items
  through its admin index, queues, groups, schedules); it never walks every run or
  every item. The one walk beyond them is over the remembered settlements of the moved
  runs' tenants (settled.py), bounded by ``Policy.MAX_SETTLED_PER_TENANT`` each;
- what moves: the runs (created, cancelled, quiet since), held claims with their
  handles and generations, every item the server knows of them (ready lines in order,
  deliveries in flight with their lease handles, delays, priorities, fairness keys,
  backoffs, results within retention, tombstones), dedupe entries, dead letters, group
  memberships, schedules, remembered settlements, and the declarations of the mailboxes
  their queues use (a mailbox the target declares already keeps the target's settings:
  a declaration is valid on every shard, and the first on a shard holds);
- what does not move: waits. A wait belongs to a connection, and the connection is to
  the source: the source answers each of them MOVED when it drops the runs, and the
  SDK sends it again to the target (a claim wait, a result wait, a receive or a group
  wait is a read until it is granted, so sending it again is safe). Pool slots and
  tasks that need capacity do not move either: pools and quotas have one home each, so
  ``export`` refuses runs that hold slots or have unfinished items with needs
  (moving pools with their slots is a step of its own);
- on the target nothing of its own changes: ``take_in`` refuses, before changing
  anything, a run it already has, an item id it already knows, a lease handle live on
  it (item ids do not meet across shards: each shard counts in namespaces of its own,
  ids.py); its counters then move above everything imported: each imported item id is
  taken in its namespace's counter, each tenant's lease counter goes to the source's,
  and the generation floor and the jump floor to the source's highest, so every grant
  of a moved key after the move is above every grant of it before (the slot's epoch
  carried as a number, not folded into the token: a handle passes only while it is a
  live lease of the shard, and only the moved live leases are);
- timers are re-armed from the records: a moved lease gets one full lease from the
  import, as after a restart (its holder keeps it by renewing on the target); delays,
  retention, dedupe windows, quiet windows and schedules keep their wall-clock instants.
  A lease that ends with its connection (``release_on_disconnect``) ends at the import:
  its connection was to the source;
- a tenant over its runs limit on the target once the runs arrive keeps them (they were
  admitted on the source; refusing would strand the move): only new runs are refused
  until it is under again;
- a drop takes everything of the runs out through the appliers that take each part
  out on its own (schedule deleted, lease ended, dedupe expired, dead letter deleted,
  item finished, tombstoned and forgotten, the run freed), applied by the one
  RUNS_DROPPED record, so a replay or a standby does the very same, and every count,
  index and line stays exact: the source then holds what a core that never had them
  would hold (but for its counters and generation floor, which only grow, and the
  remembered settlements and forwarded handles, which lapse within a lease length).
  Nothing is granted by it: the waits were answered MOVED before the record. O(the
  runs' state). The same applier remembers the runs' live leases as forwarded for a
  lease length (ground/forwarded.py; in snapshots as SNAP_FORWARDED): their holders,
  renewing or settling them here, are answered MOVED and take them to the new shard,
  instead of STALE_CLAIM.
"""

from __future__ import annotations

from typing import Any, Final

from rsproto import ErrorCode

from .ground.errors import CoreError
from .ground.ids import item_number
from .ground.leases import NO_CONN, LeaseBase
from .ground.payloads import encode
from .holds.claimbook import ClaimBook
from .records import LeaseEnded, MailboxPaused, Rec, ScheduleDeleted, read
from .records.itemrecords import (
    DeadLetterDeleted,
    DedupeExpired,
    Finished,
    Forgotten,
    GroupJoined,
    Tombstoned,
)
from .records.snaprecords import RunsDropped, RunsImported, SnapForwarded
from .run.items import QUEUED_FIELDS, State
from .run.scope import Scope
from .runs.cascade import Cascade
from .runs.schedulebook import run_schedules
from .runs.scopebook import scope_record
from .state.tables import Applier, Handler, Tables
from .work.settled import Settled
from .work.tasks import ResultWait
from .work.workbook import Work

__all__ = ["DROPPED_PER_RECORD", "FORWARDED_PER_RECORD", "PART_BYTES", "Transfer"]

_ITEM_KINDS: Final = (Rec.SNAP_ITEM, Rec.SNAP_QUEUED)
# A RUNS_IMPORTED record holds at most about this many encoded bytes of records: half
# the largest frame a journal file may hold (logfile.MAX_RECORD_BYTES, 8 MiB), as
# SNAP_QUEUED's bound (items.py). A bigger move is several records, imported in order.
PART_BYTES: Final = 4 << 20
# Runs named by one RUNS_DROPPED record: a run id and a tenant name are at most 128
# bytes each (Limits.MAX_SCOPE_ID_BYTES, MAX_TENANT_BYTES), so a record stays under
# 3 MiB. A drop of more runs is several records, each of them whole.
DROPPED_PER_RECORD = 10_000
# Forwarded handles per SNAP_FORWARDED record: a handle (16 bytes), a length, a tenant
# and a run id (128 bytes each at most): under 2.5 MiB.
FORWARDED_PER_RECORD: Final = 8192
_MOVED: Final = "moved to another shard"  # the reason of what a drop ends
_CANCELLED: Final = State.CANCELLED.value


class Transfer:
    """Export, import (RUNS_IMPORTED) and drop (RUNS_DROPPED) of runs moved between
    shards. Owned by the Core."""

    def __init__(
        self, tables: Tables, work: Work, claims: ClaimBook, settled: Settled,
        cascade: Cascade,
    ) -> None:
        self.tables = tables
        self.work = work
        self.claims = claims
        self.settled = settled
        self.cascade = cascade
        self.looked_at = 0  # runs ``export`` looked at, all calls (tests count its work)
        self.ops: dict[int, Handler] = {}
        self.appliers: dict[int, Applier] = {
            Rec.RUNS_IMPORTED: self.apply_imported,
            Rec.RUNS_DROPPED: self.apply_dropped,
            Rec.SNAP_FORWARDED: self.apply_forwarded,
        }

    # ---- the source ------------------------------------------------------------------

    def runs_in(self, lo: int, hi: int) -> list[Scope]:
        """The runs whose slot is in ``lo..hi``: O(slots in the range + its runs)."""
        by_slot = self.tables.runs_by_slot
        if not self.tables.slot_count:
            raise CoreError(ErrorCode.INVALID_ARGUMENT,
                            "runs are kept by slot only in a sharded cluster")
        if hi - lo + 1 > len(by_slot):  # fewer slots hold runs than the range has
            slots = [slot for slot in by_slot if lo <= slot <= hi]
            slots.sort()
        else:
            slots = [slot for slot in range(lo, hi + 1) if slot in by_slot]
        return [scope for slot in slots for scope in by_slot[slot].values()]

    def export(self, lo: int, hi: int, part_bytes: int = 0) -> list[RunsImported]:
        """The RUNS_IMPORTED records that recreate the runs of slots ``lo..hi`` on
        another shard (see the module docstring), in order, each at most
        ``part_bytes`` (``PART_BYTES`` if 0 or above it) encoded, but for a single
        record larger than that. Changes nothing; the shell calls it with the slots
        paused."""
        records: list[Any] = []
        tenants: dict[str, set[str]] = {}
        for scope in self.runs_in(lo, hi):
            self.looked_at += 1
            self._refuse_capacity(scope)
            self._run_records(scope, records, tenants.setdefault(scope.tenant, set()))
        for tenant, item_ids in tenants.items():
            records.extend(self.settled.rows_of(tenant, item_ids))
        ids = self.tables.ids
        floor = max(ids.generation_floor, ids.jumped_to)
        leases = {tenant: self.tables.leases.ids.peek(tenant) for tenant in tenants}
        budget = min(part_bytes, PART_BYTES) if part_bytes > 0 else PART_BYTES
        return [RunsImported(Rec.RUNS_IMPORTED, floor, leases, part)
                for part in _parts(records, budget)]

    def _run_records(self, scope: Scope, records: list[Any], item_ids: set[str]) -> None:
        """Append ``scope``'s records to ``records``, its items' ids to ``item_ids``."""
        records.append(scope_record(scope))
        records.extend(self.claims.run_snapshot(scope))
        for rec in self.work.run_snapshot(scope):
            records.append(rec)
            if rec[0] == Rec.SNAP_ITEM:
                item_ids.add(rec[1])
            elif rec[0] == Rec.SNAP_QUEUED:
                item_ids.update(rec[4][::QUEUED_FIELDS])
        records.extend(
            GroupJoined(Rec.GROUP_JOINED, item.id, item.group.name)
            for item in _items_of(scope) if item.group is not None
        )
        records.extend(run_schedules(scope))

    @staticmethod
    def _refuse_capacity(scope: Scope) -> None:
        """Pools and quotas stay home: a run holding pool slots, or with unfinished
        items that need capacity, does not move (yet)."""
        needy = any(item.needs is not None for item in scope.live_items.values())
        if scope.slots or needy:
            raise CoreError(
                ErrorCode.INVALID_ARGUMENT,
                f"run {scope.id!r} holds pool slots or tasks that need capacity; moving "
                "them needs their pools and quotas to move too, which comes later",
                {"scope": scope.id},
            )

    # ---- the target ------------------------------------------------------------------

    def take_in(self, rec: Any, now: float) -> dict[str, int]:
        """Import a RUNS_IMPORTED record (``export``'s, as received: a list is fine):
        refused whole, before any change, if it would meet anything of this core's;
        else committed as one record, durable before the reply whatever the fsync
        policy. ``{"runs": N, "records": M}``."""
        rec = read(list(rec))
        if rec[0] != Rec.RUNS_IMPORTED:
            raise CoreError(ErrorCode.INVALID_ARGUMENT, "not a RUNS_IMPORTED record")
        records = rec[3]
        self._refuse_collisions(records)
        tables = self.tables
        tables.effects.sync = True
        tables.commit(RunsImported(Rec.RUNS_IMPORTED, rec[1], dict(rec[2]), list(records)),
                      now)
        leases = tables.leases
        if NO_CONN in leases.bound_by_conn:  # their connections were to the source
            leases.drop_connection(NO_CONN, now)
        runs = [tables.scopes[(r[4], r[1])] for r in records if r[0] == Rec.SNAP_SCOPE]
        self.cascade.resume(now, runs)  # a run moved in the middle of its cancellation
        return {"runs": len(runs), "records": len(records)}

    def _refuse_collisions(self, records: list[Any]) -> None:
        scopes, items = self.tables.scopes, self.work.items
        live = self.tables.leases.live
        for r in records:
            kind = r[0]
            if kind == Rec.SNAP_SCOPE and (r[4], r[1]) in scopes:
                _collision(f"run {r[1]!r} is on this shard already")
            elif kind == Rec.SNAP_CLAIM and r[4] in live:
                _collision(f"the lease of claim {r[2]!r} of run {r[1]!r} is live here")
            elif kind == Rec.SNAP_ITEM:
                if r[1] in items:
                    _collision(f"item {r[1]!r} is on this shard already")
                if r[19] is not None and r[19][0] in live:
                    _collision(f"the delivery lease of item {r[1]!r} is live here")
            elif kind == Rec.SNAP_QUEUED:
                for item_id in r[4][::QUEUED_FIELDS]:
                    if item_id in items:
                        _collision(f"item {item_id!r} is on this shard already")

    def apply_imported(self, rec: RunsImported, now: float) -> None:
        """RUNS_IMPORTED: the floors first, then each record as recovery applies it."""
        _, floor, leases, records = rec
        tables = self.tables
        ids = tables.ids
        ids.generation_floor = max(ids.generation_floor, floor)
        ids.jumped_to = max(ids.jumped_to, floor)
        for tenant, number in leases.items():
            tables.leases.ids.took(tenant, number - 1)
        item_ids = self.work.item_ids
        mailboxes = self.work.mailboxes
        appliers = tables.appliers
        for r in records:
            r = read(r)
            kind = r[0]
            if kind == Rec.MAILBOX_ENSURED and (r[5], r[1]) in mailboxes:
                continue  # declared here: the target's settings hold
            if kind in _ITEM_KINDS:
                for item_id in [r[1]] if kind == Rec.SNAP_ITEM else r[4][::QUEUED_FIELDS]:
                    item_ids.took(*item_number(item_id))
            appliers[kind](tuple(r), now)


    # ---- the source, once the map has switched ---------------------------------------

    def drop(self, lo: int, hi: int, now: float, details: dict[str, Any] | None) -> int:
        """The runs of slots ``lo..hi`` leave this core (their new shard holds them and
        the map says so): each wait on them is answered MOVED (``details``: the shell's,
        the new owner and the map epoch), then one RUNS_DROPPED record takes everything
        of them out. How many runs left. O(their state)."""
        runs = self.runs_in(lo, hi)
        for scope in runs:
            self._answer_waits(scope, details)  # (none left if answered at the pause)
        for at in range(0, len(runs), DROPPED_PER_RECORD):
            part = runs[at:at + DROPPED_PER_RECORD]
            self.tables.commit(
                RunsDropped(Rec.RUNS_DROPPED, [[s.tenant, s.id] for s in part]), now
            )
        return len(runs)

    def answer_waits(self, lo: int, hi: int, details: dict[str, Any] | None) -> int:
        """Every wait on the runs of slots ``lo..hi`` answered MOVED (the shell calls it
        once it has paused the slots, before ``export``): from then on nothing the
        source's timers do to those runs (an expiry, a delay's end) grants or delivers
        anything to anyone. How many runs."""
        runs = self.runs_in(lo, hi)
        for scope in runs:
            self._answer_waits(scope, details)
        return len(runs)

    def _answer_waits(self, scope: Scope, details: dict[str, Any] | None) -> None:
        """Every wait naming ``scope`` (claims, receives, results, groups, pools and
        quotas) answered MOVED: it was not granted, and the SDK sends it again to the
        run's new shard."""
        waits: list[Any] = list(scope.parked)
        for claim in scope.claims.values():
            waits.extend(claim.waiters)
        for queue in scope.queues.values():
            waits.extend(queue.consumers)
        for group in scope.groups.values():
            for line in group.waiters.values():
                waits.extend(line)
        for item in scope.live_items.values():
            watchers = item.watchers  # (), one ResultWait, or a WaitLine (tasks.py)
            waits.extend(watchers if type(watchers) is not ResultWait else (watchers,))
        end = self.tables.waits.end
        message = f"run {scope.id!r} moved to another shard: send the request there"
        for wait in waits:
            end(wait, ErrorCode.MOVED, message, details)

    def apply_dropped(self, rec: RunsDropped, now: float) -> None:
        """RUNS_DROPPED: each run's live leases remembered as forwarded (forwarded.py:
        their holders are answered MOVED, not STALE_CLAIM, for a lease length), then
        its state taken out through the appliers that take each part out (so every
        count, index and line stays exact), then the run itself."""
        forwarded: list[tuple[bytes, float, str, str]] = []
        for tenant, scope_id in rec[1]:
            scope = self.tables.scopes.get((tenant, scope_id))
            if scope is not None:
                forwarded.extend(self._live_leases(scope))
                self._drop_run(scope, now)
        if forwarded:
            self.tables.forwarded.forward(now, forwarded)

    def forwarded_snapshot(self) -> list[SnapForwarded]:
        """The forwarded handles (ground/forwarded.py) as SNAP_FORWARDED records, each
        of at most ``FORWARDED_PER_RECORD`` entries (none when there are none)."""
        rows = self.tables.forwarded.rows()
        step = 4 * FORWARDED_PER_RECORD
        return [SnapForwarded(Rec.SNAP_FORWARDED, rows[at:at + step])
                for at in range(0, len(rows), step)]

    def apply_forwarded(self, rec: SnapForwarded, now: float) -> None:
        """SNAP_FORWARDED: the forwarded handles a snapshot kept, each for its lease's
        length from ``now``, as a restored lease."""
        rows = rec[1]
        self.tables.forwarded.forward(now, [
            (rows[at], rows[at + 1], rows[at + 2], rows[at + 3])
            for at in range(0, len(rows), 4)
        ])

    def _live_leases(self, scope: Scope) -> list[tuple[bytes, float, str, str]]:
        """``(handle, length, tenant, run id)`` of the run's live leases: its held claims'
        and its deliveries in flight."""
        live = self.tables.leases.live
        leases: list[LeaseBase] = [
            claim for claim in scope.claims.values()
            if claim.handle is not None and live.get(claim.handle) is claim
        ]
        leases.extend(item.delivery for item in scope.live_items.values()
                      if item.delivery is not None and live.get(item.delivery.handle)
                      is item.delivery)
        return [(lease.handle, lease.length, scope.tenant, scope.id) for lease in leases]

    def _drop_run(self, scope: Scope, now: float) -> None:
        self.cascade.forget(scope)
        apply = self.tables.appliers
        tenant, run = scope.tenant, scope.id
        for name in list(scope.schedules):
            apply[Rec.SCHEDULE_DELETED](
                ScheduleDeleted(Rec.SCHEDULE_DELETED, tenant, run, name, _MOVED), now)
        for claim in list(scope.claims.values()):
            if claim.handle is not None:
                apply[Rec.LEASE_ENDED](LeaseEnded(Rec.LEASE_ENDED, claim.handle, _MOVED), now)
        for queue in list(scope.queues.values()):
            for key, (item_id, _, _) in list(queue.dedupe.items()):
                apply[Rec.DEDUPE_EXPIRED](DedupeExpired(
                    Rec.DEDUPE_EXPIRED, run, queue.mailbox, key, item_id, tenant), now)
            for dead in list(queue.dead_letters):
                apply[Rec.DEAD_LETTER_DELETED](DeadLetterDeleted(
                    Rec.DEAD_LETTER_DELETED, run, queue.mailbox, dead["id"], tenant), now)
            if queue.paused:  # the pause went with the run (its MAILBOX_PAUSED)
                apply[Rec.MAILBOX_PAUSED](MailboxPaused(
                    Rec.MAILBOX_PAUSED, queue.mailbox, tenant, run, False), now)
        wall = self.tables.wall(now)
        for item in _items_of(scope):
            if not item.terminal:
                apply[Rec.FINISHED](Finished(
                    Rec.FINISHED, item.id, _CANCELLED, None, _MOVED, wall, False), now)
            if not item.tombstoned:
                apply[Rec.TOMBSTONED](Tombstoned(Rec.TOMBSTONED, item.id), now)
            apply[Rec.FORGOTTEN](Forgotten(Rec.FORGOTTEN, item.id), now)
        for name in list(scope.queues):
            self.work.release_in(scope, name)
        scope.groups.clear()  # their members are gone; their waiters were answered
        for claim in list(scope.claims.values()):
            claim.waiters = ()  # (live: answered; on replay there are none)
            self.claims.free(claim)
        # Slots of this shard's pools stay with the pool, tied to their leases alone (a
        # slot granted to the run while a copy of it was here: poolbook.py's notes).
        scope.slots.clear()
        assert scope.holds_nothing(), f"run {run!r} still holds something after its drop"
        self.tables.drop_scope(scope)


def _parts(records: list[Any], budget: int) -> list[list[Any]]:
    """``records`` cut, in order, into parts of at most ``budget`` encoded bytes each
    (one part at least, so an empty move is still one record); a SNAP_QUEUED record
    over the budget is first cut into several of the same line (``_cut``)."""
    parts: list[list[Any]] = [[]]
    size = 0
    for whole in records:
        for rec, length in _cut(whole, len(encode(whole)), budget):
            if parts[-1] and size + length > budget:
                parts.append([])
                size = 0
            parts[-1].append(rec)
            size += length
    return parts


def _cut(rec: Any, length: int, budget: int) -> list[tuple[Any, int]]:
    """``rec`` (``length`` bytes encoded) as records of at most ``budget`` bytes where
    it can be cut, each with its length: a SNAP_QUEUED record (up to sixteen ready
    items, up to 4 MiB: more than a 1 MiB client frame of a move between primaries
    takes) halved, in line order, until each half fits or holds one item; any other
    record as it is (one item's record is bounded by the payload limits)."""
    count = len(rec[4]) // QUEUED_FIELDS if rec[0] == Rec.SNAP_QUEUED else 1
    if length <= budget or count < 2:
        return [(rec, length)]
    half = count // 2 * QUEUED_FIELDS
    first, second = rec._replace(rows=rec[4][:half]), rec._replace(rows=rec[4][half:])
    return [*_cut(first, len(encode(first)), budget),
            *_cut(second, len(encode(second)), budget)]


def _collision(what: str) -> None:
    raise CoreError(ErrorCode.INVALID_ARGUMENT, f"cannot import the runs: {what}")


def _items_of(scope: Scope) -> list[Any]:
    pages = scope.item_pages
    return [] if pages is None else pages.live()

