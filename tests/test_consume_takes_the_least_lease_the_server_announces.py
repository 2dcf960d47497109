"""``consume()`` leaves the least lease to the server, as ``receive()`` and a claim's
``acquire()`` do: a server that announces a lower minimum (the test-only
``--test-min-lease-seconds``) serves a worker with a lease that short, and a server with
the protocol's 5 s minimum refuses a shorter one with InvalidArgumentError (which ends
``consume()``). Before, ``consume()`` alone checked the protocol's fixed 5 s on the client
and refused what the server would have granted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support.process import SHORT_LEASE, SHORT_LEASES

from rsclient import AsyncRunstate, Delivery, InvalidArgumentError


@pytest.mark.rsd_flags(*SHORT_LEASES)
async def test_a_worker_takes_a_lease_as_short_as_the_server_allows(
    clients: Callable[..., AsyncRunstate],
) -> None:
    rs = clients("short")
    await rs.mailboxes.ensure("jobs", mode="WORK")
    box = (await rs.scopes.create()).mailbox("jobs")
    ticket = await box.submit({"n": 1}, key="one")
    stop = asyncio.Event()
    leases: list[float] = []

    async def handler(data: Any, delivery: Delivery) -> None:
        leases.append(delivery.lease.lease_seconds)
        await delivery.complete(result={"payload": data["n"]})
        stop.set()

    await asyncio.wait_for(box.consume(handler, lease_seconds=2 * SHORT_LEASE,
                                       stop_event=stop), 10)
    assert leases == [2 * SHORT_LEASE]
    assert (await ticket.result(timeout_ms=5000))["outcome"] == 1


async def test_a_server_of_the_protocols_minimum_refuses_a_shorter_worker_lease(
    clients: Callable[..., AsyncRunstate],
) -> None:
    rs = clients("refused")
    await rs.mailboxes.ensure("jobs", mode="WORK")
    box = (await rs.scopes.create()).mailbox("jobs")

    async def handler(data: Any, delivery: Delivery) -> None:
        raise AssertionError("never called")

    with pytest.raises(InvalidArgumentError) as refused:
        await asyncio.wait_for(box.consume(handler, lease_seconds=2), 10)
    assert "lease_seconds" in refused.value.message
    with pytest.raises(InvalidArgumentError):
        await box.consume(handler, lease_seconds=0)
