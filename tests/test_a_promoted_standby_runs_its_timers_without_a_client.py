"""A standby promoted to primary runs the core's timers from its first moment as primary,
whether or not a client ever connects to it: what its copy holds falls due on time.

A standby never ticks (it follows: the primary's records say what expired); promoted,
its core's deadlines become the server's to run. The server arms its timer when it
starts serving whatever state it was given (``Server.start``, the one place for a
recovered and a promoted state alike); before, the timer was armed only after a
client's request, so an idle cluster whose primary failed over in the night ran no
schedule, no delay and no lease expiry until someone came.

The promotion is the node's own (``ClusterNode._become``), without etcd: the node is
told it leads, as the elector would after winning the election.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.aio import eventually_true
from support.promotion import new_core, promoted, standby_copy

from rsd.core.run.items import State
from rsproto import Op


async def test_a_promoted_standby_fires_what_falls_due_with_no_client(
    tmp_path: Path,
) -> None:
    loop = asyncio.get_running_loop()
    primary = new_core(loop)  # the old primary: its records are what the standby holds
    primary.connected(1, "planner")
    now = loop.time()
    primary.handle(now, 1, 1, Op.MAILBOX_ENSURE, {"name": "jobs"})
    primary.handle(now, 1, 2, Op.SCOPE_CREATE, {"scope": "nightly"})
    submitted = primary.handle(now, 1, 3, Op.TASK_SUBMIT, {
        "scope": "nightly", "mailbox": "jobs", "data": {"n": 1}, "delay_ms": 200})

    copy, journal = standby_copy(tmp_path, primary, now)
    item = copy.work.items[submitted["id"]]
    assert item.state is State.DELAYED

    async with promoted(tmp_path, copy, journal) as server:
        await eventually_true(lambda: item.state is State.PENDING)  # no client came
        assert server.conns == {}
