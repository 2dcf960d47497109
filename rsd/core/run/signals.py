"""A task's signals: the name it waits for, the signals kept for it, and the one that
woke it (work/waiting.py owns the rules; this is the object they keep on the item).

What always holds:
- ``name`` is the signal a WAITING task waits for, None in every other state; the
  wait's timeout is the item's ``visible_at`` (a wall instant, on the wheel as a
  backoff's end is: deliveries.py's ``visible_due``);
- ``kept`` holds the signals sent while the task did not wait (before it suspended),
  oldest first, at most ``Limits.MAX_SIGNALS_KEPT``: a suspend on a name takes the
  oldest of that name at once (no lost wake-up);
- ``woken`` is the signal that ended the task's last wait, carried by each of its
  deliveries until it suspends again; None after a timeout, and before any wait;
- ``sent`` and ``waits`` count the signals sent to the task and its suspends: the
  records that change it carry the count they make (SIGNALLED, WAIT_TIMED_OUT), so a
  replay over a state that has them changes nothing;
- the object stays with its task until the task ends (then it goes: workbook.py's
  ``drop_signals``);
- ``bytes`` is the stored size of the data of ``kept`` and ``woken``, charged to the
  task's tenant while they are held (workbook.py's ``charge_signals``).
"""

from __future__ import annotations

from typing import Any

from ..records import Rec
from ..records.snaprecords import SnapSignals

__all__ = ["Signal", "Signals", "signals_record"]

# (name, data, stored size of data)
Signal = tuple[str, Any, int]


class Signals:
    __slots__ = ("bytes", "kept", "name", "sent", "waits", "woken")

    def __init__(self) -> None:
        self.sent = 0
        self.waits = 0
        self.name: str | None = None
        self.kept: list[Signal] = []
        self.woken: Signal | None = None
        self.bytes = 0

    def take(self, name: str) -> Signal | None:
        """The oldest kept signal of ``name``, taken off the kept ones; None if none.
        O(kept), at most MAX_SIGNALS_KEPT."""
        for at, signal in enumerate(self.kept):
            if signal[0] == name:
                del self.kept[at]
                return signal
        return None

    def carried(self) -> dict[str, Any] | None:
        """What a delivery carries as its ``signal``: ``{"name", "data"}``, or None."""
        woken = self.woken
        return None if woken is None else {"name": woken[0], "data": woken[1]}

    def view(self, timeout_at: float | None) -> dict[str, Any]:
        """As TASK_STATUS shows it: the name waited for and until when (wall clock), the
        names kept, oldest first, and the name of the signal that woke it last."""
        return {
            "waiting_for": self.name,
            "timeout_at": timeout_at,
            "kept": [signal[0] for signal in self.kept],
            "woken_by": None if self.woken is None else self.woken[0],
        }

    def as_record(self) -> tuple[int, int, str | None, list[Any] | None, list[list[Any]]]:
        """SNAP_SIGNALS's fields after the item id."""
        woken = self.woken
        return (
            self.sent,
            self.waits,
            self.name,
            None if woken is None else [woken[0], woken[1]],
            [[signal[0], signal[1]] for signal in self.kept],
        )


def signals_record(item_id: str, signals: Signals) -> SnapSignals:
    """The SNAP_SIGNALS record of the task ``item_id``'s ``signals``."""
    return SnapSignals(Rec.SNAP_SIGNALS, item_id, *signals.as_record())
