"""The Core: all state of rsd and every rule, as a pure deterministic state machine.

The server calls ``handle(now, conn, request_id, op, args)`` for each request,
``tick(now)`` when ``next_deadline()`` is reached, and ``connected`` / ``disconnected``
as connections come and go (``connected`` says the connection's tenant and whether it
has admin rights; see tenants.py). The randomness of lease handles comes from the
``random_bytes`` callable the shell passes, like scope ids from ``new_scope_id``.
Each call returns a reply value (or raises CoreError, or
returns DEFERRED) and leaves journal records and messages for other connections in
``effects``. ``now`` is monotonic seconds from the caller; the core never reads a clock,
never does I/O, and given the same calls produces the same state and effects.

The Core owns the books (scopes, claims, mailboxes, intake, deliveries, settlement,
endings, tasks, groups, pools, quotas, fencing, admin, dead letters) and one ``Tables``
they all share. Each book lists its ops (``(now, conn, rid, args)``) and its record
appliers (``(rec, now)``);
the Core merges them into one op table and one applier table, which ``Tables.commit``
(live changes) and ``apply`` (recovery) both use. LEASE_RENEW, the hot path, is
renewals.py's. Books are made bottom up, each given only the books below it; where a
part must react to another's change, it hears a named event (events.py), and who hears
which is wired here, in ``_wire``, the one place. What the Core keeps for itself: CANCEL
of a wait, LEASE_RESIZED, what follows every request and tick (``_settle``), and the
snapshot's order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, Final

from mypy_extensions import mypyc_attr

from rsproto import ErrorCode, Limits, Op
from rsproto.slots import DEFAULT_SHARD

from ..policy import Policy
from .admin import AdminBook
from .ground.effects import DEFERRED
from .ground.errors import CoreError
from .ground.leases import NO_CONN, Lease
from .ground.tenants import DEFAULT_TENANT, TenantLimits, Tenants, Usage
from .ground.validate import req_id
from .holds.claimbook import ClaimBook
from .holds.fencing import Fencing
from .holds.poolbook import PoolBook
from .holds.quotabook import QuotaBook
from .holds.renewals import RENEWED_ONE, Renewals
from .idbook import IdBook
from .intake import Intake
from .records import LeaseResized, Rec
from .run.claim import Claim
from .run.items import Item
from .runs.cascade import Cascade
from .runs.groupbook import GroupBook
from .runs.runends import RunEnds
from .runs.schedulebook import ScheduleBook
from .runs.scopebook import ScopeBook
from .state.tables import Applier, Book, Handler, Tables
from .streamat import StreamMark
from .tenant.pool import Slot
from .transfer import Transfer
from .work.blocked import Blocked
from .work.deadletters import DeadLetterBook
from .work.deliveries import Deliveries
from .work.endings import Endings
from .work.mailboxbook import MailboxBook
from .work.parents import Parents
from .work.progress import Progress
from .work.settled import Settled
from .work.settlement import Settlement
from .work.tasks import Tasks
from .work.waiting import Waiting
from .work.workbook import Work

__all__ = [
    "DEFAULT_DEDUPE_SECONDS",
    "DEFAULT_RETENTION_SECONDS",
    "DEFAULT_TOMBSTONE_SECONDS",
    "DEFERRED",
    "RENEWED_ONE",
    "Core",
]

_RENEW: Final = int(Op.LEASE_RENEW)
_FIRED_PER_TICK: Final = Policy.MAX_FIRED_PER_TICK

DEFAULT_RETENTION_SECONDS: Final = Policy.RETENTION_SECONDS
DEFAULT_DEDUPE_SECONDS: Final = Policy.DEDUPE_SECONDS
DEFAULT_TOMBSTONE_SECONDS: Final = Policy.TOMBSTONE_SECONDS


def _ignore(rec: tuple[Any, ...], now: float) -> None:
    """CLEAN_SHUTDOWN: read by recovery itself; nothing to apply."""


@mypyc_attr(allow_interpreted_subclasses=True)  # tests/support/core.py: CoreDriver
class Core:
    def __init__(
        self,
        new_scope_id: Callable[[], str],
        wall_offset: float = 0.0,
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        dedupe_seconds: float = DEFAULT_DEDUPE_SECONDS,
        tombstone_seconds: float = DEFAULT_TOMBSTONE_SECONDS,
        run_retention_seconds: float = Policy.RUN_RETENTION_SECONDS,
        random_bytes: Callable[[int], bytes] | None = None,
        tenant_limits: TenantLimits | None = None,
        min_lease_seconds: float = Limits.MIN_LEASE_SECONDS,
        progress_rate: int | None = None,
    ) -> None:
        self.tenants = Tenants(tenant_limits or TenantLimits())
        tables = self.tables = Tables(
            wall_offset, Policy.MAX_WAITS_PER_CONNECTION, self.tenants,
            random_bytes or os.urandom, min_lease_seconds,
        )
        self._name_tables(tables)
        # The books, bottom up: each is given only what is below it.
        self.work = Work(tables, retention_seconds, dedupe_seconds, tombstone_seconds)
        self.claims = ClaimBook(tables)
        self.pools = PoolBook(tables)
        self.quotas = QuotaBook(tables)
        self.mailboxes = MailboxBook(tables, self.work)
        self.run_ends = RunEnds(tables, run_retention_seconds)
        self.scope_book = ScopeBook(tables, new_scope_id, self.run_ends)
        self.fencing = Fencing(tables, self.ids)
        self.settled = Settled(tables.clock, tables.min_lease_seconds)
        self.blocked = Blocked(tables, self.work, self.pools, self.quotas)
        self.deliveries = Deliveries(tables, self.work, self.blocked)
        self.endings = Endings(tables, self.work, self.deliveries, self.settled)
        self.settlement = Settlement(tables, self.work, self.deliveries, self.endings, self.settled)
        self.tasks = Tasks(tables, self.work, self.endings)
        self.waiting = Waiting(
            tables, self.work, self.deliveries, self.settlement, self.settled, self.tasks
        )
        # (``progress_rate``: raised in rsd's own tests and bench: --test-progress-rate)
        self.progress = Progress(
            tables, self.work, self.settlement, self.tasks,
            progress_rate or Limits.PROGRESS_EVENTS_PER_SECOND,
        )
        self.cascade = Cascade(tables, self.claims, self.endings, self.deliveries)
        self.groups = GroupBook(tables, self.work, self.cascade)
        self.parents = Parents(tables, self.work, self.deliveries, self.endings, self.tasks)
        self.intake = Intake(
            tables, self.work, self.deliveries, self.endings, self.tasks, self.blocked,
            self.groups, self.parents,
        )
        self.schedules = ScheduleBook(tables, self.work, self.deliveries)
        self.admin = AdminBook(tables, self.work, self.pools, self.quotas, self.mailboxes)
        self.dead_letters = DeadLetterBook(tables, self.work, self.deliveries)
        self.id_book = IdBook(tables, self.work, self.claims, self.pools)
        self.stream_mark = StreamMark(tables)
        self.transfer = Transfer(tables, self.work, self.claims, self.settled, self.cascade)
        self._wire()
        self._ops: dict[int, Handler] = self._route()
        # Recovery applies records through the very table ``commit`` uses.
        self.apply: Applier = tables.apply

    def _name_tables(self, tables: Tables) -> None:
        """The tables the shell and the tests reach by name on the machine itself."""
        self.effects = tables.effects
        self.wheel = tables.wheel
        self.leases = tables.leases
        # LEASE_RENEW, for ``handle`` and the shell's frame loop (one call less a frame)
        self.lease_renew = Renewals(tables, self.leases, self.tenants.by_conn).renew
        self.scopes = tables.scopes
        self.holders = tables.holders
        self.waits = tables.waits
        self.ids = tables.ids

    def _route(self) -> dict[int, Handler]:
        """Each book's ops and record appliers, gathered once: the ops (``handle``'s
        table) returned, the appliers put into the tables' (``commit``'s and recovery's).
        No op or record kind has two."""
        books: tuple[Book, ...] = (
            self.scope_book, self.claims, self.mailboxes, self.work, self.intake,
            self.deliveries, self.settlement, self.endings, self.tasks, self.waiting, self.pools,
            self.quotas, self.fencing, self.blocked, self.groups, self.admin, self.dead_letters,
            self.run_ends, self.id_book, self.stream_mark, self.schedules, self.transfer,
            self.progress, self.parents,
        )
        ops: dict[int, Handler] = {
            Op.LEASE_RENEW: self.lease_renew,
            Op.CANCEL: self._cancel,
        }
        appliers: dict[int, Applier] = {
            Rec.LEASE_RESIZED: self._apply_resized,
            Rec.CLEAN_SHUTDOWN: _ignore,
        }
        for book in books:
            for op in book.ops:
                assert op not in ops, f"two handlers for op {op}"
            ops.update(book.ops)
            for kind in book.appliers:
                assert kind not in appliers, f"two appliers for record {kind}"
            appliers.update(book.appliers)
        self.tables.appliers.update(appliers)
        # The books that apply their own records natively (``Tables.record``) apply them
        # with the applier the table holds for the kind, which recovery replays with.
        assert appliers[Rec.ITEM_ENQUEUED] == self.intake.apply_enqueued
        assert appliers[Rec.DELIVERED] == self.deliveries.apply_delivered
        assert appliers[Rec.FINISHED] == self.endings.apply_finished
        # Keyed by plain ints, as a request's op arrives: an Op member as the key made
        # each lookup compare an enum with an int (about 250 instructions, not 60).
        return {int(op): handler for op, handler in ops.items()}

    def _wire(self) -> None:
        """Who hears which named event (events.py): the one place of every reaction of
        one part to another's change."""
        events = self.tables.events
        # A lease that expired goes to the owner of its kind.
        events.lease_expired[Claim] = self.claims.expired
        events.lease_expired[Slot] = self.pools.expired
        events.lease_expired[Item] = self.settlement.expired
        events.item_ended.listen(self.groups.ended)
        events.item_ended.listen(self.progress.ended)  # the outcome, last, to subscribers
        # then the ends it brings to its dependents and children (their own outcomes)
        events.item_ended.listen(self.parents.ended)
        events.item_event.listen(self.progress.published)
        events.item_forgotten.listen(self.groups.forgotten)
        events.capacity_freed.listen(self.blocked.room_made)
        events.key_room.listen(self.blocked.gate_opened)
        events.item_unblocked.listen(self.deliveries.offer)
        events.queue_ready.listen(self.deliveries.dispatch)
        events.run_emptied.listen(self.run_ends.run_emptied)
        # In this order: slots go to the pools' other waiters, parked receives are
        # refused, then claims and tasks end (the first slice now, cascade.py).
        events.run_cancelled.listen(self.pools.run_cancelled)
        events.run_cancelled.listen(self.deliveries.run_cancelled)
        events.run_cancelled.listen(self.cascade.start)
        events.run_cancelled.listen(self.schedules.run_cancelled)
        events.run_cancelled.listen(self.mailboxes.pauses.run_cancelled)

    # ---- the shell's entry points ---------------------------------------------------

    def handles(self, op: int) -> bool:
        return op in self._ops

    def handle(self, now: float, conn: int, rid: int, op: Any, args: dict[str, Any]) -> Any:
        """Run one request. Raises CoreError to refuse it; DEFERRED: reply comes later.
        ``op`` is checked here (UNKNOWN_OP), not by its type: compiled code would raise."""
        if op == _RENEW and type(op) is int:
            return self.lease_renew(now, conn, rid, args)  # the hot path: allocates no ids
        handler = self._ops.get(op) if isinstance(op, int) and type(op) is not bool else None
        if handler is None:
            raise CoreError(ErrorCode.UNKNOWN_OP, f"unknown op {op!r}")
        try:
            return handler(now, conn, rid, args)
        finally:
            self._settle(now)

    def _settle(self, now: float) -> None:
        """After a request or a tick: serve what freed capacity let go, start the quiet
        windows of runs left empty, reserve the next ids if a counter needs them."""
        blocked = self.blocked
        if blocked.freed or blocked.room:  # slots ended, or a pool or quota has room
            blocked.wake(now)
        if self.run_ends.emptied:  # runs that hold nothing now: their quiet window
            self.run_ends.arm(now)
        self.id_book.reserve_if_due(now)

    def connected(
        self, conn: int, holder: str, *, tenant: str = DEFAULT_TENANT, admin: bool = True
    ) -> None:
        """A connection said HELLO: everything it makes belongs to ``tenant``; ``admin``
        lets it use the admin-only ops."""
        self.holders[conn] = holder
        self.tenants.connect(conn, tenant, admin)

    def disconnected(self, conn: int, now: float | None = None) -> None:
        """Waits and event subscriptions die with their connection; leases do not (the
        holder may reconnect), but for those granted on it with
        ``release_on_disconnect``: they end now, as if
        they expired (``LeaseTable.drop_connection``), after every request it sent that
        ran (its settlements among them), and after its waits, so none of them is
        granted what they free. ``now`` is needed only by a connection that holds such
        leases (the shell always passes it). Calling it twice is harmless."""
        self.waits.drop_connection(conn)
        if self.progress.by_conn:
            self.progress.drop_connection(conn)
        if conn in self.leases.bound_by_conn:
            assert now is not None, "a connection with bound leases ends at an instant"
            self.leases.drop_connection(conn, now)
            self._settle(now)
        self.holders.pop(conn, None)
        self.tenants.disconnect(conn)

    def is_admin(self, conn: int) -> bool:
        """Whether ``conn`` may use the admin-only ops (the shell's SERVER_STATS asks)."""
        return self.tenants.is_admin(conn)

    def next_deadline(self) -> float | None:
        if self.run_ends.emptied:  # a connection's end emptied a run: arm it at once
            return 0.0  # before any now the shell passes
        return self.wheel.next_deadline()

    def tick(self, now: float) -> None:
        """Fire what is due by ``now``, including what firing makes due (a tombstone
        whose forgetting is already past, after a long pause), in deadline order, at most
        ``Policy.MAX_FIRED_PER_TICK`` entries per call: a mass expiry at one instant is
        fired over several calls, so the shell's loop serves others in between. What is
        left stays due, in order, on the wheel: ``next_deadline()`` is then not after
        ``now``, and the next call goes on with it."""
        if self.run_ends.emptied:  # a connection's end emptied a run (next_deadline)
            self.run_ends.arm(now)
        budget = _FIRED_PER_TICK
        due = self.wheel.pop_due(now, budget)
        if not due:
            return
        expire = self.leases.expire
        while due:
            for item in due:
                kind = type(item)
                if kind is Claim or kind is Lease:  # a lease's entry: is it over? (leases.py)
                    expire(item, now)
                else:
                    fired = item.fire(now)  # a line of dues (dueline.py, waits.py) fires
                    if fired:  # several at once: each counts in the budget
                        budget -= fired - 1
            budget -= len(due)
            if budget <= 0:
                break  # bounded: what is still due is fired at the next tick, at once
            due = self.wheel.pop_due(now, budget)
        self._settle(now)

    def recovered(self, now: float, clean: bool) -> None:
        """Called once after recovery (or a takeover: ``promoted``), before serving. Ends
        the leases bound to a connection (``release_on_disconnect``: theirs is gone),
        jumps the counters after a crash, and records as created every run an older
        journal made by first use."""
        # Leases bound to a connection end: every connection is gone (a replayed lease
        # is bound to ``NO_CONN``). Ended before the jump, as the ended grants' records
        # are older than it.
        if NO_CONN in self.leases.bound_by_conn:
            self.leases.drop_connection(NO_CONN, now)
            self._settle(now)
        if not clean:
            self.id_book.jump(now)
        self.scope_book.keep_runs_made_by_use(now)
        self.cascade.resume(now)
        self.parents.resume(now, clean)  # tasks after tasks a torn tail left behind
        self.run_ends.arm(now)  # runs left holding nothing: their quiet windows
        self.id_book.reserve(now)

    def promoted(self, now: float) -> None:
        """A standby takes over as primary (follower.py): every live lease gets one full
        lease from ``now``, as after a restart, so holders that reconnect keep their
        claims, slots and deliveries; then what ``recovered`` does after an unclean stop:
        ids and generations jump past anything the old primary may have granted without
        this core recording it. O(live leases), once per takeover."""
        for lease in self.leases.all():
            lease.renewed_at = now  # its wheel entry, if earlier, re-arms when it comes due
        self.recovered(now, False)

    def reserve_ids_from(self, floor: int) -> None:
        """After a repair: move the id ceilings to at least ``floor`` (a record)."""
        self.id_book.reserve_from(floor)

    # ---- needs of another shard (work/grants.py) ------------------------------------

    def grant_held(self, now: float, item_id: str, seq: int, handle: bytes,
                   length: float) -> bool:
        """The other shard granted ask ``seq`` of ``item_id`` (lease ``handle``, renewed
        for ``length`` seconds): journaled, and the item offered to its queue. False: the
        answer is stale (the item ended, or the ask was answered already); the shell then
        releases ``handle`` on that shard."""
        try:
            return self.blocked.granted(now, item_id, seq, handle, length)
        finally:
            self._settle(now)

    def grant_abandoned(self, now: float, item_id: str, seq: int) -> bool:
        """Ask ``seq`` of ``item_id`` will never be granted (the other shard had it
        already and no grant came): GRANT_ENDED, and the item asks for the next."""
        try:
            return self.blocked.abandoned(now, item_id, seq)
        finally:
            self._settle(now)

    def grant_lapsed(self, now: float, handle: bytes) -> None:
        """The grant ``handle`` lapsed on its shard (its renewal was answered
        STALE_CLAIM): the delivery it allows ends as a lost lease does (the item back on
        its queue, or dead-lettered on its last attempt); an item not yet delivered asks
        again. Nothing for a grant no item holds."""
        item = self.blocked.grants.item_of(handle)
        if item is None:
            return
        try:
            if item.delivery is not None:
                self.settlement.expired(now, item.delivery, "grant lapsed")
            else:
                self.blocked.grants.lapsed(now, item)
                queue = self.work.find_queue(item.tenant, item.scope, item.mailbox)
                if queue is not None:
                    self.deliveries.dispatch(now, queue)
        finally:
            self._settle(now)

    # ---- slot moves (transfer.py) ---------------------------------------------------

    def serve_shard(self, name: str, slots: int) -> None:
        """This core serves shard ``name`` of a cluster of ``slots`` slots: its new item
        ids count in the shard's own namespaces (ids.py; the default shard keeps today's
        ids, so an existing cluster's ids do not change and still differ from every named
        shard's), and its runs are kept by slot so a move finds them (one walk over the
        runs now). Called once, before serving."""
        self.work.item_ids.shard = "" if name == DEFAULT_SHARD else f"@{name}"
        self.tables.index_slots(slots)

    def runs_of_leases(self, handles: list[Any]) -> list[str]:
        """The runs of the live leases ``handles`` name (a claim's run, a delivered
        item's, a pool slot's); anything else names none. While slots move, the shell
        holds a request naming a lease of a moving run (batches.py). O(len(handles))."""
        live = self.tables.leases.live
        runs = []
        for handle in handles:
            lease = live.get(handle) if type(handle) is bytes else None
            if lease is not None:
                runs.append(lease.owner.scope)  # type: ignore[attr-defined]
        return runs

    def runs_in_slots(self, lo: int, hi: int) -> int:
        """How many runs slots ``lo..hi`` hold (SLOTS_MOVE's question)."""
        return len(self.transfer.runs_in(lo, hi))

    def answer_moved_waits(
        self, now: float, lo: int, hi: int, details: dict[str, Any] | None = None
    ) -> int:
        """Slots ``lo..hi`` are paused for a move: every wait on their runs is answered
        MOVED (with the shell's ``details``), before their export. How many runs."""
        try:
            return self.transfer.answer_waits(lo, hi, details)
        finally:
            self._settle(now)

    def export_slots(self, lo: int, hi: int, part_bytes: int = 0) -> list[Any]:
        """The RUNS_IMPORTED records of slots ``lo..hi``'s runs, for their new shard
        (each imported there in order, by ``import_runs``), each at most ``part_bytes``
        encoded (0: transfer.PART_BYTES, 4 MiB, the most a journal frame takes well;
        less for a channel of smaller frames)."""
        return self.transfer.export(lo, hi, part_bytes)

    def import_runs(self, now: float, rec: Any) -> dict[str, int]:
        """Take in one part of the runs another shard exported (its ``export_slots``): one
        record, durable before the reply. CoreError, and nothing changed, if any of it
        meets this core's state."""
        try:
            return self.transfer.take_in(rec, now)
        finally:
            self._settle(now)

    def drop_slots(
        self, now: float, lo: int, hi: int, details: dict[str, Any] | None = None
    ) -> int:
        """Slots ``lo..hi`` belong to another shard now: their runs' waits are answered
        MOVED (with the shell's ``details``) and their state leaves this core in one
        RUNS_DROPPED record. How many runs left."""
        try:
            return self.transfer.drop(lo, hi, now, details)
        finally:
            self._settle(now)

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        """Records that rebuild the whole live state (for a snapshot file)."""
        yield from self.id_book.snapshot()  # first: every counter in place before the rest
        yield from self.scope_book.snapshot()
        yield from self.claims.snapshot()
        yield from self.pools.snapshot()
        yield from self.quotas.snapshot()
        yield from self.work.snapshot()
        yield from self.blocked.grants.snapshot()  # after the items they belong to
        yield from self.settled.snapshot()
        yield from self.groups.snapshot()
        yield from self.schedules.snapshot()
        yield from self.transfer.forwarded_snapshot()
        yield from self.stream_mark.snapshot()

    def wall(self, now: float) -> float:
        return self.tables.wall(now)

    # ---- records the Core keeps ------------------------------------------------------

    def _apply_resized(self, rec: LeaseResized, now: float) -> None:
        # (LEASE_RESIZED, handle, seconds)
        lease = self.leases.get(rec[1])
        if lease is not None:
            self.leases.renew(lease, now, rec[2], lease.conn)

    # ---- ops -------------------------------------------------------------------------

    def _cancel(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        return {"cancelled": self.waits.cancel(conn, req_id(args, "request"))}

    # ---- introspection ---------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Sizes of the tables. O(1): every figure is a length or a counter kept up to
        date, never a walk, so asking costs the same whatever the server holds."""
        return {
            "scopes": len(self.scopes),
            "claims": self.claims.count,
            "leases": len(self.leases),
            "items": len(self.work.items),
            "mailboxes": len(self.work.mailboxes),
            "queues": self.work.queue_count,
            "waits": self.waits.total(),
            # wheel entries, each line of dues counted by its entries (not as one)
            "timers": len(self.wheel) + self.waits.deadlines.extra_timers()
            + self.endings.retained.extra_timers() + self.endings.tombstones.extra_timers()
            + self.run_ends.extra_timers() + self.settled.line.extra_timers(),
            "pools": len(self.pools.pools),
            "quotas": len(self.quotas.quotas),
            "schedules": self.schedules.count,
            "tenants": len(self.tenants.usage),
        }

    def tenant_usage(self, tenant: str) -> dict[str, int]:
        """One tenant's counts (runs, claims, items, waits, mailboxes). O(1)."""
        usage = self.tenants.usage.get(tenant)
        return usage.view() if usage is not None else Usage().view()


