"""Work never runs on without its lease: when a lease is lost (the run or the task is
cancelled, the client is closed), the code holding it learns at once, and a coroutine
running under it is cancelled; a plain function in a worker thread runs to its end but
its caller is told straight away.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.aio import (
    Hang,
    eventually_true,
    now,
    stop_task,
)

from rsclient import (
    AsyncRunstate,
    LeaseLostError,
)

MakeClient = Callable[..., AsyncRunstate]
Eventually = Callable[..., Awaitable[None]]
# Each test works in runs of its own (and pools, quotas and mailboxes under names that
# mean the same wherever they recur), so they share one rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module


async def test_close_tells_a_running_claim_that_its_lease_ended(clients: MakeClient) -> None:
    rs, other = clients("alice"), clients("bob")
    run = await rs.scopes.create()
    started, finish = asyncio.Event(), asyncio.Event()
    leases: list[Any] = []

    async def work(lease: Any) -> str:
        leases.append(lease)
        started.set()
        await finish.wait()
        lease.raise_if_lost()
        return "wrote the report"

    running = asyncio.create_task(run.claim("file:report.md").run(work))
    await asyncio.wait_for(started.wait(), 5)
    await rs.close()
    theirs = await other.scope(run.id).claim("file:report.md").acquire()  # the key is free
    try:
        assert leases[0].is_lost or running.done(), "the work runs on without its lease"
    finally:
        finish.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(running, 5)
        await theirs.release()


async def test_a_plain_function_loses_its_claim_when_the_run_is_cancelled(
    clients: MakeClient,
) -> None:
    """Scope cancellation pushes LEASE_LOST: run() stops waiting for the worker thread and
    raises LeaseLostError at once; the thread runs to completion."""
    rs, boss = clients("alice"), clients("boss")
    run = await rs.scopes.create()
    loop = asyncio.get_running_loop()
    entered, leave = threading.Event(), threading.Event()
    finished: list[bool] = []

    def work(lease: Any) -> None:
        entered.set()
        leave.wait(5)
        finished.append(lease.is_lost)

    running = asyncio.create_task(run.claim("k").run(work))
    assert await loop.run_in_executor(None, entered.wait, 5)
    cancelled_at = now()
    await boss.scope(run.id).cancel("stop everything")
    with pytest.raises(LeaseLostError) as lost:
        await asyncio.wait_for(running, 2)
    assert now() - cancelled_at < 1.0
    assert lost.value.code == "STALE_CLAIM"
    assert "scope cancelled" in lost.value.message
    leave.set()
    await eventually_true(lambda: bool(finished))
    assert finished == [True]


async def test_a_lambda_returning_a_coroutine_is_cancelled_when_the_lease_is_lost(
    clients: MakeClient,
) -> None:
    rs, boss = clients("alice"), clients("boss")
    run = await rs.scopes.create()
    research = Hang()
    started, cancelled = research.started, research.cancelled

    running = asyncio.create_task(run.claim("k").run(lambda lease: research(lease, "acme")))
    try:
        await asyncio.wait_for(started.wait(), 5)
        await boss.scope(run.id).cancel("stop everything")  # LEASE_LOST "scope cancelled"
        done, _ = await asyncio.wait({running}, timeout=5)  # (a hang lasts for ever)
        assert running in done, "run() still waits for the coroutine 5 s after the loss"
        assert isinstance(running.exception(), LeaseLostError)
        assert cancelled.is_set()
    finally:
        await stop_task(running)


async def test_a_received_delivery_learns_that_its_task_was_cancelled(
    clients: MakeClient,
) -> None:
    planner, worker = clients("planner"), clients("worker")
    await planner.mailboxes.ensure("jobs")
    run = await planner.scopes.create()
    ticket = await run.mailbox("jobs").submit({"n": 1}, key="t")
    delivery = await worker.scope(run.id).mailbox("jobs").receive()
    assert delivery is not None
    await ticket.cancel("not needed")  # rsd pushes LEASE_LOST "cancelled" to the worker
    await worker.ping()  # the push came before this reply
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(delivery.lease.lost_event.wait(), 0.5)
    assert delivery.is_lost
    with pytest.raises(LeaseLostError):
        await delivery.complete()
