"""A delivery in flight in consume() keeps few objects alive that the garbage collector
tracks: a busy worker holds many at once (64 by default), and a young collection, which
a burst of reads sets off every 700 allocations, walks every one of them. Each of a
delivery's objects is paid again in every collection for as long as it is in flight, so
the SDK's own per delivery (issue 33) are counted: the handler's coroutine and the
slot's (``_handle``), the body, the Delivery, its Lease and its runner (InTask) are
needed; the Lease's list of loss callbacks, for its one callback, no longer is."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

from rsclient import AsyncRunstate, Delivery

CONCURRENCY = 16
# Tracked objects alive per delivery whose handler runs, beyond the same consumer idle
# (the handler's coroutine and the test's gate wait; the body, the Delivery, its Lease
# and InTask; the keeper's and the connection's bookkeeping of it): 16.2, against 17.1
# before a lease with one loss callback kept it without a list (fails before); a little
# room above it. (The slot running ``_handle``'s steps itself made it 15.2, but wrote
# them twice, once for the span's path: not taken.)
MOST_TRACKED_PER_DELIVERY_IN_FLIGHT = 16.75


async def test_a_delivery_in_flight_keeps_few_tracked_objects_alive(
    clients: Callable[..., AsyncRunstate],
) -> None:
    rs = clients("worker")
    await rs.mailboxes.ensure("tracked", mode="WORK")
    run = await rs.scopes.create()
    mailbox = run.mailbox("tracked")
    gate = asyncio.Event()
    waiting: list[int] = []
    done: list[int] = []

    async def handle(data: dict[str, int], delivery: Delivery) -> None:
        waiting.append(data["n"])
        await gate.wait()
        await delivery.complete(result={"payload": data["n"]})
        done.append(data["n"])

    async def until(predicate: Callable[[], bool]) -> None:
        for _ in range(1000):
            if predicate():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("consume() did not get there in 10 s")

    async def burst(first: int) -> None:
        for n in range(first, first + CONCURRENCY):
            await mailbox.submit({"n": n}, key=f"task-{n}", slim=True)
        await until(lambda: len(waiting) == first + CONCURRENCY)

    stop = asyncio.Event()
    consumer = asyncio.ensure_future(mailbox.consume(
        handle, concurrency=CONCURRENCY, lease_seconds=30, stop_event=stop))
    try:
        gate.set()  # warm: every slot made, and parked again
        await burst(0)
        await until(lambda: len(done) == CONCURRENCY)
        await asyncio.sleep(0.1)
        gate.clear()
        gc.collect()
        idle = len(gc.get_objects())
        await burst(CONCURRENCY)  # every slot's handler waits at the gate
        gc.collect()
        in_flight = len(gc.get_objects())
        per_delivery = (in_flight - idle) / CONCURRENCY
        gate.set()
        await until(lambda: len(done) == 2 * CONCURRENCY)
    finally:
        gate.set()
        stop.set()
        await consumer
    assert per_delivery <= MOST_TRACKED_PER_DELIVERY_IN_FLIGHT, (
        f"{per_delivery:g} tracked objects alive per delivery in flight "
        f"(at most {MOST_TRACKED_PER_DELIVERY_IN_FLIGHT})"
    )
