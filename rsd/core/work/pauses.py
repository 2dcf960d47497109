"""Pausing a mailbox: for every run of its tenant (MAILBOX_PAUSE) or in one run
(QUEUE_PAUSE), and resuming it.

What always holds:
- a paused queue (``Queue.held``) takes submits and sends, and items come due in it,
  but it hands nothing out: a receive gets nothing (or parks), parked receives stay
  parked, a settlement's ``next`` takes nothing; deliveries already running finish as
  usual (complete, retry, reject, renew);
- the pause is a record (MAILBOX_PAUSED), in snapshots and in a moved run's records,
  so it outlives a restart and a takeover; pausing what is paused, or resuming what is
  not, writes nothing;
- the cost is O(1) per request: a paused queue is skipped by one flag, read where a
  delivery chooses (``Blocked.pop``); a resume serves the queues that have parked
  receives (``Depth.parked``, kept while paused; a queue freed leaves it, so receives
  that come and go on a long pause leave nothing behind), never a walk over the runs;
- a mailbox paused for every run goes to every shard, as its declaration does
  (sdkrules ROUTE); a pause in one run goes to the run's shard. Either needs the mailbox
  ensured (NOT_FOUND otherwise); a queue paused in its run keeps its run until resumed
  or cancelled (its cancellation ends its pauses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rsproto import ErrorCode, Limits, Op

from ..ground.errors import CoreError
from ..ground.validate import opt_bool, req_text
from ..records import MailboxPaused, Rec
from ..run.queue import Queue
from ..run.scope import Scope
from ..state.tables import Applier, Handler, Tables

if TYPE_CHECKING:
    from .workbook import Work

__all__ = ["Pauses"]


class Pauses:
    """MAILBOX_PAUSE, QUEUE_PAUSE and their record. Owned by the Core."""

    def __init__(self, tables: Tables, work: Work) -> None:
        self.tables = tables
        self.work = work
        self.ops: dict[int, Handler] = {
            Op.MAILBOX_PAUSE: self.pause_mailbox, Op.QUEUE_PAUSE: self.pause_queue,
        }
        self.appliers: dict[int, Applier] = {Rec.MAILBOX_PAUSED: self.apply_paused}

    def pause_mailbox(
        self, now: float, conn: int, rid: int, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Pause (``paused``, the default) or resume the mailbox ``name`` in every run."""
        name = req_text(args, "name", Limits.MAX_MAILBOX_NAME_BYTES)
        paused = opt_bool(args, "paused", True)
        tenant = self.tables.tenant_of(conn)
        box = self.work.mailboxes.get((tenant, name))
        if box is None:
            raise CoreError(
                ErrorCode.NOT_FOUND,
                f"mailbox {name!r} does not exist; create it with mailboxes.ensure first",
            )
        depth = box.depth
        if depth.paused != paused:
            self.tables.commit(MailboxPaused(Rec.MAILBOX_PAUSED, name, tenant, None, paused), now)
            if not paused:
                parked, depth.parked = depth.parked, {}
                for queue in parked:
                    self._serve(now, queue)
        return box.view()

    def pause_queue(
        self, now: float, conn: int, rid: int, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Pause (``paused``, the default) or resume the mailbox ``mailbox`` in the run
        ``scope`` alone; its QUEUE_INSPECT counts are the answer."""
        paused = opt_bool(args, "paused", True)
        tenant, scope_id, name, scope, queue = self.work.to_change(conn, args)
        if (queue is not None and queue.paused) != paused:
            self.tables.commit(
                MailboxPaused(Rec.MAILBOX_PAUSED, name, tenant, scope_id, paused), now
            )
            queue = scope.queues.get(name)
            if queue is not None:
                self._serve(now, queue)
            self.work.release_in(scope, name)
            queue = scope.queues.get(name)
        if queue is None:
            queue = Queue(tenant, scope_id, name, self.work.mailboxes[(tenant, name)].depth)
        return queue.counts()

    def run_cancelled(self, now: float, scope: Scope) -> None:
        """``run_cancelled``: the run's pauses end (a cancelled run delivers nothing
        anyway, and a queue kept by its pause would keep the run). O(its queues)."""
        for queue in list(scope.queues.values()):
            if queue.paused:
                self.tables.commit(MailboxPaused(
                    Rec.MAILBOX_PAUSED, queue.mailbox, scope.tenant, scope.id, False), now)

    def _serve(self, now: float, queue: Queue) -> None:
        """A resumed queue's parked receives are served at once (if it is still held,
        by the other pause, it is kept among its mailbox's parked queues)."""
        if queue.consumers:
            self.tables.events.queue_ready(now, queue)

    def apply_paused(self, rec: MailboxPaused, now: float) -> None:
        _, name, tenant, scope_id, paused = rec
        work = self.work
        tenant = self.tables.tenants.name(tenant)
        if scope_id is None:
            box = work.mailboxes.get((tenant, name))
            if box is not None:  # (ensured before: its record comes first)
                box.depth.paused = paused
            return
        scope = self.tables.scope_for(tenant, scope_id)
        if paused:
            work.queue_of(scope, name).paused = True
            return
        queue = scope.queues.get(name)
        if queue is not None:
            queue.paused = False
            work.release_in(scope, name)
