"""A fan-out of 1,000 children and a join, beside as many plain submits.

Starts its own rsd (``--fsync no``, or uses --address) and, in this process, a planner
client and a worker client (``consume()``, 64 at a time). Each round has two timed
phases, the same for both kinds, with no overlap between them:

- submit: the planner holds a root task (received from a mailbox of its own, so it
  is RUNNING), then submits 1,000 tasks ``after=[root]`` as its children
  (``parent=root``), all BLOCKED, then the join: 16 tasks each ``after`` 63 (or fewer)
  children and one final task ``after`` the 16 (``after`` holds at most 64 ids):
  1,018 submits. Plain: 1,018 submits with nothing to wait for;
- drain: the root is completed (its end lets the 1,000 children go at once) and the
  worker starts; timed until it has completed all 1,018 (it counts them). Plain: the
  worker starts on the 1,018 ready tasks.

Figures: submits/s of the fan-out's submits beside plain ones (what recording the
links costs), and tasks/s of the whole round, submits and drain (what dependencies
cost end to end). Rounds alternate; medians of --rounds each.

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
ROOTS = "bench-fanout-roots"  # the roots' own mailbox: the worker never takes them
JOIN_WIDTH = 63  # children per join task (``after`` holds at most 64 ids)


async def fan_out(box: Mailbox, root: Any, children: int) -> int:
    """The children after ``root``, the joins after them: how many tasks."""
    kids = await asyncio.gather(*(
        box.submit(n, after=[root], parent=root) for n in range(children)))
    joins = await asyncio.gather(*(
        box.submit("join", after=list(kids[at:at + JOIN_WIDTH]))
        for at in range(0, children, JOIN_WIDTH)))
    await box.submit("final", after=list(joins))
    return len(kids) + len(joins) + 1


async def plain(box: Mailbox, count: int) -> int:
    await asyncio.gather(*(box.submit(n) for n in range(count)))
    return count


async def one_round(planner: AsyncRunstate, worker: AsyncRunstate, children: int,
                    fanned: bool) -> tuple[float, float]:
    """Submits/s of the submit phase, tasks/s of the whole round."""
    run = await planner.scopes.create()
    box = run.mailbox(MAILBOX)
    await run.mailbox(ROOTS).submit("root")
    root = await run.mailbox(ROOTS).receive(lease_seconds=600)
    assert root is not None and root.task_id is not None
    total = children + 1 + -(-children // JOIN_WIDTH)
    stop, done = asyncio.Event(), asyncio.Event()
    completed = 0

    async def finish(data: Any, delivery: Delivery) -> None:
        nonlocal completed
        await delivery.complete()
        completed += 1
        if completed == total:
            done.set()

    began = time.monotonic()
    made = await (fan_out(box, root.task_id, children) if fanned else plain(box, total))
    submitted = time.monotonic()
    assert made == total
    await root.complete()
    consuming = asyncio.ensure_future(
        worker.scope(run.id).mailbox(MAILBOX).consume(finish, concurrency=64, stop_event=stop))
    await asyncio.wait_for(done.wait(), 120)
    ended = time.monotonic()
    stop.set()
    await consuming
    await run.cancel("done")
    return total / (submitted - began), total / (ended - began)


async def measure(
    address: str, children: int, rounds: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """(submits/s, tasks/s) of the fan-out and of plain submits, medians of ``rounds``."""
    planner = AsyncRunstate(holder="bench-fanout-planner", address=address)
    worker = AsyncRunstate(holder="bench-fanout-worker", address=address)
    try:
        for name in (MAILBOX, ROOTS):
            await planner.mailboxes.ensure(name)
        await one_round(planner, worker, children, True)  # warm up both paths
        await one_round(planner, worker, children, False)
        fanned: list[tuple[float, float]] = []
        plains: list[tuple[float, float]] = []
        for _ in range(rounds):
            fanned.append(await one_round(planner, worker, children, True))
            plains.append(await one_round(planner, worker, children, False))
        return _medians(fanned), _medians(plains)
    finally:
        for rs in (planner, worker):
            with contextlib.suppress(Exception):
                await rs.close()


def _medians(rounds: list[tuple[float, float]]) -> tuple[float, float]:
    return (statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds))


async def run(
    children: int, rounds: int, address: str | None = None
) -> tuple[tuple[float, float], tuple[float, float]]:
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
    print(f"submits: fan-out {fanned[0]:,.0f}/s, plain {plains[0]:,.0f}/s "
          f"({fanned[0] / plains[0]:.2f}x)")
    print(f"whole round (submits, then the drain): fan-out {fanned[1]:,.0f} tasks/s, plain "
          f"{plains[1]:,.0f} tasks/s ({fanned[1] / plains[1]:.2f}x)")


if __name__ == "__main__":
    asyncio.run(main())
