"""Over the wire, with the Python SDK: ``await delivery.progress(data)`` inside a handler
reaches every ``async for event in ticket.events():`` of the task, the retained events
first, the outcome last; a follower re-attached by task id (another process) gets what is
retained; one whose connection is lost subscribes again after the last seq it saw and
misses nothing; a settled delivery's progress is refused (LeaseLostError) and an
oversized one is INVALID_ARGUMENT. The rules are the core's
(tests/test_core_progress_events_are_retained_bounded_fenced_and_replayed.py); this
file's reason to exist is the SDK's iterator, its resubscription and the pushes of a
real process. One rsd for the module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from rsclient import AsyncRunstate, InvalidArgumentError, LeaseLostError
from rsclient.progress import TaskEvent

pytestmark = pytest.mark.rsd_per_module


async def collect(events: object) -> list[TaskEvent]:
    return [event async for event in events]  # type: ignore[attr-defined]


def shape(event: TaskEvent) -> tuple[object, ...]:
    if event.kind == "progress":
        return ("progress", event.data)
    if event.kind == "state":
        return ("state", event.state, event.attempt)
    return ("outcome", event.state, event.outcome)


async def test_every_follower_gets_the_progress_then_the_outcome(
    clients: Callable[..., AsyncRunstate],
) -> None:
    planner, watcher, worker = clients("planner"), clients("watcher"), clients("worker")
    await planner.mailboxes.ensure("jobs")
    run = await planner.scopes.create()
    ticket = await run.mailbox("jobs").submit({"question": 1})
    followers = [
        asyncio.ensure_future(collect(ticket.events())),
        asyncio.ensure_future(collect(watcher.scope(run.id).task(ticket.id).events())),
    ]
    delivery = await worker.scope(run.id).mailbox("jobs").receive(wait=True)
    assert delivery is not None
    seqs = [await delivery.progress({"step": n}) for n in range(3)]
    assert seqs == [2, 3, 4]  # seq 1: where the task was at its first event (RUNNING)
    await delivery.complete({"payload": "answer"})
    expected = [
        ("state", "RUNNING", 1), ("progress", {"step": 0}), ("progress", {"step": 1}),
        ("progress", {"step": 2}), ("outcome", "SUCCEEDED", "answer"),
    ]
    for got in await asyncio.wait_for(asyncio.gather(*followers), 30):
        assert [shape(event) for event in got] == expected
        assert [event.seq for event in got] == [1, 2, 3, 4, 5]
        assert all(event.missed == 0 for event in got)
    # Settled: no more progress. Oversized: refused.
    with pytest.raises(LeaseLostError):
        await delivery.progress("late")
    # A process that comes later, with nothing but the ids, gets the retained events.
    async with AsyncRunstate(holder="later", address=planner.address) as later:
        again = await collect(later.scope(run.id).task(ticket.id).events(after=3))
        assert [shape(event) for event in again] == expected[3:]


async def test_an_oversized_event_is_refused_and_the_delivery_goes_on(
    clients: Callable[..., AsyncRunstate],
) -> None:
    rs = clients("worker")
    await rs.mailboxes.ensure("jobs")
    run = await rs.scopes.create()
    ticket = await run.mailbox("jobs").submit(None)
    delivery = await run.mailbox("jobs").receive()
    assert delivery is not None
    with pytest.raises(InvalidArgumentError, match="max_event_bytes"):
        await delivery.progress("x" * (64 * 1024))
    assert await delivery.progress("fits") == 2
    await delivery.complete()
    got = await collect(ticket.events())
    assert [shape(event) for event in got][-2:] == [
        ("progress", "fits"), ("outcome", "SUCCEEDED", None),
    ]


async def test_a_follower_whose_connection_is_lost_resumes_after_its_last_seq(
    clients: Callable[..., AsyncRunstate],
) -> None:
    watcher, worker = clients("watcher"), clients("worker")
    await worker.mailboxes.ensure("jobs")
    run = await worker.scopes.create()
    ticket = await run.mailbox("jobs").submit(None)
    delivery = await run.mailbox("jobs").receive()
    assert delivery is not None
    await delivery.progress("before")
    events = watcher.scope(run.id).task(ticket.id).events()
    first = [await anext(events), await anext(events)]
    assert [shape(event) for event in first] == [("state", "RUNNING", 1), ("progress", "before")]
    transport = watcher._conn._proto.transport  # type: ignore[attr-defined]
    transport.abort()  # the connection is lost; its subscription with it
    await delivery.progress("while away")
    await delivery.progress("after")
    await delivery.complete({"payload": 7})
    rest = await asyncio.wait_for(collect(events), 30)
    assert [shape(event) for event in rest] == [
        ("progress", "while away"), ("progress", "after"), ("outcome", "SUCCEEDED", 7),
    ]
    assert [event.seq for event in rest] == [3, 4, 5]
