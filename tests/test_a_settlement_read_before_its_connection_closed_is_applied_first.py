"""A settlement rsd read but had not yet run when its connection closed (it waited in
the connection's backlog: the connection's output was at its mark, or its share of the
loop turn was used) is applied before the leases bound to that connection end
(``release_on_disconnect``): the worker's result stands, the task is not handed to
another worker as if the first had died (batches.py ``settle_what_was_read``).

In-process: a real server and SDK clients on loopback; the backlog is made as the
server makes it when a connection's output is full (``Connection.block``).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from support.aio import eventually_true

from rsclient import AsyncRunstate
from rsd.core import Core
from rsd.server import Server
from rsproto import Kind, Op


def _new_core() -> Core:
    ids = itertools.count(1)
    return Core(lambda: f"run-{next(ids)}", wall_offset=0.0)


async def test_a_completion_in_the_backlog_of_a_closed_connection_is_applied() -> None:
    server = Server(_new_core(), asyncio.get_running_loop())
    host, port = await server.start("127.0.0.1", 0)
    address = f"{host}:{port}"
    planner = AsyncRunstate(holder="planner", address=address)
    worker = AsyncRunstate(holder="worker", address=address)
    try:
        await planner.mailboxes.ensure("jobs", mode="WORK")
        run = await planner.scopes.create()
        ticket = await run.mailbox("jobs").submit({"n": 1}, key="once")
        delivery = await worker.scope(run.id).mailbox("jobs").receive(
            lease_seconds=600, release_on_disconnect=True)
        assert delivery is not None
        conn: Any = next(c for c in server.conns.values() if c.holder == "worker")
        complete = [int(Kind.REQUEST), 999, int(Op.DELIVERY_COMPLETE),
                    {"lease": delivery.lease.handle, "outcome": {"by": "worker"}}]
        conn.block([complete])  # read, not yet run: its output is at the mark
        conn.transport.abort()  # the worker's connection closes
        await eventually_true(lambda: conn.id not in server.conns)
        view = await ticket.status()
        assert (view["state"], view["outcome"], view["attempt"]) == (
            "SUCCEEDED", {"by": "worker"}, 1)
    finally:
        await worker.close()
        await planner.close()
        await server.stop()


async def test_nothing_but_settlements_runs_for_a_closed_connection() -> None:
    """A claim request waiting in the same backlog is not run: nothing is granted to a
    connection that is gone."""
    server = Server(_new_core(), asyncio.get_running_loop())
    host, port = await server.start("127.0.0.1", 0)
    address = f"{host}:{port}"
    other = AsyncRunstate(holder="other", address=address)
    gone = AsyncRunstate(holder="gone", address=address)
    try:
        run = await other.scopes.create()
        await gone.ping()
        conn: Any = next(c for c in server.conns.values() if c.holder == "gone")
        acquire = [int(Kind.REQUEST), 5, int(Op.CLAIM_ACQUIRE),
                   {"scope": run.id, "key": "k", "lease_seconds": 600}]
        conn.block([acquire])
        conn.transport.abort()
        await eventually_true(lambda: conn.id not in server.conns)
        view = await run.claim("k").inspect()
        assert not view["held"]
    finally:
        await gone.close()
        await other.close()
        await server.stop()
