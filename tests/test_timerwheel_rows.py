"""TimerWheel rows: entries that know their own deadline (leases) cost a list slot, and
an entry that went stale (its lease ended) leaves the wheel in O(1) amortised work.

The owner of the rows says which entries are still wanted (``fresh``) and is told which
ones were handed back (``taken``); here a plain object plays the lease.
"""

from __future__ import annotations

from typing import Any

from rsd.core.ground.timerwheel import TimerWheel

TICK = 0.005


class Entry:
    """A row item: wanted while ``live`` and while its ``due`` maps to the slot."""

    def __init__(self, due: float) -> None:
        self.due: float | None = due
        self.live = True


class Rows:
    """The rows' owner, given to the wheel at construction (as the lease table is)."""

    def __init__(self) -> None:
        self.wheel = TimerWheel(tick=TICK, rows=self)

    def fresh(self, item: Any, slot: int) -> bool:
        return item.live and item.due is not None and self.wheel.slot_of(item.due) == slot

    def taken(self, item: Any) -> None:
        item.due = None


def rows_wheel() -> TimerWheel:
    return Rows().wheel


def add(wheel: TimerWheel, due: float) -> Entry:
    entry = Entry(due)
    wheel.schedule_row(due, entry)
    return entry


def end(wheel: TimerWheel, entry: Entry) -> None:
    """As LeaseTable.end: an entry still on the wheel is counted stale."""
    entry.live = False
    if entry.due is not None:
        wheel.cancel_row(entry.due)


def row_entries(wheel: TimerWheel) -> int:
    return sum(len(row) for row in wheel._rows.values())


def test_row_entries_come_back_once_due_in_schedule_order_after_the_bucket() -> None:
    wheel = rows_wheel()
    first, second = add(wheel, 1.001), add(wheel, 1.002)  # one slot, as the timer's
    wheel.schedule(1.003, "timer")
    assert len(wheel) == 3
    assert wheel.pop_due(1.001) == []
    assert wheel.pop_due(1.01) == ["timer", first, second]
    assert (first.due, second.due) == (None, None)  # told they were handed back
    assert len(wheel) == 0 and wheel.next_deadline() is None


def test_an_ended_entry_is_not_handed_back_and_leaves_the_count() -> None:
    wheel = rows_wheel()
    kept, ended = add(wheel, 1.0), add(wheel, 1.0)
    end(wheel, ended)
    assert len(wheel) == 1
    assert wheel.pop_due(2.0) == [kept]
    assert len(wheel) == 0 and wheel._rows == {} and wheel.next_deadline() is None


def test_a_row_whose_entries_all_ended_is_dropped_at_once() -> None:
    wheel = rows_wheel()
    entries = [add(wheel, 5.0) for _ in range(100)]
    for entry in entries:
        end(wheel, entry)
    assert wheel._rows == {} and len(wheel) == 0
    assert wheel.next_deadline() is None


def test_an_object_granted_again_in_one_slot_a_million_times_keeps_a_short_row() -> None:
    """A claim released and granted again at one instant gets a new entry each time in
    the same row: the stale ones are rebuilt away, so the row stays O(wanted)."""
    wheel = rows_wheel()
    others = [add(wheel, 5.0) for _ in range(10)]
    claim = add(wheel, 5.0)
    for _ in range(1_000_000 // 10):
        end(wheel, claim)
        claim.live, claim.due = True, 5.0
        wheel.schedule_row(5.0, claim)
        assert row_entries(wheel) <= 2 * 11 + 16 + 1
    assert len(wheel) == 11
    assert wheel.pop_due(6.0) == [*others, claim]  # once, though it was added 100,001 times


def test_a_slice_of_a_row_is_taken_and_the_rest_comes_next_in_order() -> None:
    wheel = rows_wheel()
    entries = [add(wheel, 1.0) for _ in range(10)]
    assert wheel.pop_due(1.0, limit=4) == entries[:4]
    end(wheel, entries[5])  # ends while waiting in the part not taken yet
    assert len(wheel) == 5
    assert wheel.next_deadline() == 1.0  # what is left is still due
    assert wheel.pop_due(1.0, limit=3) == [entries[4], entries[6], entries[7]]
    assert wheel.pop_due(1.0) == entries[8:]
    assert len(wheel) == 0 and wheel._rows == {} and wheel._starts == {}


def test_an_entry_handed_back_and_then_ended_cancels_nothing_else() -> None:
    """The owner knows the entry left (``taken``): ending it later must not count another
    entry of a row still waiting as stale."""
    wheel = rows_wheel()
    entries = [add(wheel, 1.0) for _ in range(3)]
    assert wheel.pop_due(1.0, limit=1) == [entries[0]]
    end(wheel, entries[0])  # already handed back: due is None, nothing is cancelled
    assert len(wheel) == 2
    assert wheel.pop_due(1.0) == entries[1:]


def test_ten_thousand_leases_ended_in_random_order_leave_no_row() -> None:
    import random

    rng = random.Random(3)
    wheel = rows_wheel()
    entries = [add(wheel, 1.0 + rng.random() * 0.2) for _ in range(10_000)]
    rng.shuffle(entries)
    for n, entry in enumerate(entries):
        end(wheel, entry)
        if n % 1000 == 0:
            assert row_entries(wheel) <= 2 * len(wheel) + 16 * len(wheel._rows)
    assert len(wheel) == 0 and wheel._rows == {} and wheel._stale == {}
    assert wheel.next_deadline() is None


def test_a_limited_pop_looks_at_o_limit_entries_however_many_ended_in_front() -> None:
    """Half a row ended (not yet rebuilt away) in front of the live half: a pop with a
    limit skips at most 2 * limit + 16 of them per call, and the calls that follow hand
    back every live entry, in order."""
    wheel = rows_wheel()
    ended = [add(wheel, 1.0) for _ in range(5000)]
    live = [add(wheel, 1.0) for _ in range(5000)]
    for entry in ended:
        end(wheel, entry)
    assert len(wheel._rows[wheel.slot_of(1.0)]) == 10_000  # no rebuild yet: half stale
    first = wheel.pop_due(1.0, limit=10)
    assert first == []  # looked at 36 ended entries only
    assert wheel.next_deadline() == 1.0  # more is due: the caller comes back at once
    got: list[Entry] = []
    for _ in range(10_000):
        got += wheel.pop_due(1.0, limit=10)
        if len(got) == len(live):
            break
    assert got == live and len(wheel) == 0 and wheel._rows == {}
