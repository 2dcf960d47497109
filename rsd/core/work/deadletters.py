"""Dead letters for an operator (rsctl, the dashboard): list them in any tenant's run,
put them back on their queue, or delete them.

A dead letter is an entry on its queue's bounded list (queue.py: at most
``Limits.MAX_DEAD_LETTERS``, the newest), charged to its tenant's stored bytes on top of
the item it came from. An operator's three answers to one: look (ADMIN_DEAD_LETTERS),
try it again (DEAD_LETTER_REQUEUE: a new item with the same data) or give up on it
(DEAD_LETTER_DELETE: it leaves the list, its bytes go back to the tenant).

What always holds:
- every op here is admin-only and reads the caller's tenant unless it names another
  (adminargs.py), so a tenant's admin token never reaches another tenant's run: it is
  NOT_FOUND, as a missing one;
- a change is records, applied by the same appliers recovery replays: a requeue is the
  new item's ITEM_ENQUEUED, then DEAD_LETTER_REQUEUED; a delete is one
  DEAD_LETTER_DELETED. Each takes the entry off its list and gives its bytes back;
  applying either twice is harmless (the second finds it gone). A snapshot holds the
  entries left (SNAP_DEAD_LETTER), so it agrees with the journal it replaces;
- one request changes at most ``limit`` dead letters (requeue with ``all``), and looks
  at no more than ``MAX_DEAD_LETTERS`` entries;
- a dead letter named by ``id`` that is not on the list is NOT_FOUND, and nothing is
  written; so is a mailbox the run has no queue of.
"""

from __future__ import annotations

from typing import Any

from rsproto import ErrorCode, Limits, Op

from ...policy import Policy
from ..ground.errors import CoreError
from ..ground.payloads import checked_payload
from ..ground.validate import invalid, opt_bool, opt_number, opt_text, req_text
from ..records import Rec
from ..records.itemrecords import DeadLetterDeleted, DeadLetterRequeued, enqueued
from ..run.queue import Queue
from ..run.scope import Scope
from ..state.adminargs import admin_scope, admin_tenant
from ..state.tables import Applier, Handler, Tables
from .deliveries import Deliveries
from .workbook import Work

__all__ = ["DeadLetterBook"]


class DeadLetterBook:
    """ADMIN_DEAD_LETTERS, DEAD_LETTER_REQUEUE, DEAD_LETTER_DELETE and their records.
    Owned by the Core."""

    def __init__(self, tables: Tables, work: Work, deliveries: Deliveries) -> None:
        self.tables = tables
        self.work = work
        self.deliveries = deliveries
        self.ops: dict[int, Handler] = {
            Op.ADMIN_DEAD_LETTERS: self.dead_letters,
            Op.DEAD_LETTER_REQUEUE: self.requeue,
            Op.DEAD_LETTER_DELETE: self.delete,
        }
        self.appliers: dict[int, Applier] = {
            Rec.DEAD_LETTER_REQUEUED: self.apply_requeued,
            Rec.DEAD_LETTER_DELETED: self.apply_deleted,
        }

    # ---- ops -------------------------------------------------------------------------

    def dead_letters(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """DEAD_LETTERS for an admin, in any tenant's run: the same bounded reply."""
        tenant = admin_tenant(self.tables, conn, args, "ADMIN_DEAD_LETTERS")
        scope = admin_scope(self.tables, tenant, args)
        name = req_text(args, "mailbox", Limits.MAX_MAILBOX_NAME_BYTES)
        queue = scope.queues.get(name)
        if queue is None:
            return {"items": [], "truncated": False, "count": 0}
        return {**self.work.dead_letter_page(queue, args), "count": len(queue.dead_letters)}

    def requeue(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """Put dead letters back on their queue as new items (one named by ``id``, or the
        oldest ``limit`` with ``all``); each leaves the dead-letter list."""
        tenant = admin_tenant(self.tables, conn, args, "DEAD_LETTER_REQUEUE")
        scope = admin_scope(self.tables, tenant, args)
        name = req_text(args, "mailbox", Limits.MAX_MAILBOX_NAME_BYTES)
        dead_id = opt_text(args, "id", Limits.MAX_KEY_BYTES)
        every = opt_bool(args, "all", False)
        if (dead_id is None) == (not every):
            raise invalid("name exactly one of id (one dead letter) or all: true")
        limit = int(opt_number(args, "limit", Policy.ADMIN_PAGE_DEFAULT, 1,
                               Policy.ADMIN_PAGE_MAX))
        scope.refuse_if_cancelled()
        queue = scope.queues.get(name)
        if dead_id is not None:
            entries = [_entry(queue, name, dead_id)]
        else:
            entries = list(queue.dead_letters)[:limit] if queue is not None else []
        self.tables.tenants.room(tenant, "items", len(entries))
        requeued = []
        for entry in entries:
            new_id = self._enqueue_again(now, scope, name, entry)
            self.tables.commit(
                DeadLetterRequeued(
                    Rec.DEAD_LETTER_REQUEUED, scope.id, name, entry["id"], new_id, tenant
                ),
                now,
            )
            requeued.append({"id": entry["id"], "new": new_id})
        queue = scope.queues.get(name)
        if queue is not None:
            self.deliveries.dispatch(now, queue)
        left = len(queue.dead_letters) if queue is not None else 0
        return {"requeued": requeued, "left": left}

    def delete(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        """Take the dead letter ``id`` off its list for good (a cancelled run's too:
        deleting adds no work to it)."""
        tenant = admin_tenant(self.tables, conn, args, "DEAD_LETTER_DELETE")
        scope = admin_scope(self.tables, tenant, args)
        name = req_text(args, "mailbox", Limits.MAX_MAILBOX_NAME_BYTES)
        dead_id = req_text(args, "id", Limits.MAX_KEY_BYTES)
        _entry(scope.queues.get(name), name, dead_id)
        self.tables.commit(
            DeadLetterDeleted(Rec.DEAD_LETTER_DELETED, scope.id, name, dead_id, tenant), now
        )
        queue = scope.queues.get(name)  # (freed if that was all it held)
        return {"deleted": dead_id, "left": len(queue.dead_letters) if queue is not None else 0}

    def _enqueue_again(self, now: float, scope: Scope, name: str, entry: dict[str, Any]) -> str:
        """The ITEM_ENQUEUED of a dead letter's new item: same kind and data, attempt 1.
        A task keeps its key unless another task has taken it since (then it has none);
        a message loses its work_key (it would be deduplicated against itself)."""
        is_message = entry["kind"] == "message"
        data = entry["data"]
        key = None
        digest = None
        if not is_message:
            digest = checked_payload("data", data, salt=name)
            holder = scope.tasks.get(entry["key"]) if entry["key"] is not None else None
            if entry["key"] is not None and (holder is None or holder.id == entry["id"]):
                key = entry["key"]
        new_id = self.work.new_id("m" if is_message else "t", scope.tenant)
        self.tables.commit(enqueued(
            item_id=new_id, is_message=is_message, scope_id=scope.id, mailbox=name, key=key,
            digest=digest, data=data, created_wall=self.tables.wall(now), deadline_wall=None,
            tenant=scope.tenant,
        ), now)
        return new_id

    # ---- records -----------------------------------------------------------------------

    def apply_requeued(self, rec: DeadLetterRequeued, now: float) -> None:
        _, scope_id, mailbox, dead_id, _new_id, tenant = rec
        self._take_off(tenant, scope_id, mailbox, dead_id)

    def apply_deleted(self, rec: DeadLetterDeleted, now: float) -> None:
        _, scope_id, mailbox, dead_id, tenant = rec
        self._take_off(tenant, scope_id, mailbox, dead_id)

    def _take_off(self, tenant: str, scope_id: str, mailbox: str, dead_id: str) -> None:
        """Dead letter ``dead_id`` leaves its list, its bytes go back to its tenant, and
        its queue is freed if that was all it held. Nothing if it is gone already."""
        queue = self.work.find_queue(tenant, scope_id, mailbox)
        if queue is None or dead_id not in queue.dead_ids:
            return  # replayed again: already off the list
        self.tables.tenants.charge(tenant, -queue.drop_dead_letter(dead_id))
        self.work.release(tenant, scope_id, mailbox)


def _entry(queue: Queue | None, name: str, dead_id: str) -> dict[str, Any]:
    """The dead letter ``dead_id`` of ``queue`` (NOT_FOUND if it is not on the list)."""
    if queue is not None and dead_id in queue.dead_ids:
        for entry in queue.dead_letters:  # at most Limits.MAX_DEAD_LETTERS entries
            if entry["id"] == dead_id:
                return entry
    raise CoreError(ErrorCode.NOT_FOUND, f"no dead letter {dead_id!r} in mailbox {name!r}")
