"""Waiting: a task that waits for a signal without holding a worker (DELIVERY_SUSPEND,
TASK_SIGNAL), and its timeout.

What always holds:
- a suspend settles the task's delivery as the other settlements do, fenced by its
  lease (anyone else, or a lost lease: STALE_CLAIM, nothing changes; a repeat of a
  recorded one is answered as the first: settled.py), but spends no attempt: the task
  is WAITING for the signal it names, its lease has ended and its worker is free. Only
  a task suspends (a message has no ticket to signal it: INVALID_ARGUMENT);
- a signal names a task by run and id (another tenant's, another run's, a message:
  NOT_FOUND). A task WAITING for that name is woken: PENDING, at the end of its ready
  line (its priority's and fairness key's lane), and each of its deliveries from then
  on carries the signal (``{"name", "data"}``) until it suspends again. A task not yet
  waiting (DELAYED, PENDING, RUNNING) keeps the signal, and a later suspend on that
  name takes the oldest kept one at once: a signal sent before the suspend is never
  lost. Refused, with nothing kept: a signal to a task that has ended
  (INVALID_ARGUMENT, its state in the details: no later wait can take it), one to a
  task WAITING for another name (INVALID_ARGUMENT naming the name it waits for: the
  task has said what it waits for, so another name is a sender's mistake, caught when
  it is made rather than kept unseen), a bad name, data over MAX_SIGNAL_DATA_BYTES, a
  task holding MAX_SIGNALS_KEPT kept signals (RESOURCE_EXHAUSTED), and data past the
  tenant's stored bytes (RESOURCE_EXHAUSTED): kept and carried signal data is charged
  to the tenant like any payload until the task ends;
- a wait ends by its timeout (at most MAX_SUSPEND_SECONDS, the default too): PENDING,
  its deliveries carrying no signal. The timeout is the item's ``visible_at``, on the
  timer wheel as a backoff's end is (one entry per waiting task, taken back when a
  signal or the task's end comes first: O(1), whatever else the server holds);
- cancelling, a deadline and its run's cancellation end a WAITING task as they end a
  PENDING one (endings.py; the TRANSITIONS rows); groups and result waits count it as
  unfinished;
- every change is a record (SUSPENDED, SIGNALLED, WAIT_TIMED_OUT; SNAP_SIGNALS in
  snapshots and a moved run's records) applied by the appliers here, live and in
  replay alike; each carries the count it makes (a signal's ``seq``, a wait's
  number), so a record replayed over a state that holds it changes nothing.
Signals are sent again by no SDK after a lost connection (rsproto/sdkrules.py: a
second one could wake a later wait); a suspend is a settlement and is.
"""

from __future__ import annotations

from typing import Any, Final

from rsproto import ErrorCode, Limits, Op

from ..ground.errors import CoreError
from ..ground.payloads import measured_payload, stored_size
from ..ground.validate import invalid, opt_number, req_text
from ..records import Rec
from ..records.itemrecords import Signalled, Suspended, WaitTimedOut
from ..records.snaprecords import SnapSignals
from ..run.items import Event, Item, State, transition
from ..run.signals import Signal, Signals
from ..run.tally import tally
from ..state.tables import Applier, Handler, Tables
from .deliveries import Deliveries
from .settled import Settled
from .settlement import Settlement
from .tasks import Tasks
from .workbook import Work

__all__ = ["Waiting"]

_SUSPEND: Final = Event.SUSPEND.value
_WAITING: Final = State.WAITING


class Waiting:
    """DELIVERY_SUSPEND, TASK_SIGNAL and their records. Owned by the Core."""

    def __init__(
        self, tables: Tables, work: Work, deliveries: Deliveries, settlement: Settlement,
        settled: Settled, tasks: Tasks,
    ) -> None:
        self.tables = tables
        self.work = work
        self.deliveries = deliveries
        self.settlement = settlement
        self.settled = settled
        self.tasks = tasks
        self.ops: dict[int, Handler] = {
            Op.DELIVERY_SUSPEND: self.suspend, Op.TASK_SIGNAL: self.signal,
        }
        self.appliers: dict[int, Applier] = {
            Rec.SUSPENDED: self.apply_suspended,
            Rec.SIGNALLED: self.apply_signalled,
            Rec.WAIT_TIMED_OUT: self.apply_timed_out,
            Rec.SNAP_SIGNALS: self.apply_snapshot,
        }

    # ---- the ops ---------------------------------------------------------------------

    def suspend(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        """Settle the delivery ``lease`` into WAITING for the signal ``name`` until
        ``timeout_seconds`` from now: ``{"id", "state"}``, the state WAITING, or PENDING
        when a signal of that name was kept for it (woken at once)."""
        settlement = self.settlement
        try:
            item = settlement.settled_item(conn, args)
        except CoreError as refusal:
            return settlement.repeated(now, conn, args, Event.SUSPEND, refusal)
        name = req_text(args, "name", Limits.MAX_SIGNAL_NAME_BYTES)
        seconds = opt_number(
            args, "timeout_seconds", Limits.MAX_SUSPEND_SECONDS, 0, Limits.MAX_SUSPEND_SECONDS
        )
        if item.is_message:
            raise invalid(
                "only a task can suspend: a message has no ticket to signal it; "
                "complete, retry or release it instead"
            )
        lease = item.delivery
        assert lease is not None
        wall = self.tables.wall(now)
        self.tables.commit(
            Suspended(Rec.SUSPENDED, item.id, lease.handle, name, wall + seconds, wall), now
        )
        if item.state is State.PENDING:  # woken at once by a kept signal
            self.deliveries.dispatch(now, self.work.queue_of_item(item))
        return {"id": item.id, "state": item.state.value}

    def signal(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        """Signal the task ``task`` of run ``scope`` with ``name`` and ``data``:
        ``{"id", "state", "woken"}``, ``woken`` True when it woke the task's wait, False
        when it was kept for a later one."""
        item = self.tasks.task_of(conn, args)
        item.run.refuse_if_cancelled()
        name = req_text(args, "name", Limits.MAX_SIGNAL_NAME_BYTES)
        data = args.get("data")
        size = measured_payload("data", data)[1]
        if size > Limits.MAX_SIGNAL_DATA_BYTES:
            raise invalid(
                f"a signal's data is {size} bytes encoded; the limit is "
                f"{Limits.MAX_SIGNAL_DATA_BYTES} bytes (max_signal_data_bytes)"
            )
        signals = item.signals
        if item.terminal:
            raise CoreError(
                ErrorCode.INVALID_ARGUMENT,
                f"task {item.id} has ended ({item.state.value}): no wait of it can take "
                "a signal any more",
                {"state": item.state.value},
            )
        if item.state is _WAITING:
            assert signals is not None
            if signals.name != name:
                raise CoreError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"task {item.id} waits for the signal {signals.name!r}, not {name!r}",
                    {"waiting_for": signals.name},
                )
        elif signals is not None and len(signals.kept) >= Limits.MAX_SIGNALS_KEPT:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"task {item.id} keeps {Limits.MAX_SIGNALS_KEPT} signals it has not waited "
                "for yet, the limit (max_signals_kept)",
                {"limit": Limits.MAX_SIGNALS_KEPT},
            )
        self.tables.tenants.room_for_bytes(item.tenant, size)
        woke = item.state is _WAITING
        sent = 0 if signals is None else signals.sent
        self.tables.commit(Signalled(Rec.SIGNALLED, item.id, sent + 1, name, data, size), now)
        if woke:
            self.deliveries.dispatch(now, self.work.queue_of_item(item))
        return {"id": item.id, "state": item.state.value, "woken": woke}

    # ---- the records -----------------------------------------------------------------

    def apply_suspended(self, rec: Suspended, now: float) -> None:
        _, item_id, handle, name, until, settled_at = rec
        work = self.work
        item = work.items.get(item_id)
        if item is None or item.delivery is None or item.delivery.handle != handle:
            return  # replayed again: that delivery is already over
        item.attempt -= 1  # no attempt spent: its next delivery has the same number (and
        # its WAITING event says so, as a release's PENDING does)
        old = item.state
        work.set_state(item, transition(old, Event.SUSPEND))
        tally(item, old, item.state)
        work.wait(item)
        lease = self.deliveries.end_delivery(item)
        signals = item.signals
        if signals is None:
            signals = item.signals = Signals()
        signals.waits += 1
        if signals.woken is not None:  # carried until now: its wait is over
            work.charge_signals(item, -signals.woken[2])
            signals.woken = None
        item.visible_at = until  # its timeout (deliveries.py's ``visible_due``)
        kept = signals.take(name)
        if kept is None:
            signals.name = name
            self.deliveries.due_at(item)
        else:
            self._wake(item, kept, Event.SIGNAL, now)
        if lease is not None:
            self.settled.remember(
                now, item.tenant, handle, _SUSPEND, item_id, item.state.value, None,
                settled_at + lease.length,
            )

    def apply_signalled(self, rec: Signalled, now: float) -> None:
        _, item_id, seq, name, data, size = rec
        item = self.work.items.get(item_id)
        if item is None or item.terminal or item.is_message:
            return
        signals = item.signals
        if signals is None:
            signals = item.signals = Signals()
        if seq <= signals.sent:
            return  # replayed again: it has it
        signals.sent = seq
        if size < 0:
            size = stored_size(data)
        self.work.charge_signals(item, size)
        if item.state is _WAITING and signals.name == name:
            self._wake(item, (name, data, size), Event.SIGNAL, now)
        else:
            signals.kept.append((name, data, size))

    def apply_timed_out(self, rec: WaitTimedOut, now: float) -> None:
        item = self.work.items.get(rec[1])
        if item is None or item.state is not _WAITING or item.signals.waits != rec[2]:
            return  # replayed again, or it ended meanwhile
        self._wake(item, None, Event.WAIT_TIMEOUT, now)

    def _wake(self, item: Item, woken: Signal | None, event: Event, now: float) -> None:
        """End ``item``'s wait (``event``: by the signal ``woken``, or its timeout):
        PENDING, at the end of its ready line, its deliveries carrying ``woken``. Its
        timeout's timer leaves the wheel (the one that fired has left already)."""
        signals = item.signals
        signals.name = None
        signals.woken = woken
        self.tables.cancel_at_wall(item.visible_at, self.deliveries.visible_due, item.id)
        item.visible_at = 0.0
        old = item.state
        self.work.set_state(item, transition(old, event))
        tally(item, old, item.state)
        self.deliveries.ready_when_visible(item, now)

    # ---- snapshots -------------------------------------------------------------------

    def apply_snapshot(self, rec: SnapSignals, now: float) -> None:
        """SNAP_SIGNALS, right after its item's SNAP_ITEM (placed already: a WAITING one
        counted in its queue, its timeout on the wheel)."""
        _, item_id, sent, waits, name, woken, kept = rec
        item = self.work.items.get(item_id)
        if item is None or item.signals is not None or item.terminal:
            return  # replayed again
        signals = item.signals = Signals()
        signals.sent, signals.waits, signals.name = sent, waits, name
        if woken is not None:
            signals.woken = (woken[0], woken[1], stored_size(woken[1]))
        signals.kept = [(entry[0], entry[1], stored_size(entry[1])) for entry in kept]
        held = [*signals.kept, *([] if signals.woken is None else [signals.woken])]
        self.work.charge_signals(item, sum(signal[2] for signal in held))
