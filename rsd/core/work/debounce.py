"""Debounced messages: a send with a ``debounce_key`` collapses into the message of its
queue that still waits with that key, and that message goes out once its window passes
with no new send.

How it works. A MESSAGE_SEND with ``debounce_key`` and ``debounce_seconds`` (the window)
looks the key up in its queue's ``debounced`` index (queue.py):
- no message holds it: a new message is made DELAYED, due at now + the window (its
  ITEM_ENQUEUED, with that ``not_before``), and holds the key (DEBOUNCE_KEYED right
  after); answered ``replaced`` false. The first send waits out its window too: the
  point of a debounce is to act once on a burst, after it has gone quiet (Inngest's
  debounce does the same; a BullMQ "debounce" job is delayed by its own ``delay``);
- a message holds it: the send replaces that message's data and moves its due instant
  to now + the window (ITEM_DEBOUNCED), answered with its id and ``replaced`` true;
  nothing new is made. A DELAYED message keeps its timer: the timer fires at the old
  instant, sees the new one (``Deliveries.visible_due``) and waits again, so a send
  costs O(1) and a message has one timer however many sends it takes (a send with a
  shorter window, due before that timer, arms one more). A message
  already due (PENDING: in its ready line, not yet delivered, because no worker was
  free) goes back to DELAYED until the new instant (Event.DEBOUNCE): it leaves its
  ready line the way an ending item does (a stale entry, skipped), and a new Item
  object with the same id takes its place, so that the stale entry (the old object)
  can never be taken for a queued one.
The key is held until its message is delivered or ends (``Queue.let_go``, from the
DELIVERED and FINISHED appliers): the next send with it starts a new message. So the
index never holds more than the queue's live items, each already counted against its
tenant's item limit: it needs no bound of its own.

What always holds:
- ``debounce_key`` and ``debounce_seconds`` come together; the window is more than 0
  and at most ``Limits.MAX_DEBOUNCE_SECONDS``; the key at most ``Limits.MAX_KEY_BYTES``;
- a debounced send has no ``work_key`` (dedupe and debounce answer a repeat in
  opposite ways: the first send, or the newest), no ``needs`` (a due message waiting
  for capacity sits in a pool's line, which this move does not touch), and no
  ``delay_ms`` / ``not_before`` (the window is its delay): each INVALID_ARGUMENT; a task
  is never debounced (TASK_SUBMIT with either field is INVALID_ARGUMENT);
- a replacing send states the priority and fairness key of the message it replaces
  (they place it in its line): other ones are IDEMPOTENCY_CONFLICT, details ``{"id"}``;
- the index is rebuilt by the same records live, in replay and from a snapshot (a
  DEBOUNCE_KEYED per entry, after the items).
"""

from __future__ import annotations

from typing import Any, Final

from rsproto import ErrorCode, Limits

from ..ground.errors import CoreError
from ..ground.itemorder import Order
from ..ground.payloads import stored_size
from ..ground.validate import check_number, invalid, opt_text
from ..records import Rec
from ..records.itemrecords import DebounceKeyed, ItemDebounced
from ..run.items import Event, Item, State, transition
from ..run.queue import Queue
from ..state.tables import Applier, Handler, Tables
from .deliveries import Deliveries
from .workbook import Work

__all__ = ["Debounce", "refuse_debounce"]

_MAX_SECONDS: Final = Limits.MAX_DEBOUNCE_SECONDS


def refuse_debounce(args: dict[str, Any]) -> None:
    """TASK_SUBMIT: a task is not debounced (INVALID_ARGUMENT). Two lookups."""
    if args.get("debounce_key") is not None or args.get("debounce_seconds") is not None:
        raise invalid(
            "debounce_key and debounce_seconds are for MESSAGE_SEND; a task is not "
            "debounced (a task key makes one task of many submits)"
        )


class Debounce:
    """The debounce index's records and a debounced send's checks. Owned by Intake
    (which takes its appliers as its own)."""

    def __init__(self, tables: Tables, work: Work, deliveries: Deliveries) -> None:
        self.tables = tables
        self.work = work
        self.deliveries = deliveries
        self.ops: dict[int, Handler] = {}
        self.appliers: dict[int, Applier] = {
            Rec.DEBOUNCE_KEYED: self.apply_keyed,
            Rec.ITEM_DEBOUNCED: self.apply_debounced,
        }

    @staticmethod
    def args(args: dict[str, Any]) -> tuple[str, float] | None:
        """The (debounce key, window in seconds) a MESSAGE_SEND asks for, None for a
        plain send (two lookups); INVALID_ARGUMENT naming the field for anything wrong,
        and for the fields a debounced send may not have."""
        get = args.get
        seconds = get("debounce_seconds")
        if get("debounce_key") is None and seconds is None:
            return None
        key = opt_text(args, "debounce_key", Limits.MAX_KEY_BYTES)
        if key is None or seconds is None:
            raise invalid("debounce_key and debounce_seconds go together: give both or neither")
        seconds = check_number(seconds, "debounce_seconds", 0, _MAX_SECONDS)
        if seconds <= 0:
            raise invalid(
                f"debounce_seconds must be more than 0 (the window a message waits for "
                f"more sends), at most {_MAX_SECONDS}, got {seconds!r}"
            )
        if get("work_key") is not None:
            raise invalid(
                "give work_key or debounce_key, not both: a work key keeps the first send "
                "of a burst, a debounce key the newest"
            )
        if get("needs") is not None:
            raise invalid("a debounced send may not have needs")
        if get("delay_ms") is not None or get("not_before") is not None:
            raise invalid(
                "a debounced send may not have delay_ms or not_before: debounce_seconds "
                "is its delay"
            )
        return key, float(seconds)

    def hold(self, now: float, item: Item, key: str) -> None:
        """The new message ``item`` holds ``key`` in its queue (DEBOUNCE_KEYED)."""
        self.tables.commit(DebounceKeyed(Rec.DEBOUNCE_KEYED, item.id, key), now)

    def replace(
        self, now: float, waiting: Item, data: Any, size: int, due: float, order: Order
    ) -> dict[str, Any]:
        """A send with the key ``waiting`` holds: its data becomes ``data`` (``size``
        stored bytes) and it is due at ``due`` (ITEM_DEBOUNCED). O(1) but for the
        record's encoding."""
        if waiting.priority != order.priority or waiting.fairness_key != order.fairness_key:
            raise CoreError(
                ErrorCode.IDEMPOTENCY_CONFLICT,
                f"debounce key {waiting.debounce_key!r} is held by a waiting message of "
                "another priority or fairness key; send with the same ones, or another key",
                {"id": waiting.id},
            )
        self.tables.tenants.room_for_bytes(waiting.tenant, max(0, size - waiting.size))
        self.tables.commit(ItemDebounced(Rec.ITEM_DEBOUNCED, waiting.id, data, size, due), now)
        return {"id": waiting.id, "replay": False, "replaced": True}

    # ---- appliers ----------------------------------------------------------------------

    def apply_keyed(self, rec: DebounceKeyed, now: float) -> None:
        """DEBOUNCE_KEYED: an undelivered message takes its key (replayed again, or
        after its delivery or ending, it changes nothing)."""
        _, item_id, key = rec
        item = self.work.items.get(item_id)
        if (
            item is None or not item.is_message or item.terminal or item.attempt
            or item.delivery is not None or item.debounce_key is not None
        ):
            return
        item.debounce_key = key
        self.work.queue_of_item(item).debounced[key] = item

    def apply_debounced(self, rec: ItemDebounced, now: float) -> None:
        """ITEM_DEBOUNCED: the message holding its key takes the new data and due
        instant; one already due goes back to DELAYED (as a new object: see above).
        Applied again, it sets the same values."""
        _, item_id, data, size, due = rec
        item = self.work.items.get(item_id)
        if item is None or item.debounce_key is None:
            return  # delivered or ended since (never so live: the send found it holding)
        if size < 0:
            size = stored_size(data)
        earlier = False  # due before the instant its timer waits for: a timer of its own
        if item.state is State.PENDING:
            item = self._delay_again(item, due)
        else:
            earlier = due < item.visible_at
        self.tables.tenants.charge(item.tenant, size - item.size)
        item.size = size
        item.data = data
        item.visible_at = due  # (its not_before stays the delay it was made with: itemorder.py)
        if earlier:
            self.deliveries.due_at(item)

    def _delay_again(self, old: Item, due: float) -> Item:
        """``old`` (PENDING, never delivered, in its ready line) goes back to DELAYED
        until ``due``: a new Item with its id and fields takes its place everywhere it
        is known (the item table, its run's live items and admin index, the debounce
        index), and ``old`` leaves its ready line as an ended item does (a stale
        entry)."""
        work = self.work
        queue: Queue = work.queue_of_item(old)
        new = Item(
            old.tenant, old.id, old.is_message, old.scope, old.mailbox, old.key, old.digest,
            old.data, old.created_at, old.deadline, due, old.priority, old.fairness_key,
        )
        new.size = old.size
        queue.drop(old)
        work.set_state(old, transition(old.state, Event.DEBOUNCE))  # the counts move
        assert old.state is new.state
        work.items[new.id] = new
        key = old.debounce_key
        assert key is not None
        old.debounce_key = None
        new.debounce_key = key
        queue.debounced[key] = new
        scope = self.tables.find_scope(old.tenant, old.scope)
        if scope is not None:
            scope.live_items[new.id] = new
            if scope.item_pages is not None:
                scope.item_pages.removed()  # old's entry is no longer alive
            work.index_item(new, scope)
        work.delay(new, queue)
        self.deliveries.due_at(new)
        return new
