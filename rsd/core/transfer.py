"""Moving runs to another shard with their slots: the core half of a slot move (issue 32).

A slot move of slots that hold runs goes, in the shell (the wiring comes next):
pause the slots on the source (requests for them held, as SLOTS_MOVE does today) →
``export(lo, hi)`` on the source → send the record to the target → ``take_in`` on the
target (journaled, fsynced and replicated like any batch, before its answer) → switch
the map by compare-and-swap → the source drops the runs and answers MOVED for them.

The form of the state: the snapshot records (snaprecords.py) of exactly the moved runs,
in the order a snapshot writes them, inside one RUNS_IMPORTED record, so the target
journals the whole move in one record (a crash keeps all of it or none) and replays it,
on a restart or a standby, through the very appliers recovery uses.

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
  until it is under again.
"""

from __future__ import annotations

from typing import Any

from rsproto import ErrorCode

from .ground.errors import CoreError
from .ground.ids import item_number
from .ground.leases import NO_CONN
from .holds.claimbook import ClaimBook
from .records import Rec, read
from .records.itemrecords import GroupJoined
from .records.snaprecords import RunsImported
from .run.items import QUEUED_FIELDS
from .run.scope import Scope
from .runs.schedulebook import run_schedules
from .runs.scopebook import scope_record
from .state.tables import Applier, Handler, Tables
from .work.settled import Settled
from .work.workbook import Work

__all__ = ["Transfer"]

_ITEM_KINDS = (Rec.SNAP_ITEM, Rec.SNAP_QUEUED)


class Transfer:
    """Export, import (RUNS_IMPORTED) of runs moved between shards. Owned by the Core."""

    def __init__(self, tables: Tables, work: Work, claims: ClaimBook, settled: Settled) -> None:
        self.tables = tables
        self.work = work
        self.claims = claims
        self.settled = settled
        self.looked_at = 0  # runs ``export`` looked at, all calls (tests count its work)
        self.ops: dict[int, Handler] = {}
        self.appliers: dict[int, Applier] = {Rec.RUNS_IMPORTED: self.apply_imported}

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

    def export(self, lo: int, hi: int) -> RunsImported:
        """The RUNS_IMPORTED record that recreates the runs of slots ``lo..hi`` on
        another shard (see the module docstring). Changes nothing; the shell calls it
        with the slots paused, so nothing changes them until they are dropped."""
        records: list[Any] = []
        tenants: dict[str, set[str]] = {}
        for scope in self.runs_in(lo, hi):
            self.looked_at += 1
            self._refuse_capacity(scope)
            item_ids = tenants.setdefault(scope.tenant, set())
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
        for tenant, item_ids in tenants.items():
            records.extend(self.settled.rows_of(tenant, item_ids))
        ids = self.tables.ids
        leases = self.tables.leases.ids
        return RunsImported(
            Rec.RUNS_IMPORTED, max(ids.generation_floor, ids.jumped_to),
            {tenant: leases.peek(tenant) for tenant in tenants}, records,
        )

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
        runs = sum(1 for r in records if r[0] == Rec.SNAP_SCOPE)
        return {"runs": runs, "records": len(records)}

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


def _collision(what: str) -> None:
    raise CoreError(ErrorCode.INVALID_ARGUMENT, f"cannot import the runs: {what}")


def _items_of(scope: Scope) -> list[Any]:
    pages = scope.item_pages
    return [] if pages is None else pages.live()

