"""The SDK adds no task per request: a coroutine run under a lease (``claim.run``, a
consume() handler) runs in its caller's own task, is still cancelled the moment the lease
is lost, and leaves no cancellation behind in that task; consume() keeps at most
``concurrency`` slot tasks whatever the number of deliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from rsclient import AsyncRunstate, Delivery, LeaseLostError
from rsclient.leases import declare_lost
from rsclient.runner import run_while_held

MakeClient = Callable[..., AsyncRunstate]
# Each test works in a run of its own, so they share one rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module


async def test_a_loss_seen_by_the_function_itself_cancels_it_at_its_next_await(
    clients: MakeClient,
) -> None:
    run = await clients("alice").scopes.create()
    lease = await run.claim("k").acquire()
    reached: list[str] = []

    async def work(held: Any) -> None:
        reached.append("started")
        declare_lost(held, "lost while the function looked")  # from inside the task
        reached.append("runs on to its next await")
        await asyncio.sleep(5)
        reached.append("never")

    with pytest.raises(LeaseLostError):
        await asyncio.wait_for(run_while_held(work, (lease,), lease), 2)
    assert reached == ["started", "runs on to its next await"]
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.01)  # a cancellation left behind would be raised here


async def test_a_function_that_returns_right_after_a_loss_leaves_no_cancellation(
    clients: MakeClient,
) -> None:
    run = await clients("alice").scopes.create()
    lease = await run.claim("k").acquire()

    async def work(held: Any) -> str:
        declare_lost(held, "lost")
        return "done without awaiting"

    with pytest.raises(LeaseLostError):
        await run_while_held(work, (lease,), lease)
    await asyncio.sleep(0.01)  # the runner's deferred cancel must not reach this await
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_loss_from_outside_cancels_the_function_and_raises_lease_lost(
    clients: MakeClient,
) -> None:
    run = await clients("alice").scopes.create()
    lease = await run.claim("k").acquire()
    asyncio.get_running_loop().call_later(0.05, declare_lost, lease, "the server ended it")
    cancelled: list[bool] = []

    async def work(held: Any) -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(LeaseLostError):
        await asyncio.wait_for(run_while_held(work, (lease,), lease), 2)
    assert cancelled == [True]
    await asyncio.sleep(0.01)


async def test_a_function_that_swallows_the_loss_still_ends_in_lease_lost(
    clients: MakeClient,
) -> None:
    run = await clients("alice").scopes.create()
    lease = await run.claim("k").acquire()
    asyncio.get_running_loop().call_later(0.05, declare_lost, lease, "the server ended it")

    async def work(held: Any) -> str:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(5)
        return "swallowed"

    with pytest.raises(LeaseLostError):
        await asyncio.wait_for(run_while_held(work, (lease,), lease), 2)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.01)


async def test_cancelling_the_caller_is_a_cancellation_not_a_loss(clients: MakeClient) -> None:
    run = await clients("alice").scopes.create()
    lease = await run.claim("k").acquire()
    started = asyncio.Event()

    async def work(held: Any) -> None:
        started.set()
        await asyncio.sleep(5)

    caller = asyncio.create_task(run_while_held(work, (lease,), lease))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert not lease.is_lost
    await lease.release()


async def test_consume_keeps_at_most_concurrency_slot_tasks(clients: MakeClient) -> None:
    """Tasks submitted one at a time: every settlement finds the queue empty, so each
    delivery reaches the consumer through its receiver, never in a new task."""
    rs, planner = clients("worker"), clients("planner")
    await rs.mailboxes.ensure("jobs")
    run = await rs.scopes.create()
    box = run.mailbox("jobs")
    loop = asyncio.get_running_loop()
    slots: list[asyncio.Task[Any]] = []
    original = loop.get_task_factory()

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Future[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        if getattr(coro, "__qualname__", "") == "Worker._slot":
            slots.append(task)
        return task

    async def handler(data: Any, delivery: Delivery) -> None:
        await asyncio.sleep(0.001)

    stop = asyncio.Event()
    loop.set_task_factory(factory)
    try:
        consuming = asyncio.create_task(box.consume(handler, concurrency=4, stop_event=stop))
        mine = planner.scope(run.id).mailbox("jobs")
        for n in range(20):  # one at a time: each one's settlement finds nothing next
            ticket = await mine.submit({"n": n}, key=f"t{n}")
            assert (await ticket.result(timeout_ms=10_000))["state"] == "SUCCEEDED"
        stop.set()
        await asyncio.wait_for(consuming, 10)
    finally:
        loop.set_task_factory(original)
    assert 1 <= len(slots) <= 4, f"{len(slots)} slot tasks for 20 deliveries"
