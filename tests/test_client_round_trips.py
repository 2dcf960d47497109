"""Fewer round trips in the Python SDK, against a real rsd: ``submit_many``,
``receive_many``, settling with ``take_next``, ``submit(slim=True)``, consume() on
batched receives and settle-and-next, and the early write of queued frames.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from rsclient import AsyncRunstate, ConflictError, Delivery, InvalidArgumentError, Ticket
from rsclient import connection as connection_module
from rsproto import Limits

MakeClient = Callable[..., AsyncRunstate]
# Each test works in a run of its own, so they share one rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module
Eventually = Callable[..., Awaitable[None]]


async def _box(rs: AsyncRunstate) -> Any:
    await rs.mailboxes.ensure("jobs")
    run = await rs.scopes.create()
    return run.mailbox("jobs")


async def test_submit_many_gives_a_ticket_or_an_error_per_item(clients: MakeClient) -> None:
    rs = clients("planner")
    box = await _box(rs)
    await box.submit({"n": 0}, key="taken")
    answers = await box.submit_many([
        {"data": {"n": 1}, "key": "a"},
        {"data": {"n": 2}, "key": "taken"},  # other input under a used key
        {"data": {"n": 1}, "key": "a"},  # joins the first
        {"data": None},
    ])
    first, conflict, joined, plain = answers
    assert isinstance(first, Ticket) and first.created
    assert isinstance(conflict, ConflictError) and conflict.code == "IDEMPOTENCY_CONFLICT"
    assert isinstance(joined, Ticket) and joined.id == first.id and not joined.created
    assert isinstance(plain, Ticket) and plain.view["state"] == "PENDING"
    assert (await first.status())["key"] == "a"
    assert (await box.inspect())["ready"] == 3  # the joined and the conflict made none


async def test_submit_many_splits_into_requests_of_the_batch_limit(clients: MakeClient) -> None:
    rs = clients("planner")
    box = await _box(rs)
    count = Limits.MAX_SUBMIT_BATCH * 2 + 3
    answers = await box.submit_many({"data": n} for n in range(count))
    assert len({t.id for t in answers if isinstance(t, Ticket)}) == count
    assert (await box.inspect())["ready"] == count


async def test_submit_many_cuts_large_items_into_requests_that_fit_a_frame(
    clients: MakeClient,
) -> None:
    rs = clients("planner")
    box = await _box(rs)
    big = "x" * (200 * 1024)  # five of these pass the frame limit together
    huge = "y" * (Limits.MAX_FRAME_BYTES + 1)  # alone over it: refused, never sent
    answers = await box.submit_many(
        [{"data": big} for _ in range(5)] + [{"data": huge}, {"data": 1}]
    )
    assert all(isinstance(t, Ticket) for t in answers[:5] + answers[6:])
    assert isinstance(answers[5], InvalidArgumentError)
    assert (await box.inspect())["ready"] == 6
    assert await rs.ping()  # the connection is still there


@pytest.mark.parametrize("bad", [[{"key": "no data"}], [5], [{"data": 1, "scope": "x"}]])
async def test_submit_many_refuses_malformed_items_before_sending(
    clients: MakeClient, bad: list[Any]
) -> None:
    box = await _box(clients("planner"))
    with pytest.raises(InvalidArgumentError, match="items\\[0\\]"):
        await box.submit_many(bad)


async def test_slim_submit_keeps_the_id_state_and_created(clients: MakeClient) -> None:
    box = await _box(clients("planner"))
    ticket = await box.submit({"n": 1}, key="k", slim=True)
    assert ticket.view == {"id": ticket.id, "state": "PENDING", "created": True}
    assert (await box.submit({"n": 1}, key="k", slim=True)).created is False


async def test_receive_many_and_settle_with_take_next(clients: MakeClient) -> None:
    rs = clients("worker")
    box = await _box(rs)
    tickets = await box.submit_many([{"data": n} for n in range(5)])
    got = await box.receive_many(3)
    assert [d.data for d in got] == [0, 1, 2]
    nxt = await got[0].complete(result={"payload": "ok"}, take_next=2)
    assert [d.data for d in nxt] == [3, 4]
    again = await got[1].retry(delay_ms=0, take_next=1)  # back at once: taken again
    assert [(d.data, d.attempt) for d in again] == [(1, 2)]
    for delivery in [got[2], *nxt, *again]:
        await delivery.complete()
    assert await box.receive_many(5) == []
    view = await tickets[0].result(timeout_ms=5_000)  # type: ignore[union-attr]
    assert view["outcome"] == "ok"
    with pytest.raises(InvalidArgumentError):
        await box.receive_many(Limits.MAX_RECEIVE_BATCH + 1)


async def test_consume_never_runs_more_than_concurrency_and_runs_each_once(
    clients: MakeClient,
) -> None:
    rs = clients("worker")
    box = await _box(rs)
    total, concurrency = 60, 4
    await box.submit_many([{"data": n} for n in range(total)])
    seen: list[int] = []
    running = 0
    most = 0
    done = asyncio.Event()

    async def handler(data: int, delivery: Delivery) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001)
        running -= 1
        seen.append(data)
        if len(seen) == total:
            done.set()

    stop = asyncio.Event()
    consumer = asyncio.create_task(box.consume(handler, concurrency=concurrency, stop_event=stop))
    await asyncio.wait_for(done.wait(), 20)
    stop.set()
    await asyncio.wait_for(consumer, 10)
    assert sorted(seen) == list(range(total))
    assert most == concurrency  # every slot used, never more
    counts = await box.inspect()
    assert (counts["ready"], counts["running"], counts["consumers"]) == (0, 0, 0)


async def test_consume_hands_back_next_deliveries_that_arrive_when_stopping(
    clients: MakeClient,
) -> None:
    """A stop asked while handlers run: nothing more is taken, what runs finishes, and
    the queue keeps the rest, attempts unused."""
    rs = clients("worker")
    box = await _box(rs)
    tickets = await box.submit_many([{"data": n} for n in range(10)])
    stop = asyncio.Event()
    started = asyncio.Event()

    async def handler(data: int, delivery: Delivery) -> None:
        started.set()
        stop.set()
        await asyncio.sleep(0.05)

    await asyncio.wait_for(box.consume(handler, concurrency=2, stop_event=stop), 10)
    assert started.is_set()
    counts = await box.inspect()
    assert counts["running"] == 0 and counts["consumers"] == 0
    states = [(await t.status())["state"] for t in tickets]  # type: ignore[union-attr]
    assert states.count("SUCCEEDED") <= 2
    assert states.count("SUCCEEDED") + states.count("PENDING") == 10
    for t in tickets:
        view = await t.status()  # type: ignore[union-attr]
        if view["state"] == "PENDING":
            assert view["attempt"] == 0


async def test_queued_frames_leave_early_once_write_at_frames_are_queued(
    clients: MakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    rs = clients("pinger")
    await rs.scopes.create()  # connected
    conn = rs._conn
    proto = conn._proto
    assert proto is not None and proto.transport is not None
    writes: list[int] = []
    real_write = proto.transport.write

    def counting_write(data: bytes) -> None:
        writes.append(len(data))
        real_write(data)

    monkeypatch.setattr(proto.transport, "write", counting_write)
    count = connection_module.WRITE_AT_FRAMES * 3 + 1
    await asyncio.gather(*(rs.ping() for _ in range(count)))
    # Three early writes of WRITE_AT_FRAMES frames, then the rest at the end of the turn.
    assert len(writes) == 4
