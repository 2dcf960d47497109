"""A standby promoted to primary holds the same limits by key as the old primary: the
streamed records (ITEM_LIMITED, RATE_PERIOD_BEGUN, DELIVERED) rebuild each key's limit,
its running count and its rate period, so a task held back on the old primary stays held
on the new one, and a rate period turns there on the promoted server's own timer.

The rules are tested on the fake clock (replay, snapshot and a slot move) in
tests/test_core_a_task_held_by_its_key_holds_back_no_other_key.py; this file's reason to
exist is the standby's stream and the node's own promotion path (support/promotion.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.aio import eventually_true
from support.promotion import new_core, promoted, standby_copy

from rsproto import Op


def gates(core: object) -> dict[tuple[str, int, str], tuple[int, int, int, float]]:
    keys = core.work.keys  # type: ignore[attr-defined]
    return {
        gate_key: (gate.limit, gate.running, gate.count, gate.period)
        for run_gates in keys.by_run.values() for gate_key, gate in run_gates.items()
    }


async def test_key_counts_survive_a_takeover(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    primary = new_core(loop)
    primary.connected(1, "planner")
    now = loop.time()
    primary.handle(now, 1, 1, Op.MAILBOX_ENSURE, {"name": "jobs"})
    primary.handle(now, 1, 2, Op.SCOPE_CREATE, {"scope": "r"})
    base = {"scope": "r", "mailbox": "jobs"}
    for n in range(2):
        primary.handle(now, 1, 10 + n, Op.TASK_SUBMIT, {
            **base, "data": f"u{n}", "concurrency_key": "u", "concurrency_limit": 1})
        primary.handle(now, 1, 20 + n, Op.TASK_SUBMIT, {
            **base, "data": f"r{n}", "rate_key": "r", "rate_limit": 1,
            "rate_period_seconds": 0.5})
    got = [primary.handle(now, 1, 30 + n, Op.RECEIVE, {**base, "lease_seconds": 600})
           for n in range(3)]
    assert [None if g["delivery"] is None else g["delivery"]["data"] for g in got] == [
        "u0", "r0", None]

    copy, journal = standby_copy(tmp_path, primary, now)
    assert gates(copy) == gates(primary) == {
        ("jobs", 0, "u"): (1, 1, 0, 0.0), ("jobs", 1, "r"): (1, 0, 1, 0.5)}

    async with promoted(tmp_path, copy, journal) as server:
        copy.connected(2, "worker")
        held = copy.handle(loop.time(), 2, 40, Op.RECEIVE, {**base, "lease_seconds": 600})
        assert held["delivery"] is None  # u1 and r1 are held, as on the old primary
        server.timer.arm()  # as the server does after each request it serves
        # r1 goes once r0's period (0.5 s) is over: the promoted server's timer turns it
        taken: list[str] = []

        def r1_delivered() -> bool:
            got = copy.handle(loop.time(), 2, 41, Op.RECEIVE, {**base, "lease_seconds": 600})
            if got["delivery"] is not None:
                taken.append(got["delivery"]["data"])
            server.timer.arm()
            return bool(taken)

        await eventually_true(r1_delivered)
        assert taken == ["r1"]  # u1 stays held: u0 still runs under its lease
