"""A task's progress events, fanned out: one worker publishing on one task, 10 followers.

Starts its own rsd (or uses --address) and, in this process, 10 clients each following
the task (``ticket.events()``) and one worker holding its delivery. Measures:

- events/s: ``delivery.progress()`` kept --inflight at a time for --seconds, each event
  received by every follower (the figure counts events published and seen by all 10;
  ``missed`` would be counted and reported);
- the push latency: one event at a time, from the moment ``progress()`` is called to
  the moment each follower's iterator yields it (p50 and p99 over followers and events).

A task's rate is bounded by the protocol (100 events/s, bursts of 200): rsd is started
with ``--test-progress-rate`` (a test-only option, ``RSD_TEST_ONLY_OPTIONS=1``) so the
figure is the fan-out's, not the bound's. The followers share this process with the
worker: their client's CPU is in the figure too.

    .venv/bin/python -m bench.progress [--seconds 3] [--followers 10] [--inflight 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

from bench.claims import pct
from bench.harness import rsd_process
from rsclient import AsyncRunstate
from rsclient.progress import TaskEvent

MAILBOX = "bench-progress"
RAISED_RATE = ("--test-progress-rate", "1000000")
LATENCY_EVENTS = 300


async def measure(address: str, seconds: float, followers: int,
                  inflight: int) -> tuple[float, list[float], int]:
    """Events/s seen by every follower, the push latencies (s), events missed."""
    worker = AsyncRunstate(holder="bench-progress-worker", address=address)
    watchers = [AsyncRunstate(holder=f"bench-follower-{n}", address=address)
                for n in range(followers)]
    try:
        await worker.mailboxes.ensure(MAILBOX)
        run = await worker.scopes.create()
        ticket = await run.mailbox(MAILBOX).submit(None)
        delivery = await run.mailbox(MAILBOX).receive(lease_seconds=600)
        assert delivery is not None
        seen: list[dict[int, float]] = [{} for _ in watchers]
        missed = [0] * followers
        started = [asyncio.Event() for _ in watchers]

        async def follow(index: int, rs: AsyncRunstate) -> None:
            got = seen[index]
            events = rs.scope(run.id).task(ticket.id).events()
            first: TaskEvent = await anext(events)  # the subscription is made
            got[first.seq] = time.monotonic()
            started[index].set()
            async for event in events:
                got[event.seq] = time.monotonic()
                missed[index] += event.missed

        tasks = [asyncio.ensure_future(follow(i, rs)) for i, rs in enumerate(watchers)]
        await delivery.progress("start")
        await asyncio.gather(*(event.wait() for event in started))
        # Throughput: ``inflight`` publishers for ``seconds``.
        published = 0
        stop_at = time.monotonic() + seconds

        async def publisher() -> None:
            nonlocal published
            while time.monotonic() < stop_at:
                await delivery.progress({"n": published})
                published += 1

        began = time.monotonic()
        await asyncio.gather(*(publisher() for _ in range(inflight)))
        target = 2 + published  # seq 1 the state, 2 "start", then these
        deadline = time.monotonic() + 30
        while min(max(got) for got in seen) < target and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        took = max(max(got.values()) for got in seen) - began
        rate = published / took if took > 0 else 0.0
        # Latency: one event at a time.
        latencies: list[float] = []
        for _ in range(LATENCY_EVENTS):
            sent = time.monotonic()
            seq = await delivery.progress("ping")
            while any(seq not in got for got in seen):
                await asyncio.sleep(0)
            latencies.extend(got[seq] - sent for got in seen)
        await delivery.complete()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return rate, latencies, sum(missed)
    finally:
        for rs in (worker, *watchers):
            with contextlib.suppress(Exception):
                await rs.close()


async def run(seconds: float, followers: int, inflight: int,
              address: str | None = None) -> tuple[float, list[float], int]:
    if address:
        return await measure(address, seconds, followers, inflight)
    async with rsd_process("--fsync", "no", *RAISED_RATE, test_only=True) as server:
        return await measure(server.address, seconds, followers, inflight)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", help="use a running rsd (started with "
                        "--test-progress-rate) instead of starting one")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--followers", type=int, default=10)
    parser.add_argument("--inflight", type=int, default=16)
    args = parser.parse_args()
    rate, latencies, missed = await run(args.seconds, args.followers, args.inflight,
                                        args.address)
    print(f"progress events/s through one task to {args.followers} followers: {rate:,.0f}"
          f" (missed {missed})")
    print(f"push latency: p50 {pct(latencies, 0.5):.3f} ms, p99 {pct(latencies, 0.99):.3f} ms")


if __name__ == "__main__":
    asyncio.run(main())
