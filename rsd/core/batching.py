"""Fewer round trips: the args and reply shapes of batched receives and settle-and-next.

What always holds:
- ``max`` on RECEIVE (and in a settlement's ``next``) is an integer from 1 to
  ``Limits.MAX_RECEIVE_BATCH``; without it a RECEIVE answers ``{"delivery": d | nil}``
  exactly as before, with it ``{"deliveries": [...]}`` (possibly empty);
- a batch never holds more than ``max`` deliveries, and stops before the data of its
  deliveries would pass ``Limits.MAX_RECEIVE_BATCH_BYTES`` in total (the first is always
  given: one payload fits a frame), so a batched reply always fits a frame;
- ``next`` on DELIVERY_COMPLETE / RETRY / REJECT is a map (``lease_seconds``, ``max``),
  checked before the settlement changes anything; it never parks.
The taking itself is ``Deliveries.take``: one rule for receive, dispatch and next.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rsproto import Limits

from .errors import CoreError
from .validate import int_arg, invalid, lease_seconds

if TYPE_CHECKING:
    from .deliveries import Deliveries
    from .items import Event, Item
    from .tables import Handler

__all__ = ["NextArgs", "batch_reply", "next_args", "receive_max", "settle_and_next"]

NextArgs = tuple[float, int]  # (lease_seconds, max) of a settlement's next receive
# complete, retry or reject of the item a live delivery lease names: (now, item, args)
Settle = Callable[[float, "Item", dict[str, Any]], dict[str, Any]]


def receive_max(args: dict[str, Any]) -> int | None:
    """RECEIVE's ``max``: None when absent (the single-delivery reply), else 1..limit."""
    if args.get("max") is None:
        return None
    return int_arg(args, "max", 1, Limits.MAX_RECEIVE_BATCH)


def next_args(args: dict[str, Any], value: Any = None) -> NextArgs | None:
    """A settlement's ``next`` (``value``, when the caller has read it): None when
    absent or nil, else its (lease_seconds, max)."""
    if value is None:
        value = args.get("next")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"next must be a map (lease_seconds, max) or nil, got {_name(value)}")
    try:
        return lease_seconds(value), receive_max(value) or 1
    except CoreError as exc:  # name the field as the client sees it
        raise invalid(f"next.{exc.message}") from None


def batch_reply(many: int | None, taken: list[dict[str, Any]]) -> dict[str, Any]:
    """RECEIVE's reply: the old single form without ``max``, the list form with it."""
    if many is None:
        return {"delivery": taken[0] if taken else None}
    return {"deliveries": taken}


def _name(value: object) -> str:
    return "nil" if value is None else type(value).__name__


def settle_and_next(deliveries: Deliveries, settle: Settle, kind: Event) -> Handler:
    """The handler of a settlement ``settle`` of the item under the request's live
    delivery lease (looked up once), which may also ask for the next deliveries of the
    same queue (``next``): checked before anything changes, taken after the settlement
    (and the dispatch it caused) from what is ready while no receive is parked on the
    queue. A repeat of a settlement of ``kind`` already recorded is answered as the first
    (``Settlement.repeated``)."""

    def handler(now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        try:
            item = deliveries.settled_item(conn, args)  # a stale lease is STALE_CLAIM first
        except CoreError as refusal:
            return deliveries.repeated(now, conn, args, kind, refusal)
        value = args.get("next")
        if value is None:
            return settle(now, item, args)
        wanted = next_args(args, value)
        assert wanted is not None
        tenant, scope, mailbox, run = item.tenant, item.scope, item.mailbox, item.run
        reply = settle(now, item, args)
        # A task's run is the table's while the task is known (runends.py): its queue is
        # found there; a message's run is looked up.
        queue = (
            run.queues.get(mailbox) if run is not None
            else deliveries.work.find_queue(tenant, scope, mailbox)
        )
        taken: list[dict[str, Any]] = []
        if queue is not None and not queue.consumers:  # parked receives go first
            holder = deliveries.tables.holders.get(conn, "")
            taken = deliveries.take(now, conn, holder, wanted[0], queue, None, wanted[1])
        reply["next"] = taken
        return reply

    return handler
