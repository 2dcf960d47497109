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

import asyncio
import inspect
import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from rsclient import AsyncRunstate, Delivery

TASKS = 20
_SDK = f"{os.sep}rsclient{os.sep}"
# The SDK's Python frames per task of the manual loop, one task at a time (so each
# request is a write and a read of its own, which a busy pipeline shares between many
# tasks): 55, against 72 before issue 33's lean path and 57 before submit built the
# args of data, key and slim itself and send_wait reckoned its give-up moment inline
# (no _submit_args, no _give_up_after call: fails before); a little room above it.
MOST_PER_MANUAL_TASK = 56
# And its coroutines per task: 6 (submit, result, receive, receive_many and its
# request_cancellable, complete), against 7 before result() awaited its own wait's
# future (``Connection.send_wait``) rather than through request_cancellable.
MOST_COROUTINES_PER_MANUAL_TASK = 6.5
# Of a consume() worker and its planner's submit, one task at a time: the SDK's
# coroutines per task (each a frame made, then resumed at every await below it, which
# costs more than a call), 6.1 (submit; the slot's _handle and the handler's complete,
# which awaits its request itself; the receiver's receive_many, wait_across_reconnects
# and request_cancellable), against 8.1 before issue 33's lean path ran the handler
# through run_in_task and 7.1 before complete awaited without _settle; and its Python
# frames per task, 63, a little room above it.
MOST_COROUTINES_PER_CONSUMED_TASK = 6.5
MOST_PER_CONSUMED_TASK = 65


class _Calls:
    """Counts the SDK's Python frames entered (calls and coroutine resumptions), and
    its coroutines (``coroutines``: each one once, however often it is resumed): the
    event loop's own, the codec's and the test's are not counted."""

    def __init__(self) -> None:
        self.count = 0
        self.coroutines: list[FrameType] = []  # kept alive: compared by identity
        self._seen: set[int] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and _SDK in frame.f_code.co_filename:
            self.count += 1
            if frame.f_code.co_flags & inspect.CO_COROUTINE and id(frame) not in self._seen:
                self._seen.add(id(frame))
                self.coroutines.append(frame)


async def _counted(work: Callable[[], Any]) -> _Calls:
    calls = _Calls()
    sys.setprofile(calls)
    try:
        await work()
    finally:
        sys.setprofile(None)
    return calls


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
    calls = await _counted(lambda: manual(TASKS))
    per_manual = calls.count / TASKS
    assert per_manual <= MOST_PER_MANUAL_TASK, (
        f"{per_manual:g} SDK calls per task of the manual loop (at most {MOST_PER_MANUAL_TASK})"
    )
    coroutines = len(calls.coroutines) / TASKS
    assert coroutines <= MOST_COROUTINES_PER_MANUAL_TASK, (
        f"{coroutines:g} SDK coroutines per task of the manual loop "
        f"(at most {MOST_COROUTINES_PER_MANUAL_TASK})"
    )


async def test_a_consume_worker_makes_few_python_calls_per_task(
    clients: Callable[..., AsyncRunstate],
) -> None:
    """consume()'s delivery path (the delivery made, the handler run in its slot, the
    handler's own complete(), the slot parked for the next), one task at a time."""
    planner, worker = clients("planner"), clients("worker")
    await planner.mailboxes.ensure("consumed", mode="WORK")
    run = await planner.scopes.create()
    handled: asyncio.Queue[int] = asyncio.Queue()

    async def handle(data: dict[str, int], delivery: Delivery) -> None:
        await delivery.complete(result={"payload": data["n"]})
        handled.put_nowait(data["n"])

    async def tasks(first: int) -> None:
        for n in range(first, first + TASKS):
            await run.mailbox("consumed").submit({"n": n}, key=f"task-{n}", slim=True)
            assert await handled.get() == n

    stop = asyncio.Event()
    consumer = asyncio.ensure_future(worker.scope(run.id).mailbox("consumed").consume(
        handle, concurrency=1, lease_seconds=30, stop_event=stop))
    try:
        await tasks(0)  # warm
        calls = await _counted(lambda: tasks(TASKS))
    finally:
        stop.set()
        await consumer
    coroutines = len(calls.coroutines) / TASKS
    assert coroutines <= MOST_COROUTINES_PER_CONSUMED_TASK, (
        f"{coroutines:g} SDK coroutines per task of the planner's submit and consume() "
        f"(at most {MOST_COROUTINES_PER_CONSUMED_TASK})"
    )
    assert calls.count / TASKS <= MOST_PER_CONSUMED_TASK, (
        f"{calls.count / TASKS:g} SDK calls per task of the planner's submit and consume() "
        f"(at most {MOST_PER_CONSUMED_TASK})"
    )
