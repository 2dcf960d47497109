"""``mailbox.submit_and_wait`` (protocol.md, TASK_RESULT, "Submit and wait in one write"):
a keyed submit and the wait for its result are sent together and answered in order, the
wait naming the task by key. It returns the task's final view; a refused submit raises
its own error and leaves no wait parked on the server; a timeout ends only the wait.
(What it saves is measured by ``python -m bench.tasks``, never asserted here.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from rsclient import AsyncRunstate, ConflictError, UnavailableError, WaitTimeoutError

MakeClient = Callable[..., AsyncRunstate]
# Each test works in a run of its own, ensures mailbox "jobs" alike and leaves no wait
# parked (two of them check the server's count of waits): they share one rsd
# (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module


async def _waits(client: AsyncRunstate) -> int:
    return int((await client.server_stats())["core"]["waits"])


async def test_submit_and_wait_returns_the_final_view_of_the_task_it_submitted(
    clients: MakeClient,
) -> None:
    planner, worker = clients("planner"), clients("worker")
    await planner.mailboxes.ensure("jobs")
    run = await planner.scopes.create()
    box = run.mailbox("jobs")

    async def work() -> None:
        delivery = None
        while delivery is None:
            delivery = await worker.scope(run.id).mailbox("jobs").receive(wait=True)
        await delivery.complete(result={"payload": {"got": delivery.data}})

    worker_task = asyncio.create_task(work())
    view = await box.submit_and_wait({"n": 1}, key="k", timeout_ms=10_000)
    await worker_task
    assert view["state"] == "SUCCEEDED" and view["outcome"] == {"got": {"n": 1}}
    assert view["id"] == (await box.submit({"n": 1}, key="k")).id
    # The same key again: the finished task's view at once, nothing run twice.
    again = await box.submit_and_wait({"n": 1}, key="k", timeout_ms=0)
    assert again["id"] == view["id"] and again["outcome"] == view["outcome"]
    assert await _waits(planner) == 0


async def test_a_refused_submit_raises_and_leaves_no_wait_parked(clients: MakeClient) -> None:
    planner = clients("planner")
    await planner.mailboxes.ensure("jobs")
    box = (await planner.scopes.create()).mailbox("jobs")
    await box.submit({"n": 1}, key="k")
    with pytest.raises(ConflictError):  # the key names a task with other input
        await box.submit_and_wait({"n": 2}, key="k", timeout_ms=60_000)
    for _ in range(50):  # the CANCEL that withdrew the wait has been answered
        if await _waits(planner) == 0:
            break
        await asyncio.sleep(0.02)
    assert await _waits(planner) == 0


async def test_a_timeout_ends_only_the_wait(clients: MakeClient) -> None:
    planner = clients("planner")
    await planner.mailboxes.ensure("jobs")
    run = await planner.scopes.create()
    box = run.mailbox("jobs")
    with pytest.raises(WaitTimeoutError):
        await box.submit_and_wait({"n": 1}, key="k", timeout_ms=50)
    ticket = await box.submit({"n": 1}, key="k")
    assert (await ticket.status())["state"] == "PENDING"


async def test_without_a_key_it_is_submit_then_result(clients: MakeClient) -> None:
    planner = clients("planner")
    await planner.mailboxes.ensure("jobs")
    box = (await planner.scopes.create()).mailbox("jobs")
    got: list[Any] = []

    async def work() -> None:
        delivery = await box.receive(wait=True, timeout_ms=10_000)
        assert delivery is not None
        got.append(delivery.id)
        await delivery.complete(result={"payload": 7})

    worker_task = asyncio.create_task(work())
    view = await box.submit_and_wait("x", timeout_ms=10_000)
    await worker_task
    assert view["outcome"] == 7 and got == [view["id"]]


async def test_a_pair_lost_on_the_way_is_sent_again_with_the_very_same_input(
    clients: MakeClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pair's connection lost (UnavailableError): the keyed submit is sent again with
    every field it had, delay and priority and fairness key included (priority is part of
    the task's input), so it joins its task instead of meeting IDEMPOTENCY_CONFLICT."""
    planner, worker = clients("planner"), clients("worker")
    await planner.mailboxes.ensure("jobs")
    run = await planner.scopes.create()
    box = run.mailbox("jobs")
    session = box._session
    sent = session.request_then_wait

    async def lost(*args: Any, **kwargs: Any) -> Any:
        await sent(*args, **kwargs)  # it reached rsd: the task exists
        raise UnavailableError("the connection was lost")

    monkeypatch.setattr(session, "request_then_wait", lost)

    async def work() -> None:
        delivery = None
        while delivery is None:
            delivery = await worker.scope(run.id).mailbox("jobs").receive(wait=True)
        await delivery.complete(result={"payload": "done"})

    worker_task = asyncio.create_task(work())
    view = await box.submit_and_wait({"n": 1}, key="k", timeout_ms=10_000, priority=7,
                                     fairness_key="customer-1")
    await worker_task
    assert view["state"] == "SUCCEEDED" and view["outcome"] == "done"
    assert view["id"] == (await box.submit({"n": 1}, key="k", priority=7)).id
