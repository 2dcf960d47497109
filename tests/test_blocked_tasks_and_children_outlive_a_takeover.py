"""A BLOCKED task and a parent's children outlive a takeover: the standby's copy (the
primary's records, as its stream brings them) holds the links, and once promoted the
new primary lets the blocked task go when its parent completes there, and cancels the
children of a parent cancelled there.

The promotion is the node's own (``ClusterNode._become``), without etcd, as in
tests/test_a_waiting_task_outlives_a_takeover_and_times_out_on_the_new_primary.py; the
core's rules are tests/test_core_a_task_after_its_parents_starts_only_when_they_succeed.py's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from support.promotion import new_core, promoted, standby_copy

from rsd.core.run.items import State
from rsproto import Op

BOX = {"scope": "plans", "mailbox": "jobs"}


async def test_blocked_tasks_and_children_outlive_a_takeover(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    primary = new_core(loop)
    primary.connected(1, "planner")
    now = loop.time()
    call = iter(range(1, 100))

    def handle(op: int, args: dict[str, Any]) -> Any:
        return primary.handle(now, 1, next(call), op, args)

    handle(Op.MAILBOX_ENSURE, {"name": "jobs"})
    handle(Op.SCOPE_CREATE, {"scope": "plans"})
    first = handle(Op.TASK_SUBMIT, {**BOX, "data": 1})["id"]
    second = handle(Op.TASK_SUBMIT, {**BOX, "data": 2})["id"]
    blocked = handle(Op.TASK_SUBMIT, {**BOX, "data": 3, "after": [first]})["id"]
    kids = [handle(Op.TASK_SUBMIT, {**BOX, "data": n, "parent": second})["id"]
            for n in range(2)]

    copy, journal = standby_copy(tmp_path, primary, now)
    assert copy.work.items[blocked].state is State.BLOCKED

    async with promoted(tmp_path, copy, journal):
        copy.connected(7, "worker")
        at = loop.time()
        got = copy.handle(at, 7, 1, Op.RECEIVE, BOX)["delivery"]
        assert got["id"] == first
        copy.handle(at, 7, 2, Op.DELIVERY_COMPLETE, {"lease": got["lease"], "outcome": "x"})
        assert copy.work.items[blocked].state is State.PENDING
        children = copy.handle(at, 7, 3, Op.TASK_CHILDREN, {**BOX, "task": second})
        assert [c["id"] for c in children["children"]] == kids
        copy.handle(at, 7, 4, Op.TASK_CANCEL, {"scope": "plans", "task": second})
        assert [copy.work.items[kid].state for kid in kids] == [State.CANCELLED] * 2
