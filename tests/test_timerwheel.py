"""TimerWheel: deadlines rounded up to ticks, handed back once due, never polled.

All time is a plain float passed in; nothing here sleeps.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsd.core.ground.timerwheel import TimerWheel

TICK = 0.005


@pytest.fixture
def wheel() -> TimerWheel:
    return TimerWheel(tick=TICK)


def test_empty_wheel_has_no_deadline_and_nothing_due(wheel: TimerWheel) -> None:
    assert wheel.next_deadline() is None
    assert wheel.pop_due(1e9) == []
    assert len(wheel) == 0


def test_item_is_not_returned_before_its_deadline(wheel: TimerWheel) -> None:
    wheel.schedule(10.0, "a")
    assert wheel.pop_due(9.0) == []
    assert wheel.pop_due(10.0 - TICK / 2) == []
    assert len(wheel) == 1


def test_item_is_returned_at_its_deadline_when_deadline_is_on_a_tick(wheel: TimerWheel) -> None:
    wheel.schedule(10.0, "a")
    assert wheel.pop_due(10.0) == ["a"]


def test_item_between_ticks_is_returned_within_one_tick_after_its_deadline(
    wheel: TimerWheel,
) -> None:
    deadline = 10.0012
    wheel.schedule(deadline, "a")
    assert wheel.pop_due(deadline) == []  # rounded up to the next tick, never early
    assert wheel.pop_due(deadline + TICK) == ["a"]


def test_item_is_returned_only_once(wheel: TimerWheel) -> None:
    wheel.schedule(1.0, "a")
    assert wheel.pop_due(2.0) == ["a"]
    assert wheel.pop_due(3.0) == []
    assert len(wheel) == 0


def test_next_deadline_is_the_deadline_rounded_up_to_a_tick(wheel: TimerWheel) -> None:
    deadline = 10.0012
    wheel.schedule(deadline, "a")
    nd = wheel.next_deadline()
    assert nd is not None
    assert deadline <= nd < deadline + TICK


def test_next_deadline_is_the_earliest_of_several(wheel: TimerWheel) -> None:
    wheel.schedule(30.0, "late")
    wheel.schedule(10.0, "early")
    wheel.schedule(20.0, "middle")
    assert wheel.next_deadline() == pytest.approx(10.0)


def test_next_deadline_moves_on_after_pop(wheel: TimerWheel) -> None:
    wheel.schedule(10.0, "a")
    wheel.schedule(20.0, "b")
    wheel.pop_due(15.0)
    assert wheel.next_deadline() == pytest.approx(20.0)
    wheel.pop_due(25.0)
    assert wheel.next_deadline() is None


def test_popping_at_next_deadline_returns_the_earliest_item(wheel: TimerWheel) -> None:
    wheel.schedule(10.0012, "a")
    wheel.schedule(50.0, "b")
    nd = wheel.next_deadline()
    assert nd is not None
    assert wheel.pop_due(nd) == ["a"]


def test_items_in_the_same_tick_come_back_together_in_schedule_order(
    wheel: TimerWheel,
) -> None:
    wheel.schedule(1.0013, "first")
    wheel.schedule(1.0041, "second")
    wheel.schedule(1.0022, "third")
    assert len(wheel) == 3
    nd = wheel.next_deadline()
    assert nd is not None
    assert wheel.pop_due(nd) == ["first", "second", "third"]


def test_same_deadline_scheduled_twice_returns_both(wheel: TimerWheel) -> None:
    wheel.schedule(2.0, "x")
    wheel.schedule(2.0, "x")
    assert wheel.pop_due(2.0) == ["x", "x"]


def test_pop_due_with_nothing_due_keeps_everything(wheel: TimerWheel) -> None:
    wheel.schedule(5.0, "a")
    wheel.schedule(6.0, "b")
    assert wheel.pop_due(4.0) == []
    assert len(wheel) == 2
    assert wheel.next_deadline() == pytest.approx(5.0)


def test_pop_due_returns_everything_due_in_deadline_order(wheel: TimerWheel) -> None:
    for deadline, item in [(3.0, "c"), (1.0, "a"), (2.0, "b"), (9.0, "z")]:
        wheel.schedule(deadline, item)
    assert wheel.pop_due(5.0) == ["a", "b", "c"]
    assert len(wheel) == 1


def test_item_scheduled_in_the_past_is_due_at_once(wheel: TimerWheel) -> None:
    wheel.schedule(1.0, "old")
    assert wheel.pop_due(100.0) == ["old"]


def test_custom_tick_sets_the_rounding() -> None:
    wheel = TimerWheel(tick=1.0)
    wheel.schedule(2.5, "a")
    assert wheel.next_deadline() == 3.0
    assert wheel.pop_due(2.9) == []
    assert wheel.pop_due(3.0) == ["a"]


def test_many_items_each_come_back_once_between_deadline_and_one_tick_later(
    wheel: TimerWheel,
) -> None:
    rng = random.Random(7)
    deadlines = {i: round(rng.uniform(0.0, 5.0), 4) for i in range(2000)}
    for item, deadline in deadlines.items():
        wheel.schedule(deadline, item)
    popped_at: dict[int, float] = {}
    now = 0.0
    step = TICK / 3
    while len(wheel):
        for item in wheel.pop_due(now):
            assert item not in popped_at
            popped_at[item] = now
        now += step
    assert popped_at.keys() == deadlines.keys()
    for item, deadline in deadlines.items():
        assert deadline - 1e-9 <= popped_at[item] <= deadline + TICK + step


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False))
def test_any_deadline_is_due_one_tick_later_and_not_half_a_tick_sooner(deadline: float) -> None:
    wheel = TimerWheel(tick=TICK)
    wheel.schedule(deadline, "a")
    assert wheel.pop_due(deadline - TICK / 2) == []
    assert wheel.pop_due(deadline + TICK) == ["a"]
