"""Task groups, run status and whole run cancellation end to end: the SDKs against a real rsd.

Covers what a user relies on: ``run.group(name).wait(need=K)`` returns when the K-th
task succeeds (pushed, while workers run), with ``cancel_rest`` ending the others;
an unreachable need is reported at once; ``run.status()`` counts; a cancelled run stops
its consumers, refuses a late completion with ScopeCancelledError, frees its pool slot
for another run's waiter, and refuses new work; the sync client mirrors the calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support.aio import Hang, now

from rsclient import AsyncRunstate, Delivery, InvalidArgumentError, ScopeCancelledError
from rsclient.sync import Runstate

MakeClient = Callable[..., AsyncRunstate]
# Each test works in runs of its own (and pools, quotas and mailboxes under names that
# mean the same wherever they recur), so they share one rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module


async def test_a_group_wait_for_k_returns_when_k_tasks_succeed_and_cancels_the_rest(
    clients: MakeClient,
) -> None:
    boss, rs = clients("boss"), clients("worker")
    await boss.mailboxes.ensure("jobs")
    run = await boss.scopes.create()
    box = run.mailbox("jobs")
    tickets = [await box.submit({"n": n}, key=f"k{n}", group="batch-1") for n in range(6)]
    await box.submit({"n": 99}, key="outside")  # not in the group: untouched
    waiting = asyncio.create_task(run.group("batch-1").wait(need=2, cancel_rest=True))
    await asyncio.sleep(0.05)
    assert not waiting.done()

    worker_box = rs.scope(run.id).mailbox("jobs")
    done_at: list[float] = []
    for _ in range(2):
        delivery = await worker_box.receive()
        assert delivery is not None
        await delivery.complete(result={"payload": {"done": delivery.data["n"]}})
        done_at.append(now())
    result = await asyncio.wait_for(waiting, 5)
    print(f"\ngroup wait answered {(now() - done_at[-1]) * 1000:.1f} ms after the 2nd success")
    assert result["reached"] is True and result["need"] == 2
    assert [d["outcome"] for d in result["done"]] == [{"done": 0}, {"done": 1}]
    assert [d["id"] for d in result["done"]] == [t.id for t in tickets[:2]]
    assert result["cancelled"] == 4
    assert result["counts"] == {"SUCCEEDED": 2, "CANCELLED": 4}
    last = await tickets[5].result(timeout_ms=1_000)
    assert last["state"] == "CANCELLED" and "batch-1" in last["reason"]
    assert await run.group("batch-1").status() == {
        "group": "batch-1", "tasks": 6, "counts": {"SUCCEEDED": 2, "CANCELLED": 4},
        "succeeded": 2, "unfinished": 0, "waiters": 0,
    }
    status = await run.status()
    assert status["state"] == "open"
    assert status["tasks"] == {"SUCCEEDED": 2, "CANCELLED": 4, "PENDING": 1}

    # A need that cannot be reached any more is answered at once, with the counts.
    missed = await asyncio.wait_for(run.group("batch-1").wait(need=3), 2)
    assert missed["reached"] is False and "can reach at most 2" in missed["why"]
    with pytest.raises(InvalidArgumentError):
        await run.group("batch-1").wait(need=0)


async def test_a_cancelled_run_stops_its_consumers_refuses_a_late_completion_and_frees_slots(
    clients: MakeClient,
) -> None:
    boss, rs, other = clients("boss"), clients("worker"), clients("other")
    await boss.mailboxes.ensure("jobs")
    await boss.pools.ensure("gpu", size=1)
    run = await boss.scopes.create()
    other_run = await other.scopes.create()
    await run.mailbox("jobs").submit({"n": 1}, key="by-hand")
    await run.mailbox("jobs").submit({"n": 2}, key="consumed")
    by_hand = await rs.scope(run.id).mailbox("jobs").receive()
    assert by_hand is not None
    hang = Hang()
    consumer = asyncio.create_task(rs.scope(run.id).mailbox("jobs").consume(hang))
    await asyncio.wait_for(hang.started.wait(), 5)
    slot = await rs.scope(run.id).pool("gpu").acquire()
    other_wait = asyncio.create_task(
        other.scope(other_run.id).pool("gpu").acquire(wait=True, timeout_ms=10_000)
    )
    await asyncio.sleep(0.05)
    assert (await run.status())["slots"] == 1 and (await run.status())["claims"] == 0

    reply = await boss.scopes.cancel(run.id, "budget spent")
    assert (reply["tasks"], reply["slots"]) == (2, 1)
    assert await asyncio.wait_for(consumer, 5) is None  # consume() stops cleanly
    assert hang.cancelled.is_set()
    with pytest.raises(ScopeCancelledError) as late:
        await by_hand.complete(result={"payload": "too late"})
    assert "budget spent" in late.value.message
    granted = await asyncio.wait_for(other_wait, 5)  # the freed slot went to another run
    await asyncio.wait_for(slot.lost_event.wait(), 5)
    await granted.release()

    status = await run.status()
    assert (status["state"], status["reason"]) == ("cancelled", "budget spent")
    assert status["tasks"] == {"CANCELLED": 2}
    assert (status["claims"], status["slots"]) == (0, 0)
    for attempt in (
        run.mailbox("jobs").submit({"n": 3}),
        run.mailbox("jobs").send({"n": 4}),
        run.pool("gpu").acquire(),
        run.claim("k").acquire(),
    ):
        with pytest.raises(ScopeCancelledError):
            await attempt


def _sync_calls(address: str, run_id: str) -> dict[str, Any]:
    with Runstate(holder="sync", address=address) as rs:
        run = rs.scope(run_id)
        ticket = run.mailbox("jobs").submit({"n": 1}, group="g")
        delivery = run.mailbox("jobs").receive()
        assert delivery is not None and delivery.id == ticket.id
        delivery.complete(result={"payload": "ok"})
        result = run.group("g").wait(need=1)
        rs.scopes.cancel(run_id, "sync done")
        return {"wait": result, "group": run.group("g").status(), "run": run.status()}


async def test_the_sync_client_has_the_same_calls(clients: MakeClient, rsd: Any) -> None:
    setup = clients("setup")
    await setup.mailboxes.ensure("jobs")
    run = await setup.scopes.create()
    got = await asyncio.to_thread(_sync_calls, rsd.address, run.id)
    assert got["wait"]["done"][0]["outcome"] == "ok"
    assert got["group"]["counts"] == {"SUCCEEDED": 1}
    assert got["run"]["state"] == "cancelled" and got["run"]["reason"] == "sync done"


async def test_group_wait_handler_sees_deliveries_of_group_tasks(clients: MakeClient) -> None:
    """Tasks of a group are ordinary tasks for workers: consume() completes them and the
    group wait with the default need (all of them) returns."""
    boss, rs = clients("boss"), clients("worker")
    await boss.mailboxes.ensure("jobs")
    run = await boss.scopes.create()
    for n in range(5):
        await run.mailbox("jobs").submit(n, group="all")

    async def double(data: Any, delivery: Delivery) -> None:
        await delivery.complete(result={"payload": data * 2})

    stop = asyncio.Event()
    consumer = asyncio.create_task(
        rs.scope(run.id).mailbox("jobs").consume(double, concurrency=2, stop_event=stop)
    )
    result = await asyncio.wait_for(run.group("all").wait(timeout_ms=5_000), 5)
    stop.set()
    await asyncio.wait_for(consumer, 5)
    assert result["reached"] is True and result["need"] == 5
    assert sorted(d["outcome"] for d in result["done"]) == [0, 2, 4, 6, 8]
