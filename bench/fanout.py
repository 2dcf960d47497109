"""A fan-out of 1,000 children and a join, beside as many plain submits.

Starts its own rsd (``--fsync no``, or uses --address) and, in this process, a planner
client and a worker client (``consume()``, 64 at a time). One round of each kind, timed
from the first submit to the last task's completion:

- fan-out: a root task, then 1,000 tasks submitted ``after=[root]`` as its children
  (``parent=root``), BLOCKED until the root completes; then the join: 16 tasks each
  ``after`` 63 (or fewer) children and one final task ``after`` the 16 (``after``
  holds at most 64 ids). 1,018 tasks, the root's completion letting 1,000 go at once;
- plain: 1,018 tasks submitted with nothing to wait for.

The figure is tasks/s of the fan-out, its peer the plain submits' (the same client
calls, the same worker): what dependencies cost. Rounds alternate, the median of
--rounds each.

    .venv/bin/python -m bench.fanout [--children 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from typing import Any

from bench.harness import rsd_process
from rsclient import AsyncRunstate, Delivery
from rsclient.mailboxes import Mailbox

MAILBOX = "bench-fanout"
JOIN_WIDTH = 63  # children per join task (``after`` holds at most 64 ids)


async def fan_out(box: Mailbox, children: int) -> list[Any]:
    """The root, its children after it, the joins after them: the final join's ticket
    last."""
    root = await box.submit("root")
    kids = await asyncio.gather(*(
        box.submit(n, after=[root], parent=root) for n in range(children)))
    joins = await asyncio.gather(*(
        box.submit("join", after=list(kids[at:at + JOIN_WIDTH]))
        for at in range(0, children, JOIN_WIDTH)))
    final = await box.submit("final", after=list(joins))
    return [root, *kids, *joins, final]


async def plain(box: Mailbox, count: int) -> list[Any]:
    return list(await asyncio.gather(*(box.submit(n) for n in range(count))))


async def one_round(planner: AsyncRunstate, worker: AsyncRunstate, children: int,
                    fanned: bool) -> float:
    """Tasks/s of one round: submits to the last completion (the worker counts them:
    the same for both kinds)."""
    run = await planner.scopes.create()
    box = run.mailbox(MAILBOX)
    total = children + 2 + -(-children // JOIN_WIDTH)
    stop, done = asyncio.Event(), asyncio.Event()
    completed = 0

    async def finish(data: Any, delivery: Delivery) -> None:
        nonlocal completed
        await delivery.complete()
        completed += 1
        if completed == total:
            done.set()

    consuming = asyncio.ensure_future(
        worker.scope(run.id).mailbox(MAILBOX).consume(finish, concurrency=64, stop_event=stop))
    began = time.monotonic()
    tickets = await (fan_out(box, children) if fanned else plain(box, total))
    await asyncio.wait_for(done.wait(), 120)
    took = time.monotonic() - began
    assert len(tickets) == total
    stop.set()
    await consuming
    await run.cancel("done")
    return len(tickets) / took


async def measure(address: str, children: int, rounds: int) -> tuple[float, float]:
    """Tasks/s of the fan-out and of plain submits (medians of ``rounds``)."""
    planner = AsyncRunstate(holder="bench-fanout-planner", address=address)
    worker = AsyncRunstate(holder="bench-fanout-worker", address=address)
    try:
        await planner.mailboxes.ensure(MAILBOX)
        await one_round(planner, worker, children, True)  # warm up both paths
        await one_round(planner, worker, children, False)
        fanned: list[float] = []
        plains: list[float] = []
        for _ in range(rounds):
            fanned.append(await one_round(planner, worker, children, True))
            plains.append(await one_round(planner, worker, children, False))
        return statistics.median(fanned), statistics.median(plains)
    finally:
        for rs in (planner, worker):
            with contextlib.suppress(Exception):
                await rs.close()


async def run(children: int, rounds: int, address: str | None = None) -> tuple[float, float]:
    if address:
        return await measure(address, children, rounds)
    async with rsd_process("--fsync", "no") as server:
        return await measure(server.address, children, rounds)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", help="use a running rsd instead of starting one")
    parser.add_argument("--children", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    fanned, plains = await run(args.children, args.rounds, args.address)
    print(f"fan-out of {args.children} children and a join: {fanned:,.0f} tasks/s; "
          f"plain submits: {plains:,.0f} tasks/s ({fanned / plains:.2f}x)")


if __name__ == "__main__":
    asyncio.run(main())
