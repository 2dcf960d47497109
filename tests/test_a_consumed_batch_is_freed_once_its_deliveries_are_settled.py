"""A batch of deliveries consume() received is freed once each of its deliveries is
settled, while consume() goes on waiting for the next batch: nothing of the last batch
(a Delivery, its lease and body) is held by the receiver meanwhile. Before, the
receiver's own names held the whole batch until the next one came: on an idle mailbox,
for as long as it stayed idle, and on a busy one, a batch's objects alive a batch longer,
for the garbage collector's generations to walk (issue 33)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable

from rsclient import AsyncRunstate, Delivery

BATCH = 4


async def test_a_settled_batch_is_not_held_while_the_next_is_awaited(
    clients: Callable[..., AsyncRunstate],
) -> None:
    """Four tasks, taken by one RECEIVE (concurrency 4), each completed; with the garbage
    collector off, every delivery is gone (freed by its last reference) while consume()
    still runs, its receiver parked on the idle mailbox."""
    rs = clients("worker")
    await rs.mailboxes.ensure("batches", mode="WORK")
    run = await rs.scopes.create()
    mailbox = run.mailbox("batches")
    received: list[weakref.ref[Delivery]] = []
    settled = asyncio.Event()
    stop = asyncio.Event()

    async def handle(data: dict[str, int], delivery: Delivery) -> None:
        received.append(weakref.ref(delivery))
        await delivery.complete(result={"payload": data["n"]})
        if len(received) == BATCH:
            settled.set()

    for n in range(BATCH):
        await mailbox.submit({"n": n}, key=f"task-{n}")
    gc.disable()
    try:
        consumer = asyncio.ensure_future(
            mailbox.consume(handle, concurrency=BATCH, lease_seconds=30, stop_event=stop))
        await asyncio.wait_for(settled.wait(), 10)
        alive = received
        for _ in range(500):  # the slots' ends, then parked: a few loop turns (at most 5 s)
            alive = [ref for ref in alive if ref() is not None]
            if not alive:
                break
            await asyncio.sleep(0.01)
        assert not consumer.done()
        assert not alive, f"{len(alive)} of {BATCH} settled deliveries still referenced"
    finally:
        gc.enable()
        stop.set()
    await asyncio.wait_for(consumer, 10)
