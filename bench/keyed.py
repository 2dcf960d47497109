"""Tasks with limits by key beside plain tasks: what a concurrency key costs.

Two measurements, each run for plain tasks and for tasks that carry one of 10,000
distinct concurrency keys (``user:{n % 10000}``, limit 2), everything else equal:

- ``core``: the pure core (no sockets) on a fake clock: ``ITEMS`` tasks submitted
  (TASK_SUBMIT), then received and completed one at a time (RECEIVE,
  DELIVERY_COMPLETE); tasks per second of the process's CPU time (not the wall clock:
  the machine is shared, and one thread's CPU time is what the core costs), for the
  whole (submit, delivery and completion), the best of ``--repeat`` runs, under rsd's
  collector policy (rsd/collector.py: the young generations collected, no automatic
  full collection of the heap). This is the server's own cost per task.
- ``wire``: a fresh rsd (``--fsync no``), ``ITEMS`` tasks submitted by TASK_SUBMIT_MANY
  (``submit_many``), then drained by 16 coroutines of one rsclient client, each
  ``receive_many(16)`` and a ``complete`` per delivery; tasks/s of submit and drain.

    .venv/bin/python -m bench.keyed [--items 100000] [--repeat 3]

``python -m bench --only keyed`` runs both as its step ``keyed`` (the plain figure as
the "peer", so the ratio is keyed / plain: the aim is at least 0.8).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

from bench.harness import rsd_process
from rsclient import AsyncRunstate
from rsd.collector import NEVER

ITEMS = 100_000
KEYS = 10_000


def keys_of(n: int, keyed: bool) -> dict[str, Any]:
    return {"concurrency_key": f"user:{n % KEYS}", "concurrency_limit": 2} if keyed else {}


def core_rate(items: int, keyed: bool) -> float:
    """Tasks/s of the pure core submitting and draining ``items`` tasks."""
    import itertools
    import os

    from rsd.core import Core
    from rsproto import Op

    numbers = itertools.count(1)
    core = Core(lambda: f"run-{next(numbers)}", 1.7e9, random_bytes=os.urandom)
    core.connected(1, "bench")
    core.handle(0.0, 1, 1, Op.MAILBOX_ENSURE, {"name": "jobs"})
    run = core.handle(0.0, 1, 2, Op.SCOPE_CREATE, {})["scope"]
    submits = [{"scope": run, "mailbox": "jobs", "data": n, "slim": True, **keys_of(n, keyed)}
               for n in range(items)]
    receive = {"scope": run, "mailbox": "jobs"}
    saved = gc.get_threshold()
    gc.set_threshold(saved[0], saved[1], NEVER)  # as rsd serves (rsd/collector.py)
    try:
        return items / _timed(core, run, submits, receive)
    finally:
        gc.set_threshold(*saved)


def _timed(core: Any, run: str, submits: list[dict[str, Any]],
           receive: dict[str, Any]) -> float:
    """CPU seconds of submitting ``submits`` and draining them one at a time."""
    from rsproto import Op

    handle = core.handle
    items = len(submits)
    started = time.process_time()
    for n, args in enumerate(submits):
        handle(0.0, 1, 3, Op.TASK_SUBMIT, args)
        if n % 4096 == 0:
            core.effects.take_records()
            core.effects.take_messages()
    for n in range(items):
        delivery = handle(0.0, 1, 4, Op.RECEIVE, receive)["delivery"]
        handle(0.0, 1, 5, Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})
        if n % 4096 == 0:
            core.effects.take_records()
            core.effects.take_messages()
    return time.process_time() - started


async def wire_rate(address: str, items: int, keyed: bool) -> float:
    """Tasks/s of submitting ``items`` tasks and 16 coroutines draining them."""
    async with AsyncRunstate(holder="bench-keyed", address=address) as rs:
        await rs.mailboxes.ensure("jobs")
        box = (await rs.scopes.create()).mailbox("jobs")
        batch = [{"data": n, **keys_of(n, keyed)} for n in range(items)]
        done = 0

        async def drain() -> None:
            nonlocal done
            while done < items:
                got = await box.receive_many(16)
                if not got:
                    return
                await asyncio.gather(*(delivery.complete() for delivery in got))
                done += len(got)

        started = time.perf_counter()
        for start in range(0, items, 4096):
            await box.submit_many(batch[start:start + 4096])
        await asyncio.gather(*(drain() for _ in range(16)))
        assert done == items, f"drained {done} of {items}"
        return items / (time.perf_counter() - started)


async def measure(items: int, repeat: int) -> dict[str, float]:
    """The best of ``repeat`` runs of each of the four figures, plain and keyed taking
    turns (a shared machine's load drifts: side by side, each meets the same)."""
    out = dict.fromkeys(("core.plain", "core.keyed", "wire.plain", "wire.keyed"), 0.0)
    for _ in range(repeat):
        for keyed in (False, True):
            name = "keyed" if keyed else "plain"
            out[f"core.{name}"] = max(out[f"core.{name}"], core_rate(items, keyed))
        for keyed in (False, True):
            name = "keyed" if keyed else "plain"
            async with rsd_process("--fsync", "no") as server:
                rate = await wire_rate(server.address, items, keyed)
            out[f"wire.{name}"] = max(out[f"wire.{name}"], rate)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=ITEMS)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    figures = asyncio.run(measure(args.items, args.repeat))
    for where in ("core", "wire"):
        plain, keyed = figures[f"{where}.plain"], figures[f"{where}.keyed"]
        print(f"{where}: plain {plain:,.0f} tasks/s, 10,000 concurrency keys "
              f"{keyed:,.0f} tasks/s, ratio {keyed / plain:.3f}")


if __name__ == "__main__":
    main()
