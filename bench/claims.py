"""Claims end to end: acquire+release throughput and release->waiter handoff latency.

Starts its own rsd on a free port (or uses --address), then:
- throughput: C coroutines on one client (one connection, pipelined), each looping
  acquire + release on its own key for D seconds; prints pairs/s;
- handoff: a holder and a waiter on two clients; the waiter queues with wait=True, the
  holder releases, and we time release-sent -> grant-received; prints p50/p99/max.

    .venv/bin/python -m bench.claims [--concurrency 64] [--seconds 5] [--handoffs 1000]
                                     [--fsync always|everysec|no]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time

from bench.harness import rsd_server, throwaway_tls
from rsclient import AsyncRunstate


async def throughput(
    address: str, concurrency: int, seconds: float, samples: list[float] | None = None,
    placement: str | None = None, start_at: float | None = None,
) -> float:
    """Acquire+release pairs/s; each pair's duration (s) goes into ``samples`` if given.
    ``placement``: the run is placed there (a sharded cluster); ``start_at``: the
    measurement starts at that wall-clock time (several processes at one instant)."""
    async with AsyncRunstate(holder="bench-throughput", address=address) as rs:
        run = await (rs.scopes.create() if placement is None
                     else rs.scopes.create(placement=placement))
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        stop_at = time.perf_counter() + seconds
        counts = [0] * concurrency

        async def worker(i: int) -> None:
            claim = run.claim(f"key-{i}")
            clock = time.perf_counter
            while (began := clock()) < stop_at:
                lease = await claim.acquire()
                await lease.release()
                counts[i] += 1
                if samples is not None:
                    samples.append(clock() - began)

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
        return sum(counts) / elapsed


async def handoff(address: str, rounds: int) -> list[float]:
    async with (
        AsyncRunstate(holder="bench-holder", address=address) as holder,
        AsyncRunstate(holder="bench-waiter", address=address) as waiter,
    ):
        run = await holder.scopes.create()
        wrun = waiter.scope(run.id)
        samples: list[float] = []
        for i in range(rounds):
            key = f"handoff-{i}"
            lease = await run.claim(key).acquire()
            waiting = asyncio.ensure_future(wrun.claim(key).acquire(wait=True, timeout_ms=5000))
            # Make sure the waiter is queued on the server before releasing.
            while (await run.claim(key).inspect())["waiters"] == 0:
                await asyncio.sleep(0)
            sent = time.perf_counter()
            await lease.release()
            granted = await waiting
            samples.append(time.perf_counter() - sent)
            await granted.release()
        return samples


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", help="use a running rsd instead of starting one")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--handoffs", type=int, default=1000)
    parser.add_argument("--fsync", default="always", choices=["always", "everysec", "no"])
    parser.add_argument("--tls", action="store_true",
                        help="serve and connect over TLS (a throwaway certificate)")
    args = parser.parse_args()
    secure: contextlib.AbstractContextManager[list[str]] = (
        throwaway_tls() if args.tls else contextlib.nullcontext([])
    )
    with secure as tls_flags:
        async with rsd_server(args.address, "--fsync", args.fsync, *tls_flags) as address:
            if args.tls:
                address = f"tls://{address}"
                print("over TLS (a throwaway certificate)")
            if not args.address:
                print(f"rsd --fsync {args.fsync}")
            rate = await throughput(address, args.concurrency, args.seconds)
            print(f"claims acquire+release, 1 client, {args.concurrency} coroutines: "
                  f"{rate:,.0f} pairs/s")
            samples = await handoff(address, args.handoffs)
            print(f"release -> waiter grant over {len(samples)} handoffs: "
                  f"p50 {pct(samples, 0.5):.3f} ms, p99 {pct(samples, 0.99):.3f} ms, "
                  f"max {max(samples) * 1000:.3f} ms, "
                  f"mean {statistics.mean(samples) * 1000:.3f} ms")


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
