"""Many coroutines' ``receive()`` calls on one queue in one loop turn are one batched
RECEIVE (receives.py), as consume() fills its slots: each delivery goes to exactly one
caller, the callers that find none get None as they would alone, and rsd counts one
RECEIVE, not one per call. (What it saves is measured by ``python -m bench``.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rsclient import AsyncRunstate

MakeClient = Callable[..., AsyncRunstate]


async def _receives(client: AsyncRunstate) -> int:
    ops = (await client.server_stats())["ops"].get("RECEIVE", {})
    return int(ops.get("ok", 0))


async def test_receives_of_one_turn_are_one_request_and_each_delivery_goes_to_one_caller(
    clients: MakeClient,
) -> None:
    rs = clients("worker")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    for n in range(10):
        await box.submit({"n": n})
    before = await _receives(rs)
    got = await asyncio.gather(*(box.receive() for _ in range(64)))
    assert await _receives(rs) == before + 1
    deliveries = [d for d in got if d is not None]
    assert sorted(d.data["n"] for d in deliveries) == list(range(10))
    assert got[:10] == deliveries  # handed out in call order
    for delivery in deliveries:
        await delivery.complete()
    assert (await box.inspect())["running"] == 0


async def test_a_receiver_that_gave_up_has_its_delivery_handed_back_untouched(
    clients: MakeClient,
) -> None:
    rs = clients("worker")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    ticket = await box.submit({"n": 1})
    gave_up = asyncio.ensure_future(box.receive())
    await asyncio.sleep(0)  # its RECEIVE is on its way
    gave_up.cancel()
    for _ in range(100):
        if (await ticket.status())["state"] == "PENDING":
            break
        await asyncio.sleep(0.01)
    delivery = await box.receive()
    assert delivery is not None and delivery.attempt == 1  # its attempt was not used
