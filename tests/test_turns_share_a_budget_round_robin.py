"""The turn budget (rsd/wire/turns.py): busy connections share one budget, round robin.

Connections cut short are resumed in the order they were cut, each with the budget
divided among those queued at the turn's start (never under the floor), and a turn
resumes them only while its budget lasts (at least one): the rest wait, first in line,
for the next turn. So a turn lasts about the budget however many connections flood.
The clock is given by the test: no timing is measured.
"""

from __future__ import annotations

import pytest

from rsd.policy import Policy
from rsd.wire.turns import Turns


def run_turn(turns: Turns[str], now: float, cost: float) -> list[str]:
    """One turn at ``now`` where each slice takes ``cost`` seconds: who was resumed."""
    turns.begin(now)
    resumed = []
    while (conn := turns.next(now, not resumed)) is not None:
        resumed.append(conn)
        now += cost
    return resumed


def test_a_lone_busy_connection_gets_the_whole_budget() -> None:
    turns: Turns[str] = Turns(0.01, 0.001)
    assert turns.share == 0.01
    turns.yielded("a")
    assert run_turn(turns, 0.0, 0.0) == ["a"]
    assert turns.share == 0.01
    assert run_turn(turns, 1.0, 0.0) == []  # nobody was cut: the next turn resumes nobody
    assert turns.share == 0.01


def test_the_budget_is_divided_among_the_connections_queued_at_the_turns_start() -> None:
    turns: Turns[str] = Turns(0.01, 0.001)
    for name in "abcd":
        turns.yielded(name)
    assert run_turn(turns, 0.0, 0.0) == ["a", "b", "c", "d"], "not resumed in cut order"
    assert turns.share == pytest.approx(0.0025)
    turns.yielded("b")
    turns.yielded("a")
    assert run_turn(turns, 1.0, 0.0) == ["b", "a"]
    assert turns.share == pytest.approx(0.005), "the share did not grow back as load fell"


def test_a_share_never_falls_under_the_floor() -> None:
    turns: Turns[int] = Turns(0.01, 0.001)
    for conn in range(1000):
        turns.yielded(conn)
    turns.begin(0.0)
    assert turns.share == 0.001


def test_a_turn_resumes_connections_only_while_its_budget_lasts() -> None:
    """16 flooders whose every slice takes 3 ms (one costly request each, far past
    their share): a 10 ms turn resumes 4 of them, not all 16; the rest go on first in
    the next turns, in order, and every one has run after 4 turns."""
    turns: Turns[int] = Turns(0.01, 0.001)
    for conn in range(16):
        turns.yielded(conn)
    order: list[int] = []
    for t in range(4):
        resumed = run_turn(turns, float(t), 0.003)
        assert len(resumed) == 4, f"turn {t} resumed {resumed}: not bounded by the budget"
        order += resumed
    assert order == list(range(16)), "a connection was skipped or resumed out of order"
    assert not turns.cut


def test_a_turn_always_resumes_one_even_with_no_budget_left() -> None:
    turns: Turns[str] = Turns(0.01, 0.001)
    turns.yielded("a")
    turns.yielded("b")
    turns.begin(0.0)
    assert turns.next(5.0, True) == "a", "a turn made no progress"
    assert turns.next(5.0, False) is None
    assert list(turns.cut) == ["b"], "the one not reached lost its place"


def test_one_cut_again_in_a_turn_waits_for_a_later_turn() -> None:
    turns: Turns[str] = Turns(0.01, 0.001)
    turns.yielded("a")
    turns.begin(0.0)
    assert turns.next(0.0, True) == "a"
    turns.yielded("a")  # cut again during the turn, with budget left
    assert turns.next(0.0, False) is None, "a connection ran twice in one turn"
    assert list(turns.cut) == ["a"]


def test_the_default_budget_is_the_policys() -> None:
    turns: Turns[int] = Turns()
    assert turns.share == Policy.TURN_BUDGET_SECONDS


def test_a_floor_over_the_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="floor"):
        Turns(0.001, 0.01)
    with pytest.raises(ValueError, match="floor"):
        Turns(0.01, 0.0)
