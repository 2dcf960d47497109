"""A task that waits for a signal, end to end: the suspend -> signal -> redelivery round
trip.

A worker and a planner on two clients of one rsd. Each round: the planner submits a
task; the worker receives it and parks a second receive; then, timed, the worker
suspends the delivery (WAITING: its lease ends, the worker is free), the planner
signals the task, and the parked receive is handed the task again carrying the signal
(pushed: nothing polls). Reports the whole round trip (suspend sent -> redelivery
received) and its second half (signal sent -> redelivery received), p50 and p99.

    .venv/bin/python -m bench.waits [--address HOST:PORT] [--rounds 1000]
                                    [--fsync always|everysec|no]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.claims import pct
from bench.harness import rsd_server
from rsclient import AsyncRunstate

__all__ = ["round_trips"]


async def round_trips(address: str, rounds: int) -> tuple[list[float], list[float]]:
    """``rounds`` suspend -> signal -> redelivery round trips: the whole of each, and its
    signal -> redelivery part, in seconds."""
    async with (
        AsyncRunstate(holder="bench-planner", address=address) as planner,
        AsyncRunstate(holder="bench-worker", address=address) as worker,
    ):
        await planner.mailboxes.ensure("approvals")
        run = await planner.scopes.create()
        box = run.mailbox("approvals")
        wbox = worker.scope(run.id).mailbox("approvals")
        whole: list[float] = []
        woken: list[float] = []
        for n in range(rounds):
            ticket = await box.submit({"n": n})
            delivery = await wbox.receive()
            assert delivery is not None and delivery.id == ticket.id
            again = asyncio.ensure_future(wbox.receive(wait=True, timeout_ms=10_000))
            await asyncio.sleep(0)  # the parked receive leaves first
            started = time.perf_counter()
            await delivery.suspend("approval", timeout_seconds=600)
            signalled = time.perf_counter()
            await ticket.signal("approval", {"ok": True})
            back = await again
            done = time.perf_counter()
            assert back is not None and back.signal == {"name": "approval", "data": {"ok": True}}
            whole.append(done - started)
            woken.append(done - signalled)
            await back.complete()
        return whole, woken


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", help="use a running rsd instead of starting one")
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--fsync", default="no", choices=["always", "everysec", "no"])
    args = parser.parse_args()
    async with rsd_server(args.address, "--fsync", args.fsync) as address:
        whole, woken = await round_trips(address, args.rounds)
    print(f"suspend -> signal -> redelivery: p50 {pct(whole, 0.5):.3f} ms, "
          f"p99 {pct(whole, 0.99):.3f} ms; signal -> redelivery: p50 "
          f"{pct(woken, 0.5):.3f} ms, p99 {pct(woken, 0.99):.3f} ms ({args.rounds} rounds)")


if __name__ == "__main__":
    asyncio.run(main())
