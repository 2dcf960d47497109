"""Wait timeouts that come in deadline order share one wheel entry (waits.py's
DeadlineLine): each still times out at its deadline, never before; one that ends
earlier leaves no live entry and the line stays within twice its pending waits; a
deadline before the line's last times out on time on an entry of its own; a mass of
timeouts at one instant is fired a slice per tick."""

from __future__ import annotations

from rsd.core.ground.effects import DEFERRED
from rsd.policy import Policy
from rsproto import ErrorCode, Kind, Op
from tests.support.core import ALICE, CoreDriver, next_rid, wheel_but_quiet_runs

TICK = 0.005


def park_receive(core: CoreDriver, timeout_ms: int, at: float = 0.0) -> int:
    rid = next_rid()
    args = {"scope": "s", "mailbox": "jobs", "wait": True, "timeout_ms": timeout_ms}
    assert core.handle(at, ALICE, rid, Op.RECEIVE, args) is DEFERRED
    return rid


def answered(core: CoreDriver) -> list[int]:
    return [message[1] for _, message in core.drain()]


def test_waits_with_one_timeout_share_one_wheel_entry_and_time_out_on_time() -> None:
    core = CoreDriver()
    before = wheel_but_quiet_runs(core)
    rids = [park_receive(core, 1000, at=n * 0.01) for n in range(100)]
    assert wheel_but_quiet_runs(core) == before + 1
    assert core.stats()["timers"] - len(core.run_ends.line) == before + 100
    core.tick(0.01 * 49 + 1.0 - 0.001)  # the first 49 are past their deadline, no more
    assert answered(core) == rids[:49]
    core.tick(0.01 * 99 + 1.0 + TICK)
    assert answered(core) == rids[49:]
    assert wheel_but_quiet_runs(core) == before and core.stats()["waits"] == 0


def test_ended_waits_leave_no_live_entry_and_the_line_stays_bounded() -> None:
    core = CoreDriver()
    rids = [park_receive(core, 60_000) for _ in range(1000)]
    for rid in rids[:-1]:
        core.call(Op.CANCEL, {"request": rid})
    core.drain()
    line = core.waits.deadlines
    assert len(line._line) <= 2 * 1 + 33  # one pending wait: its stale entries are gone
    # the line's one entry, for one wait
    assert core.stats()["timers"] - len(core.run_ends.line) == wheel_but_quiet_runs(core)
    core.call(Op.CANCEL, {"request": rids[-1]})
    assert len(line._line) == 0 and wheel_but_quiet_runs(core) == 0  # emptied: off the wheel


def test_a_deadline_before_the_lines_last_times_out_on_time() -> None:
    core = CoreDriver()
    late = park_receive(core, 60_000)
    early = park_receive(core, 1000)  # before the line's last: an entry of its own
    core.tick(1.0 + TICK)
    messages = core.drain()
    assert [message[1] for _, message in messages] == [early]
    core.tick(60.0 + TICK)
    assert answered(core) == [late]


def test_a_mass_of_timeouts_at_one_instant_is_fired_a_slice_per_tick() -> None:
    core = CoreDriver()
    budget = Policy.MAX_FIRED_PER_TICK
    for _ in range(2 * budget + 3):
        park_receive(core, 1000)
    core.tick(1.0 + TICK)
    assert len(core.drain()) == budget
    deadline = core.next_deadline()
    assert deadline is not None and deadline <= 1.0 + TICK  # the rest is still due
    core.tick(1.0 + TICK)
    core.tick(1.0 + TICK)
    assert len(core.drain()) == budget + 3
    assert core.stats()["waits"] == 0 and wheel_but_quiet_runs(core) == 0


def test_a_result_wait_still_ends_with_wait_timeout() -> None:
    core = CoreDriver()
    task = core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 1})
    rid = next_rid()
    assert core.handle(0.0, ALICE, rid, Op.TASK_RESULT,
                       {"scope": "s", "task": task["id"], "timeout_ms": 500}) is DEFERRED
    core.tick(0.499)
    assert core.drain() == []
    core.tick(0.5 + TICK)
    [(conn, message)] = core.drain()
    assert conn == ALICE and message[0] == Kind.ERROR and message[1] == rid
    assert message[2] == ErrorCode.WAIT_TIMEOUT
