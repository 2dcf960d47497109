"""State on the server: N held leases or N queued tasks put in place before a
measurement, and the server memory each one costs (growth of the process's RSS over N).

The leases are taken on a raw pipelined connection (``bench.renewals``) with a 10-minute
lease, so they stay held while the figure is taken; the tasks are submitted the same way
to a mailbox nobody receives from (``backlog``), so they stay queued beside the
mailbox the measurement uses.
"""

from __future__ import annotations

import rsproto as wire
from bench.renewals import Client, acquire_leases, connect, create_scope, hello, pipelined
from rsproto import Op

__all__ = ["hold_leases", "queue_tasks"]


async def hold_leases(address: str, count: int) -> Client:
    """A connection holding ``count`` leases; close its transport to let them lapse."""
    client = await connect(address)
    await hello(client, "bench-state")
    leases = await acquire_leases(client, count, prefix="held-")
    if len(leases) != count:
        raise RuntimeError(f"only {len(leases)} of {count} claims were granted")
    return client


async def queue_tasks(address: str, count: int) -> Client:
    """A connection that left ``count`` tasks queued in the mailbox ``backlog``."""
    client = await connect(address)
    await hello(client, "bench-state")
    scope = await create_scope(client)
    await pipelined(client, [wire.request_frame(1, Op.MAILBOX_ENSURE, {"name": "backlog"})],
                    "name")
    tasks = await pipelined(client, [
        wire.request_frame(i + 1, Op.TASK_SUBMIT, {
            "scope": scope, "mailbox": "backlog", "key": f"backlog-{i}",
            "data": {"company": f"company-{i}", "n": i},
        })
        for i in range(count)
    ], "id")
    if len(tasks) != count:
        raise RuntimeError(f"only {len(tasks)} of {count} tasks were queued")
    return client
