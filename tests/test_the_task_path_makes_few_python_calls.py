"""The SDK's task path stays lean: the Python calls a task costs the client, counted.

A task's client half is per-request bookkeeping more than wire work (issue 33): every
coroutine between the caller and the request's future, every helper and every object
made per request is paid again for each task. This counts the SDK's Python function
calls (and coroutine resumptions; its own frames, in ``rsclient/``) for the guide's
manual loop (``submit`` -> ``receive`` -> ``complete`` -> ``ticket.result``), one task
at a time against a real rsd, and holds them under a bound just above what they cost
now, so that a layer added to the hot path is noticed. (A count, not a timing: the same
on a loaded machine.) The paths they skip stay covered by their own tests: resends
(test_integration_failover*), waits across reconnects, MOVED following.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from rsclient import AsyncRunstate

TASKS = 20
_SDK = f"{os.sep}rsclient{os.sep}"
# The SDK's Python frames per task of the manual loop, one task at a time (so each
# request is a write and a read of its own, which a busy pipeline shares between many
# tasks): 59, against 72 before issue 33's lean path; a little room above it.
MOST_PER_MANUAL_TASK = 62


class _Calls:
    """Counts the SDK's Python frames entered (calls and coroutine resumptions): the
    event loop's own, the codec's and the test's are not counted."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and _SDK in frame.f_code.co_filename:
            self.count += 1


async def _counted(work: Callable[[], Any]) -> int:
    calls = _Calls()
    sys.setprofile(calls)
    try:
        await work()
    finally:
        sys.setprofile(None)
    return calls.count


async def test_the_manual_loop_and_submit_and_wait_make_few_python_calls(
    clients: Callable[..., AsyncRunstate],
) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("calls", mode="WORK")
    run = await rs.scopes.create()
    mailbox = run.mailbox("calls")

    async def manual(first: int) -> None:
        for n in range(first, first + TASKS):
            ticket = await mailbox.submit({"n": n}, key=f"task-{n}", slim=True)
            delivery = await mailbox.receive()
            assert delivery is not None
            await delivery.complete(result={"payload": n})
            assert (await ticket.result(timeout_ms=10_000))["outcome"] == n

    await manual(0)  # warm: the connection made, every import done
    per_manual = await _counted(lambda: manual(TASKS)) / TASKS
    assert per_manual <= MOST_PER_MANUAL_TASK, (
        f"{per_manual:g} SDK calls per task of the manual loop (at most {MOST_PER_MANUAL_TASK})"
    )
