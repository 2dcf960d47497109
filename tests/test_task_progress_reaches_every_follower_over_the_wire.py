"""Over the wire, with the Python SDK: ``await delivery.progress(data)`` inside a handler
reaches every ``async for event in ticket.events():`` of the task, the retained events
first, the outcome last; a follower re-attached by task id (another process) gets what is
retained; one whose connection is lost subscribes again after the last seq it saw and
misses nothing; a follower of a task that never publishes progress sees its state
changes (WAITING and its wake); a settled delivery's progress is refused
(LeaseLostError) and an oversized one is INVALID_ARGUMENT. The rules are the core's
(tests/test_core_progress_events_are_retained_bounded_fenced_and_replayed.py); this
file's reason to exist is the SDK's iterator, its resubscription and the pushes of a
real process. One rsd for the module.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from rsclient import AsyncRunstate, InvalidArgumentError, LeaseLostError
from rsclient.progress import TaskEvent

pytestmark = pytest.mark.rsd_per_module


async def collect(events: object) -> list[TaskEvent]:
    return [event async for event in events]  # type: ignore[attr-defined]


async def next_of(events: AsyncIterator[TaskEvent]) -> TaskEvent:
    """The next event (failing, not hanging, when none comes)."""
    return await asyncio.wait_for(anext(events), 30)


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
    iterators = [ticket.events(), watcher.scope(run.id).task(ticket.id).events()]
    # Both follow before the work starts: the first event says where the task was then.
    firsts = [await next_of(events) for events in iterators]
    followers = [asyncio.ensure_future(collect(events)) for events in iterators]
    delivery = await worker.scope(run.id).mailbox("jobs").receive(wait=True)
    assert delivery is not None
    seqs = [await delivery.progress({"step": n}) for n in range(3)]
    assert seqs == [3, 4, 5]  # seq 1: PENDING when first followed, 2: RUNNING
    await delivery.complete({"payload": "answer"})
    expected = [
        ("state", "PENDING", 0), ("state", "RUNNING", 1), ("progress", {"step": 0}),
        ("progress", {"step": 1}), ("progress", {"step": 2}),
        ("outcome", "SUCCEEDED", "answer"),
    ]
    results = await asyncio.wait_for(asyncio.gather(*followers), 30)
    for got in ([first, *rest] for first, rest in zip(firsts, results, strict=True)):
        assert [shape(event) for event in got] == expected
        assert [event.seq for event in got] == [1, 2, 3, 4, 5, 6]
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


async def test_a_follower_of_a_task_that_never_publishes_sees_it_wait_and_wake(
    clients: Callable[..., AsyncRunstate],
) -> None:
    planner, worker = clients("planner"), clients("worker")
    await worker.mailboxes.ensure("jobs")
    run = await planner.scopes.create()
    ticket = await run.mailbox("jobs").submit({"draft": "a reply"})
    events = ticket.events()
    first = await next_of(events)  # its first follower: where the task is
    assert shape(first) == ("state", "PENDING", 0)
    jobs = worker.scope(run.id).mailbox("jobs")
    delivery = await jobs.receive(wait=True)
    assert delivery is not None
    await delivery.suspend("approval", timeout_seconds=3600)
    seen = [await next_of(events), await next_of(events)]
    assert [shape(event) for event in seen] == [("state", "RUNNING", 1), ("state", "WAITING", 0)]
    await planner.scope(run.id).task(ticket.id).signal("approval", {"ok": True})
    delivery = await jobs.receive(wait=True)
    assert delivery is not None and delivery.signal == {"name": "approval", "data": {"ok": True}}
    await delivery.complete({"payload": "sent"})
    rest = await asyncio.wait_for(collect(events), 30)
    assert [shape(event) for event in rest] == [
        ("state", "PENDING", 0), ("state", "RUNNING", 1), ("outcome", "SUCCEEDED", "sent"),
    ]
    assert [event.seq for event in [first, *seen, *rest]] == [1, 2, 3, 4, 5, 6]
