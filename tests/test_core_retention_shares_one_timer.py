"""Finished tasks wait out retention and tombstone in lines sharing one wheel entry each
(rsd/core/ground/dueline.py): never early, in order, bounded per tick, one wheel entry for a
whole line however many tasks finish."""

from __future__ import annotations

from typing import Any

from rsd.core.ground.dueline import DueLine
from rsd.policy import Policy
from rsproto import Op
from tests.support.core import WALL, CoreDriver, wheel_but_quiet_runs

TICK = 0.005  # the core's wheel tick


def _line(core: CoreDriver) -> tuple[DueLine, list[tuple[float, Any]]]:
    fired: list[tuple[float, Any]] = []
    return DueLine(core.tables.clock, lambda now, arg: fired.append((now, arg))), fired


def test_dues_fire_in_order_never_early_and_at_most_a_tick_late() -> None:
    core = CoreDriver()
    line, fired = _line(core)
    for index, at in enumerate((1.0, 1.0, 2.5, 4.0)):
        line.add(WALL + at, index)
    core.tick(0.999)
    assert fired == []
    core.tick(1.0 + TICK)
    assert [arg for _, arg in fired] == [0, 1]
    core.tick(2.49)
    assert len(fired) == 2
    core.tick(2.5 + TICK)
    core.tick(10.0)
    assert [arg for _, arg in fired] == [0, 1, 2, 3]
    assert all(now >= at for (now, _), at in zip(fired, (1.0, 1.0, 2.5, 4.0), strict=True))
    assert len(line) == 0 and wheel_but_quiet_runs(core) == 0  # nothing left armed


def test_an_instant_before_the_lines_last_fires_on_time_not_behind_it() -> None:
    core = CoreDriver()
    line, fired = _line(core)
    line.add(WALL + 100.0, "late")
    line.add(WALL + 1.0, "early")  # the wall clock went back: its own timer
    core.tick(1.0 + TICK)
    assert [arg for _, arg in fired] == ["early"]
    core.tick(100.0 + TICK)
    assert [arg for _, arg in fired] == ["early", "late"]


def test_a_line_of_many_dues_holds_one_wheel_entry() -> None:
    core = CoreDriver()
    before = wheel_but_quiet_runs(core)
    line, _ = _line(core)
    for index in range(10_000):
        line.add(WALL + 5.0 + index * 0.001, index)
    assert wheel_but_quiet_runs(core) == before + 1
    assert len(line) == 10_000


def test_a_mass_of_dues_at_one_instant_is_fired_a_slice_per_tick() -> None:
    core = CoreDriver()
    line, fired = _line(core)
    budget = Policy.MAX_FIRED_PER_TICK
    for index in range(2 * budget + 7):
        line.add(WALL + 1.0, index)
    now = 1.0 + TICK
    core.tick(now)
    assert len(fired) == budget  # one tick's budget: the shell serves others in between
    next_deadline = core.next_deadline()
    assert next_deadline is not None and next_deadline <= now  # the rest is still due
    core.tick(now)
    assert len(fired) == 2 * budget
    core.tick(now)
    assert [arg for _, arg in fired] == list(range(2 * budget + 7))
    assert wheel_but_quiet_runs(core) == 0


def test_finished_tasks_share_one_retention_entry_and_end_on_time() -> None:
    core = CoreDriver(retention_seconds=60.0, tombstone_seconds=30.0)
    wheel_before = wheel_but_quiet_runs(core)
    ids = []
    for n in range(50):
        task = core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": n,
                                          "key": f"k{n}"}, now=n * 0.1)
        lease = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"},
                          now=n * 0.1)["delivery"]["lease"]
        core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": n}, now=n * 0.1)
        ids.append(task["id"])
    # the retention line's one entry, and the settled line's (settled.py: each complete
    # is remembered for one lease length)
    assert wheel_but_quiet_runs(core) == wheel_before + 2
    core.tick(60.0 + 0.1 * 25 - TICK)  # tasks 0..24 (finished by 2.4) are past retention
    states = [core.call(Op.TASK_STATUS, {"scope": "s", "task": i}, now=62.5) for i in ids]
    assert [view["tombstoned"] for view in states] == [True] * 25 + [False] * 25
    core.tick(200.0)  # past retention and tombstone for all: forgotten
    for task_id in ids:
        core.refused(Op.TASK_STATUS, {"scope": "s", "task": task_id}, now=200.0)
    assert wheel_but_quiet_runs(core) == 0
