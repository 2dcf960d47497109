"""A parked wait (result, receive, acquire) keeps its own timeout while the server is stalled
(SIGSTOP) or down, and is sent again after a reconnect, ending normally on the restarted
server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.aio import (
    now,
)
from support.process import Rsd

from rsclient import (
    AsyncRunstate,
    RunstateError,
    WaitTimeoutError,
)

MakeClient = Callable[..., AsyncRunstate]
# Each test works in runs of its own and ensures its mailbox; a pause of the shared rsd
# ends with its resume, before the test does. So they share one rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module
Eventually = Callable[..., Awaitable[None]]
# A wait of 0.2 s ends by the SDK's own timer: within this of it on a loaded machine (a
# stall of the test's process of a few tenths of a second was seen under CI's load), far
# below the 5 s guard around each wait, which would mean the SDK waited on the server.
SLACK = 1.0
GUARD = 5.0


async def test_result_timeout_holds_while_the_server_is_stalled(
    rsd: Any, clients: MakeClient
) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("jobs")
    ticket = await (await rs.scopes.create()).mailbox("jobs").submit({"n": 1}, key="slow")
    rsd.pause()
    try:
        started = now()
        with pytest.raises(WaitTimeoutError):
            await asyncio.wait_for(ticket.result(timeout_ms=200), GUARD)
        assert now() - started < 0.2 + SLACK
    finally:
        rsd.resume()


async def test_acquire_timeout_holds_while_the_server_is_stalled(
    rsd: Any, clients: MakeClient
) -> None:
    alice, bob = clients("alice"), clients("bob")
    run = await alice.scopes.create()
    lease = await run.claim("k").acquire()
    await bob.ping()
    rsd.pause()
    try:
        started = now()
        with pytest.raises(WaitTimeoutError):
            await asyncio.wait_for(
                bob.scope(run.id).claim("k").acquire(wait=True, timeout_ms=200), GUARD
            )
        assert now() - started < 0.2 + SLACK
    finally:
        rsd.resume()
    await lease.release()


async def test_result_timeout_holds_while_the_server_is_down(
    restartable: Rsd, clients: MakeClient
) -> None:
    rs = clients("planner", restartable.address)
    await rs.mailboxes.ensure("jobs")
    ticket = await (await rs.scopes.create()).mailbox("jobs").submit({"n": 1}, key="t")
    await restartable.stop()
    started = now()
    with pytest.raises(RunstateError):  # the SDK's own answer, not the guard's TimeoutError
        await asyncio.wait_for(ticket.result(timeout_ms=200), GUARD)
    took = now() - started
    assert took < 0.2 + SLACK, f"result(timeout_ms=200) returned after {took:.2f} s"


async def test_a_parked_receive_waits_again_after_a_reconnect(
    restartable: Rsd, clients: MakeClient
) -> None:
    planner, worker = clients("planner", restartable.address), clients("w", restartable.address)
    await planner.mailboxes.ensure("jobs")
    run = await planner.scopes.create()
    box = worker.scope(run.id).mailbox("jobs")
    receiving = asyncio.create_task(box.receive(wait=True, timeout_ms=10_000))
    await asyncio.sleep(0.2)
    await restartable.stop()
    await restartable.start()
    ticket = await run.mailbox("jobs").submit({"n": 1}, key="after-restart")
    delivery = await asyncio.wait_for(receiving, 5)
    assert delivery is not None and delivery.task_id == ticket.id
    await delivery.complete()


async def test_parked_acquire_and_result_wait_again_after_a_server_restart(
    restartable: Rsd, clients: MakeClient
) -> None:
    """rsd restarted on the same port while an acquire and a result() are parked: both
    are sent again on the new connection and end normally (test_durability covers the
    leases themselves)."""
    alice, bob, planner, worker = (
        clients(name, restartable.address) for name in ("alice", "bob", "planner", "worker")
    )
    await planner.mailboxes.ensure("jobs")
    run = await alice.scopes.create()
    lease = await run.claim("k").acquire()
    ticket = await planner.scope(run.id).mailbox("jobs").submit({"n": 1}, key="t")
    acquiring = asyncio.create_task(
        bob.scope(run.id).claim("k").acquire(wait=True, timeout_ms=20_000)
    )
    waiting = asyncio.create_task(ticket.result(timeout_ms=20_000))
    await asyncio.sleep(0.2)
    await restartable.stop()
    await restartable.start()
    await asyncio.sleep(0.3)
    assert not acquiring.done() and not waiting.done()
    delivery = await worker.scope(run.id).mailbox("jobs").receive()
    assert delivery is not None
    await delivery.complete(result={"payload": "done after the restart"})
    view = await asyncio.wait_for(waiting, 5)
    assert (view["state"], view["outcome"]) == ("SUCCEEDED", "done after the restart")
    await lease.release()
    theirs = await asyncio.wait_for(acquiring, 5)
    assert theirs.generation == 2
    await theirs.release()


async def test_result_timeout_counts_from_the_first_wait_across_a_reconnect(
    restartable: Rsd, clients: MakeClient
) -> None:
    """A result() wait lost with its connection is made again for what is left of its
    limit, counted from the first wait's send (which result() reads back from the wait's
    give-up line, not from a clock read per wait): it ends at its limit, neither at once
    nor a limit after the loss."""
    rs = clients("planner", restartable.address)
    await rs.mailboxes.ensure("jobs")
    ticket = await (await rs.scopes.create()).mailbox("jobs").submit({"n": 1}, key="t")
    started = now()
    waiting = asyncio.create_task(ticket.result(timeout_ms=3000))
    await asyncio.sleep(1.5)
    await restartable.stop()
    await restartable.start()
    with pytest.raises(WaitTimeoutError):
        await asyncio.wait_for(waiting, GUARD + 3)
    took = now() - started
    assert 3.0 - 0.05 <= took < 3.0 + SLACK, f"result(timeout_ms=3000) ended after {took:.2f} s"
