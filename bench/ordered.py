"""Delivery with priorities and fair shares beside plain FIFO: what lanes cost.

Two measurements, each run for a plain FIFO queue and for one whose items have 10
priorities (n % 10) and 1,000 fairness keys (n % 1000), everything else equal:

- ``core``: the pure core (no sockets) on a fake clock: ``ITEMS`` messages sent, then
  received and completed one at a time (RECEIVE, DELIVERY_COMPLETE); deliveries/s of
  that drain, the best of ``--repeat`` runs. This is the server's own cost per delivery.
- ``wire``: a fresh rsd (``--fsync no``), the queue filled with ``ITEMS`` messages by
  TASK_SUBMIT_MANY, then drained by 16 coroutines of one rsclient client, each
  ``receive_many(16)`` and a ``complete`` per delivery; deliveries/s of the drain.

    .venv/bin/python -m bench.ordered [--items 100000] [--repeat 3]

``python -m bench --only ordered`` runs both as its step ``ordered`` (the plain FIFO
figure as the "peer", so the ratio is ordered / plain: the aim is at least 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bench.harness import rsd_process
from rsclient import AsyncRunstate

ITEMS = 100_000
PRIORITIES = 10
KEYS = 1000


def order_of(n: int, ordered: bool) -> dict[str, Any]:
    return {"priority": n % PRIORITIES, "fairness_key": f"k{n % KEYS}"} if ordered else {}


def core_rate(items: int, ordered: bool) -> float:
    """Deliveries/s of the pure core draining ``items`` messages (see the docstring)."""
    import itertools
    import os

    from rsd.core import Core
    from rsproto import Op

    numbers = itertools.count(1)
    core = Core(lambda: f"run-{next(numbers)}", 1.7e9, random_bytes=os.urandom)
    core.connected(1, "bench")
    core.handle(0.0, 1, 1, Op.MAILBOX_ENSURE, {"name": "jobs"})
    run = core.handle(0.0, 1, 2, Op.SCOPE_CREATE, {})["scope"]
    for n in range(items):
        core.handle(0.0, 1, 3, Op.MESSAGE_SEND,
                    {"scope": run, "mailbox": "jobs", "data": n, **order_of(n, ordered)})
    core.effects.take_records()
    core.effects.take_messages()
    receive = {"scope": run, "mailbox": "jobs"}
    handle = core.handle
    started = time.perf_counter()
    for _ in range(items):
        delivery = handle(0.0, 1, 4, Op.RECEIVE, receive)["delivery"]
        handle(0.0, 1, 5, Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})
        if _ % 4096 == 0:
            core.effects.take_records()
            core.effects.take_messages()
    return items / (time.perf_counter() - started)


async def wire_rate(address: str, items: int, ordered: bool) -> float:
    """Deliveries/s of 16 coroutines draining ``items`` messages over the wire."""
    async with AsyncRunstate(holder="bench-ordered", address=address) as rs:
        await rs.mailboxes.ensure("jobs")
        box = (await rs.scopes.create()).mailbox("jobs")
        batch = [{"data": n, **order_of(n, ordered)} for n in range(items)]
        for start in range(0, items, 4096):
            await box.submit_many(batch[start:start + 4096])
        done = 0

        async def drain() -> None:
            nonlocal done
            while True:
                got = await box.receive_many(16)
                if not got:
                    return
                await asyncio.gather(*(delivery.complete() for delivery in got))
                done += len(got)

        started = time.perf_counter()
        await asyncio.gather(*(drain() for _ in range(16)))
        return done / (time.perf_counter() - started)


async def measure(items: int, repeat: int) -> dict[str, float]:
    """The best of ``repeat`` runs of each of the four figures."""
    out: dict[str, float] = {}
    for ordered in (False, True):
        name = "ordered" if ordered else "plain"
        out[f"core.{name}"] = max(core_rate(items, ordered) for _ in range(repeat))
        best = 0.0
        for _ in range(repeat):
            async with rsd_process("--fsync", "no") as server:
                best = max(best, await wire_rate(server.address, items, ordered))
        out[f"wire.{name}"] = best
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=ITEMS)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    figures = asyncio.run(measure(args.items, args.repeat))
    for where in ("core", "wire"):
        plain, ordered = figures[f"{where}.plain"], figures[f"{where}.ordered"]
        print(f"{where}: plain FIFO {plain:,.0f} deliveries/s, 10 priorities x 1,000 "
              f"fairness keys {ordered:,.0f} deliveries/s, ratio {ordered / plain:.3f}")


if __name__ == "__main__":
    main()
