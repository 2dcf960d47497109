"""A cancelled SDK call ends at once and leaves nothing behind on the server.

Cancelling release() (even while reconnecting, or as the second caller) still ends the
lease on the server; cancelled waits (result, receive, acquire) are withdrawn with
CANCEL instead of staying parked until their timeouts; cancelling consume() hands its
running work back without using an attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.aio import Hang, equals
from support.process import Rsd

from rsclient import (
    AsyncRunstate,
)

MakeClient = Callable[..., AsyncRunstate]
Eventually = Callable[..., Awaitable[None]]
# The tests marked ``shared`` work in runs of their own and end with no wait parked (each
# checks the server's count of waits): they share one rsd for the module
# (tests/conftest.py). The others pause or restart their server.
shared = pytest.mark.rsd_per_module


async def held(claim: Any) -> bool:
    return (await claim.inspect())["held"]


async def state_of(ticket: Any) -> str:
    return (await ticket.status())["state"]


async def test_a_second_release_caller_can_be_cancelled(rsd: Any, clients: MakeClient) -> None:
    rs = clients("alice")
    run = await rs.scopes.create()
    lease = await run.claim("k").acquire()
    rsd.pause()  # the release stays unanswered
    try:
        first = asyncio.create_task(lease.release())
        await asyncio.sleep(0.05)
        second = asyncio.create_task(lease.release())
        await asyncio.sleep(0.05)
        second.cancel()
        await asyncio.wait({second}, timeout=5)  # (a swallowed cancellation: for ever)
        assert second.done()
        assert second.cancelled(), "the cancellation of release() was swallowed"
    finally:
        rsd.resume()
        await asyncio.wait_for(first, 5)


async def test_a_release_cancelled_while_reconnecting_still_reaches_the_server(
    restartable: Rsd, eventually: Eventually
) -> None:
    # Every client here is of ``restartable`` (no ``clients`` fixture: it would start an
    # rsd of its own, unused).
    # The release keeps trying for connect_timeout: long enough for a restart on a loaded
    # machine (with the default 2 s it once gave up before rsd was back), far shorter than
    # the lease, so a lease no longer held was released, not expired. The client's
    # reconnect backs off up to 2 s between tries (retry.Backoff), so the release may
    # arrive seconds after the restart.
    async with AsyncRunstate(
        holder="alice", address=restartable.address, connect_timeout=20
    ) as rs:
        run = await rs.scopes.create()
        lease = await run.claim("k", lease_seconds=120).acquire()
        await restartable.stop()
        releasing = asyncio.create_task(lease.release())
        await asyncio.sleep(0.1)  # in connect(): the server is down
        releasing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await releasing
        await restartable.start()  # the lease survives the restart, live for 120 s more
        async with AsyncRunstate(holder="observer", address=restartable.address) as observer:
            claim = observer.scope(run.id).claim("k")
            await eventually(lambda: equals(held(claim), False), timeout=20.0)


@shared
async def test_cancelled_waits_leave_nothing_parked_on_the_server(clients: MakeClient) -> None:
    """A cancelled result(), receive(wait=True) and acquire(wait=True) are withdrawn from
    the server (CANCEL), not left parked until their timeouts."""
    rs, holder = clients("planner"), clients("holder")
    await rs.mailboxes.ensure("jobs")
    await rs.mailboxes.ensure("idle")
    run = await rs.scopes.create()
    ticket = await run.mailbox("jobs").submit({"n": 1}, key="t")
    lease = await holder.scope(run.id).claim("k").acquire()
    waits = [
        asyncio.create_task(ticket.result(timeout_ms=20_000)),
        asyncio.create_task(run.mailbox("idle").receive(wait=True, timeout_ms=20_000)),
        asyncio.create_task(run.claim("k").acquire(wait=True, timeout_ms=20_000)),
    ]
    await rs.ping()
    assert (await rs.server_stats())["core"]["waits"] == 3
    for task in waits:
        task.cancel()
    results = await asyncio.gather(*waits, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    assert (await rs.server_stats())["core"]["waits"] == 0
    assert (await run.mailbox("idle").inspect())["consumers"] == 0
    assert (await run.claim("k").inspect())["waiters"] == 0
    assert await state_of(ticket) == "PENDING"
    await lease.release()


@shared
async def test_cancelling_consume_hands_back_running_work(
    clients: MakeClient, eventually: Eventually
) -> None:
    """consume() cancelled (not stopped): the handler is cancelled at shutdown_timeout,
    its delivery given back without using an attempt, parked receives withdrawn, and the
    CancelledError propagates."""
    rs = clients("worker")
    await rs.mailboxes.ensure("jobs")
    run = await rs.scopes.create()
    ticket = await run.mailbox("jobs").submit({"n": 1}, key="t")
    hang = Hang()
    started, cancelled = hang.started, hang.cancelled

    consumer = asyncio.create_task(
        run.mailbox("jobs").consume(hang, concurrency=3, shutdown_timeout=0.3)
    )
    await asyncio.wait_for(started.wait(), 5)
    # The two free slots park together, in one batched RECEIVE (max=2).
    await eventually(lambda: equals(run.mailbox("jobs").inspect(), {
        "ready": 0, "running": 1, "delayed": 0, "waiting": 0, "consumers": 1, "dead_letters": 0,
        "paused": False, "blocked_by_parents": 0,
    }))
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(consumer, 5)
    assert cancelled.is_set()
    view = await ticket.status()
    assert (view["state"], view["attempt"]) == ("PENDING", 0)
    assert (await rs.server_stats())["core"]["waits"] == 0
    assert len(rs._keeper) == 0
