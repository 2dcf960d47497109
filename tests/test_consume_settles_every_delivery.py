"""consume() settles every delivery it takes, whatever its handler raises or the connection
does: a handler's error is a retry whatever its message (non-ASCII, undecodable file
names), a handler raising CancelledError does not cost its slot, and a completion lost
with the connection is sent again on the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from support.aio import (
    equals,
    eventually_true,
    own_client,
    stop_task,
)
from support.process import Rsd

from rsclient import (
    AsyncRunstate,
    Delivery,
    WaitTimeoutError,
)

MakeClient = Callable[..., AsyncRunstate]
Eventually = Callable[..., Awaitable[None]]
# Each test works in runs of its own (and mailboxes it ensures itself), so they share one
# rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module


async def state_of(ticket: Any) -> str:
    return (await ticket.status())["state"]


@contextlib.asynccontextmanager
async def consuming(box: Any, handler: Any, **options: Any) -> AsyncIterator[asyncio.Task[Any]]:
    stop = asyncio.Event()
    task = asyncio.create_task(box.consume(handler, stop_event=stop, **options))
    try:
        yield task
    finally:
        stop.set()
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            await stop_task(task)


async def test_a_handler_error_with_a_non_ascii_message_is_retried(clients: MakeClient) -> None:
    rs = clients("worker")
    await rs.mailboxes.ensure("jobs", retry_backoff_ms=0)
    run = await rs.scopes.create()
    ticket = await run.mailbox("jobs").submit({"n": 1}, key="t")
    errors: list[str] = []

    async def handler(data: Any, delivery: Delivery) -> None:
        if delivery.attempt == 1:
            raise ValueError("é" * 600)  # 600 characters, 1200 UTF-8 bytes

    async with consuming(run.mailbox("jobs"), handler, on_error=lambda e, d: errors.append(str(e))):
        with contextlib.suppress(WaitTimeoutError):
            await ticket.result(timeout_ms=600)
    assert len(errors) == 1
    view = await ticket.status()
    assert (view["state"], view["attempt"]) == ("SUCCEEDED", 2)


async def test_a_completion_lost_with_the_connection_is_not_left_hanging(
    restartable: Rsd, clients: MakeClient, eventually: Eventually
) -> None:
    planner = clients("planner", restartable.address)
    await planner.mailboxes.ensure("jobs")
    run = await planner.scopes.create()
    ticket = await run.mailbox("jobs").submit({"n": 1}, key="t")

    async def handler(data: Any, delivery: Delivery) -> None:
        await restartable.stop()  # the server goes away while the handler finishes

    async with (
        own_client("worker", restartable.address, connect_timeout=0.3) as rs,
        consuming(rs.scope(run.id).mailbox("jobs"), handler, lease_seconds=10),
    ):
        await eventually_true(lambda: not restartable.alive)
        await asyncio.sleep(0.6)  # complete() gives up after connect_timeout
        await restartable.start()
        # settled by the completion sent again on the new connection: well within the
        # 10 s lease, after which the task would be delivered again instead
        await eventually(lambda: equals(state_of(ticket), "SUCCEEDED"), timeout=5.0)


async def test_a_handler_raising_cancelled_error_does_not_kill_its_slot(
    clients: MakeClient,
) -> None:
    rs = clients("worker")
    await rs.mailboxes.ensure("jobs", retry_backoff_ms=0)
    run = await rs.scopes.create()
    first = await run.mailbox("jobs").submit({"n": 1}, key="first")
    second = await run.mailbox("jobs").submit({"n": 2}, key="second")

    async def handler(data: Any, delivery: Delivery) -> None:
        if data["n"] == 1 and delivery.attempt == 1:
            gone = asyncio.get_running_loop().create_future()
            gone.cancel()  # e.g. a shared fetch that another part of the app cancelled
            await gone

    async with consuming(run.mailbox("jobs"), handler, concurrency=1):
        with contextlib.suppress(WaitTimeoutError):
            await second.result(timeout_ms=800)
            await first.result(timeout_ms=800)
    assert await state_of(second) == "SUCCEEDED"
    assert await state_of(first) == "SUCCEEDED"


async def test_a_handler_error_about_an_undecodable_file_name_is_retried(
    clients: MakeClient,
) -> None:
    rs = clients("worker")
    await rs.mailboxes.ensure("jobs", retry_backoff_ms=0)
    run = await rs.scopes.create()
    ticket = await run.mailbox("jobs").submit({"n": 1}, key="t")
    # How Python spells a file name that is not UTF-8 (os.listdir, sys.argv, ...).
    name = os.fsdecode(b"/data/report-\xff.csv")

    async def handler(data: Any, delivery: Delivery) -> None:
        if delivery.attempt == 1:
            raise ValueError(f"cannot parse {name}")

    async with consuming(run.mailbox("jobs"), handler):
        with contextlib.suppress(WaitTimeoutError):
            await ticket.result(timeout_ms=800)
    view = await ticket.status()
    assert (view["state"], view["attempt"]) == ("SUCCEEDED", 2)
