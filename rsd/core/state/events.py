"""The core's named events: where one part's change is another part's business.

A part of the core that changes something others must react to announces it here, once,
by name; it never calls the parts that react, and does not know them. Who hears which
event is wired in one place, ``Core._wire`` (machine.py), so the whole list of
reactions is read there; the parts themselves only depend downwards (a book on the
objects and tables it keeps, never on a book that reacts to it).

The events, who announces each and who hears it:

- ``lease_expired(now, lease, reason)``: a lease ran out without renewal (``reason``
  "expired": ``LeaseTable.expire`` decides it, the one place), or a lease bound to its
  connection lost it ("connection closed": ``LeaseTable.drop_connection``, the one
  place). Heard by the owner of that kind of lease, keyed by the type of
  ``lease.owner``: a claim (claimbook.py), a pool slot (poolbook.py), a delivery of an
  item (settlement.py). Each owner ends the lease its own way and tells the holder
  (``Effects.lease_lost``), the same way for both reasons.
- ``item_ended(now, item)``: a task or message reached a terminal state (endings.py,
  after its FINISHED record). Heard by the groups (groupbook.py): a member's success or
  failure may answer GROUP_WAITs; by the progress book (its outcome to subscribers);
  then by the links (work/parents.py): the tasks after it are let go or cancelled, and
  a cancelled or expired parent's children cancelled.
- ``item_forgotten(item, state)``: a finished task was forgotten (endings.py, after its
  FORGOTTEN record; ``state`` its last). Heard by the groups: a success forgotten
  lowers what a group can still reach.
- ``item_event(item, event)``: a task that has retained events (eventlog.py) moved to
  a state that is not an end (``Work.set_state``, the one place, live and replayed).
  Heard by the progress book (progress.py), which pushes the event to the task's
  subscribers (none in a replay: subscriptions are live only).
- ``capacity_freed(resource)``: a pool or quota has room for blocked items (a slot
  freed with nobody in the pool's line; a quota's line emptied). Announced by poolbook.py
  and quotabook.py, heard by blocked.py.
- ``key_room(gate)``: a concurrency or rate key may let tasks it held back go (a
  delivery of its key ended, its period turned, a newer submit raised its limit).
  Announced by work/keylimits.py, heard by blocked.py.
- ``item_unblocked(now, item)``: an item that waited for capacity can start now
  (blocked.py). Heard by the deliveries (deliveries.py): handed to a parked consumer,
  or put back on its ready line.
- ``queue_ready(now, queue)``: a queue may have items its parked consumers can take
  (blocked.py, the next step of a long run of blocked items). Heard by the deliveries.
- ``run_emptied(scope)``: a run holds nothing now (``Tables.release_scope``). Heard by
  runends.py, which starts its quiet window.
- ``run_cancelled(now, scope)``: a run was cancelled (scopebook.py, after its
  SCOPE_CANCELLED record and the refusal of its parked pool and quota waits). Heard by
  the pools (its slots end), the deliveries (its parked receives are refused), the
  cascade (its claims and tasks end, in slices), the schedules (deleted) and the
  pauses (ended: work/pauses.py), in that order.

Announcing costs a loop over the listeners: nothing is queued, and a listener runs
inside the announcer's call, with the same ``now``, so a live change and its replay see
the same order of effects. The announcers on a request's usual path (``item_ended`` and
``item_forgotten``, once each in every task's life; ``run_emptied``) loop over
``listeners`` themselves, which packs no arguments: the same calls, typed the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Generic, ParamSpec

if TYPE_CHECKING:
    from ..run.items import Item, State
    from ..run.queue import Queue
    from ..run.scope import Scope
    from ..tenant.pool import Pool
    from ..tenant.quota import Quota

__all__ = ["Events", "Signal"]

P = ParamSpec("P")


class Signal(Generic[P]):
    """One named event and its listeners, called in the order they were wired."""

    __slots__ = ("listeners", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.listeners: tuple[Callable[P, None], ...] = ()

    def listen(self, listener: Callable[P, None]) -> None:
        self.listeners = (*self.listeners, listener)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for listener in self.listeners:
            listener(*args, **kwargs)


_SIGNALS: Final = (  # Events' attributes that are signals (all but ``lease_expired``)
    "capacity_freed", "item_ended", "item_event", "item_forgotten", "item_unblocked",
    "key_room", "queue_ready",
    "run_cancelled", "run_emptied",
)


class Events:
    """Every named event of the core (the module docstring says who announces and who
    hears each one)."""

    __slots__ = ("lease_expired", *_SIGNALS)

    def __init__(self) -> None:
        # The owner of each kind of lease, by the type of ``lease.owner``: exactly one.
        self.lease_expired: dict[type, Callable[[float, Any, str], None]] = {}
        self.item_ended: Signal[[float, Item]] = Signal("item_ended")
        self.item_forgotten: Signal[[Item, State]] = Signal("item_forgotten")
        self.item_event: Signal[[Item, dict[str, Any]]] = Signal("item_event")
        self.capacity_freed: Signal[[Pool | Quota]] = Signal("capacity_freed")
        self.key_room: Signal[[Any]] = Signal("key_room")  # a keylimits.Gate
        self.item_unblocked: Signal[[float, Item]] = Signal("item_unblocked")
        self.queue_ready: Signal[[float, Queue]] = Signal("queue_ready")
        self.run_emptied: Signal[[Scope]] = Signal("run_emptied")
        self.run_cancelled: Signal[[float, Scope]] = Signal("run_cancelled")

    def signals(self) -> list[Signal[Any]]:
        """Every signal (not ``lease_expired``, a table by owner type)."""
        return [getattr(self, name) for name in _SIGNALS]  # (compiled: no __slots__)
