"""A task WAITING for a signal, and a signal kept for another task, outlive a takeover:
the standby's copy (the primary's records, as its stream brings them) holds them, and
once promoted the new primary runs the wait's timeout with no client connected, and a
suspend there takes the kept signal at once.

The promotion is the node's own (``ClusterNode._become``), without etcd, as in
tests/test_a_promoted_standby_runs_its_timers_without_a_client.py: a cluster with a
real election costs a suite much more, and what a takeover adds for a waiting task is
only this (its records are streamed like any other; the core's rules are
tests/test_core_a_waiting_task_holds_no_worker_and_wakes_on_its_signal.py's).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from support.aio import eventually_true
from support.promotion import new_core, promoted, standby_copy

from rsd.core.run.items import State
from rsproto import Op

BOX = {"scope": "approvals", "mailbox": "jobs"}


async def test_a_waiting_task_and_a_kept_signal_outlive_a_takeover(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    primary = new_core(loop)  # the old primary: its records are what the standby holds
    primary.connected(1, "agent")
    now = loop.time()
    call = iter(range(1, 100))

    def handle(op: int, args: dict[str, Any]) -> Any:
        return primary.handle(now, 1, next(call), op, args)

    handle(Op.MAILBOX_ENSURE, {"name": "jobs"})
    handle(Op.SCOPE_CREATE, {"scope": "approvals"})
    waiting = handle(Op.TASK_SUBMIT, {**BOX, "data": 1})["id"]
    delivery = handle(Op.RECEIVE, BOX)["delivery"]
    handle(Op.DELIVERY_SUSPEND, {"lease": delivery["lease"], "name": "approval",
                                 "timeout_seconds": 0.3})
    kept = handle(Op.TASK_SUBMIT, {**BOX, "data": 2})["id"]
    handle(Op.TASK_SIGNAL, {"scope": "approvals", "task": kept, "name": "payment", "data": 10})

    copy, journal = standby_copy(tmp_path, primary, now)
    assert copy.work.items[waiting].state is State.WAITING

    async with promoted(tmp_path, copy, journal):
        item = copy.work.items[waiting]
        await eventually_true(lambda: item.state is State.PENDING)  # its timeout, no client
        assert item.signals.woken is None
        # The kept signal is there: the other task's suspend on its name is woken at once.
        copy.connected(7, "agent")
        at = loop.time()
        got = copy.handle(at, 7, 1, Op.RECEIVE, {**BOX, "max": 2})["deliveries"]
        other = next(d for d in got if d["id"] == kept)
        assert "signal" not in other
        woke = copy.handle(at, 7, 2, Op.DELIVERY_SUSPEND, {"lease": other["lease"],
                                                          "name": "payment"})
        assert woke == {"id": kept, "state": "PENDING"}
