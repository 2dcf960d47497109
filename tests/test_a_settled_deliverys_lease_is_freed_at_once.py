"""A settled delivery's lease is freed the moment the delivery is dropped: the lease
keeper's heap names a lease by its handle and holds no lease, so a stale entry (left
for the lease's renewal time, dropped when it surfaces or at a compaction) keeps no
lease alive. Before, each settled lease lived on until a compaction, a thousand at a
time, long enough for the garbage collector's older generations to walk every one of
them again and again: CPU paid by every task of a busy worker (issue 33)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable

from rsclient import AsyncRunstate, Delivery, Lease


async def test_a_settled_deliverys_lease_is_freed_at_once(
    clients: Callable[..., AsyncRunstate],
) -> None:
    """consume()'s deliveries are renewed (their leases in the keeper's heap); each one
    settled, its lease is gone once consume() has let the delivery go, with the garbage
    collector off (freed by its last reference, not found by a collection)."""
    rs = clients("worker")
    await rs.mailboxes.ensure("freed", mode="WORK")
    run = await rs.scopes.create()
    mailbox = run.mailbox("freed")
    leases: list[weakref.ref[Lease]] = []
    stop = asyncio.Event()

    async def handle(data: dict[str, int], delivery: Delivery) -> None:
        leases.append(weakref.ref(delivery.lease))
        await delivery.complete(result={"payload": data["n"]})
        if len(leases) == 3:
            stop.set()

    gc.disable()
    try:
        for n in range(3):
            await mailbox.submit({"n": n}, key=f"task-{n}")
        await mailbox.consume(handle, concurrency=1, lease_seconds=30, stop_event=stop)
        alive = [ref for ref in leases if ref() is not None]
        assert not alive, f"{len(alive)} settled deliveries' leases still referenced"
    finally:
        gc.enable()
    assert len(rs._keeper) == 0
