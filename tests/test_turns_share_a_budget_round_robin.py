"""The turn budget (rsd/turns.py): busy connections share one budget, round robin.

Each connection cut short in a turn runs again in the next one, in the order they were
cut, and the share of each is the budget divided among them (never under the floor), so
a turn lasts about the budget however many connections flood.
"""

from __future__ import annotations

import pytest

from rsd.policy import Policy
from rsd.turns import Turns


def test_a_lone_busy_connection_gets_the_whole_budget() -> None:
    turns: Turns[str] = Turns(0.01, 0.001)
    assert turns.share == 0.01
    turns.yielded("a")
    assert turns.take() == ["a"]
    assert turns.share == 0.01
    assert turns.take() == []  # nobody was cut: the next turn resumes nobody
    assert turns.share == 0.01


def test_the_budget_is_divided_among_the_connections_cut_in_the_last_turn() -> None:
    turns: Turns[str] = Turns(0.01, 0.001)
    for name in "abcd":
        turns.yielded(name)
    assert turns.take() == ["a", "b", "c", "d"], "not resumed in the order they were cut"
    assert turns.share == pytest.approx(0.0025)
    turns.yielded("b")
    turns.yielded("a")
    assert turns.take() == ["b", "a"]
    assert turns.share == pytest.approx(0.005), "the share did not grow back as load fell"


def test_a_share_never_falls_under_the_floor() -> None:
    turns: Turns[int] = Turns(0.01, 0.001)
    for conn in range(1000):
        turns.yielded(conn)
    assert turns.take() == list(range(1000)), "a cut connection was skipped"
    assert turns.share == 0.001


def test_every_cut_connection_runs_in_the_next_turn_once() -> None:
    turns: Turns[int] = Turns()
    assert turns.share == Policy.TURN_BUDGET_SECONDS
    turns.yielded(1)
    turns.yielded(2)
    assert turns.take() == [1, 2]
    assert not turns.cut, "the queue kept connections already resumed"


def test_a_floor_over_the_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="floor"):
        Turns(0.001, 0.01)
    with pytest.raises(ValueError, match="floor"):
        Turns(0.01, 0.0)
