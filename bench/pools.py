"""Pools and quotas end to end: pool acquire+release pairs/s, quota takes/s, and the
release -> waiter grant latency of a pool.

Starts its own rsd on a free port (or uses --address), then:
- pools: C coroutines on one client (one connection, pipelined), each looping
  acquire + release of a slot of one pool as large as C, for D seconds; pairs/s;
- quotas: C coroutines looping ``take(1, wait=False)`` on one quota whose refill is far
  above the rate reached (so no take is refused) for D seconds; takes/s;
- handoff: on a pool of 1, a waiter queued on another client is granted when the holder
  releases; release-sent -> grant-received p50/p99;
- needs: delivery throughput (receive + complete, C workers on one client) of T tasks
  without needs, then, in the same run, T tasks that each need a slot of a pool of C and
  1 of a quota (so every delivery takes capacity and its settlement frees it), then T
  tasks that need a pool of C/4 (most receives meet blocked tasks; each settlement wakes
  the next), then T tasks without needs again. Tasks are submitted first (not timed);
  tasks/s.

    .venv/bin/python -m bench.pools [--concurrency 64] [--seconds 5] [--handoffs 500]
                                    [--tasks 20000] [--fsync always|everysec|no]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.claims import pct
from bench.harness import rsd_server
from rsclient import AsyncRunstate
from rsclient.views import Needs


async def pool_pairs(address: str, concurrency: int, seconds: float) -> float:
    async with AsyncRunstate(holder="bench-pools", address=address) as rs:
        await rs.pools.ensure("bench-pool", size=concurrency)
        run = await rs.scopes.create()
        stop_at = time.perf_counter() + seconds
        counts = [0] * concurrency

        async def worker(i: int) -> None:
            pool = run.pool("bench-pool")
            while time.perf_counter() < stop_at:
                lease = await pool.acquire()
                await lease.release()
                counts[i] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return sum(counts) / (time.perf_counter() - started)


async def quota_takes(address: str, concurrency: int, seconds: float) -> float:
    async with AsyncRunstate(holder="bench-quotas", address=address) as rs:
        await rs.quotas.ensure("bench-quota", limit=1_000_000_000, per_seconds=1)
        run = await rs.scopes.create()
        stop_at = time.perf_counter() + seconds
        counts = [0] * concurrency

        async def worker(i: int) -> None:
            quota = run.quota("bench-quota")
            while time.perf_counter() < stop_at:
                await quota.take(1, wait=False)
                counts[i] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return sum(counts) / (time.perf_counter() - started)


async def handoff(address: str, rounds: int) -> list[float]:
    async with (
        AsyncRunstate(holder="bench-holder", address=address) as holder,
        AsyncRunstate(holder="bench-waiter", address=address) as waiter,
    ):
        await holder.pools.ensure("bench-handoff", size=1)
        run = await holder.scopes.create()
        wpool = waiter.scope(run.id).pool("bench-handoff")
        samples: list[float] = []
        lease = await run.pool("bench-handoff").acquire()
        for _ in range(rounds):
            waiting = asyncio.ensure_future(wpool.acquire(wait=True, timeout_ms=5000))
            while (await holder.pools.inspect("bench-handoff", limit=0))["waiters"] == 0:
                await asyncio.sleep(0)
            sent = time.perf_counter()
            await lease.release()
            granted = await waiting
            samples.append(time.perf_counter() - sent)
            await granted.release()
            lease = await run.pool("bench-handoff").acquire()
        await lease.release()
        return samples


async def deliveries(
    address: str, concurrency: int, tasks: int, needs: Needs | None, tag: str
) -> float:
    """Tasks/s delivered and completed by ``concurrency`` workers, ``needs`` on each."""
    async with AsyncRunstate(holder=f"bench-needs-{tag}", address=address) as rs:
        await rs.mailboxes.ensure("bench-needs")
        run = await rs.scopes.create()
        box = run.mailbox("bench-needs")
        batch = 500
        for start in range(0, tasks, batch):
            await asyncio.gather(*(
                box.submit(n, needs=needs) for n in range(start, min(tasks, start + batch))
            ))
        done = [0]

        async def worker() -> None:
            while done[0] < tasks:
                delivery = await box.receive(wait=True, timeout_ms=2000)
                if delivery is None:
                    continue
                await delivery.complete(None)
                done[0] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return tasks / (time.perf_counter() - started)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", help="use a running rsd instead of starting one")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--handoffs", type=int, default=500)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--fsync", default="always", choices=["always", "everysec", "no"])
    args = parser.parse_args()
    async with rsd_server(args.address, "--fsync", args.fsync) as address:
        if not args.address:
            print(f"rsd --fsync {args.fsync}")
        rate = await pool_pairs(address, args.concurrency, args.seconds)
        print(f"pool acquire+release, 1 client, {args.concurrency} coroutines: "
              f"{rate:,.0f} pairs/s")
        rate = await quota_takes(address, args.concurrency, args.seconds)
        print(f"quota takes (no wait), 1 client, {args.concurrency} coroutines: "
              f"{rate:,.0f} takes/s")
        samples = await handoff(address, args.handoffs)
        print(f"pool release -> waiter grant over {len(samples)} handoffs: "
              f"p50 {pct(samples, 0.5):.3f} ms, p99 {pct(samples, 0.99):.3f} ms")
        async with AsyncRunstate(holder="bench-needs", address=address) as rs:
            await rs.pools.ensure("bench-room", size=args.concurrency)
            await rs.pools.ensure("bench-narrow", size=max(1, args.concurrency // 4))
            await rs.quotas.ensure("bench-budget", limit=1_000_000_000, per_seconds=1)
        cases: list[tuple[str, Needs | None]] = [
            ("without needs", None),
            (f"needing a pool of {args.concurrency} + a quota",
             {"pools": ["bench-room"], "quotas": {"bench-budget": 1}}),
            (f"needing a pool of {max(1, args.concurrency // 4)}", {"pools": ["bench-narrow"]}),
            ("without needs, again (the spread between runs)", None),
        ]
        for n, (label, needs) in enumerate(cases):
            rate = await deliveries(address, args.concurrency, args.tasks, needs, str(n))
            print(f"tasks {label}, {args.concurrency} workers on 1 client: "
                  f"{rate:,.0f} tasks/s (receive + complete)")


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
