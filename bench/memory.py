"""Server memory per live object: a fresh rsd's resident memory holding many claims, then
many queued tasks.

Starts rsd (``--fsync no``, a fresh data directory), and over one raw pipelined
connection (no SDK, as bench.renewals) creates a run, acquires ``--claims`` claims with
600 s leases, then submits ``--tasks`` tasks (small data, each with a key) that stay
queued. Prints rsd's resident memory (VmRSS) before and after each step, the bytes per
live claim and task, and the figure for 1M held claims beside the target (at most
400 MB; issue 12). ``--quick`` holds 100k of each and projects the 1M figure from the
bytes per claim.

    .venv/bin/python -m bench.memory [--claims 1000000] [--tasks 200000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import rsproto as wire
from bench.harness import RsdProcess, rsd_process
from bench.renewals import Client, connect, create_scope, hello
from rsproto import Op

TARGET_BYTES_1M_CLAIMS = 400_000_000
WINDOW = 20_000  # requests written before waiting for their replies


async def pipelined(client: Client, frames: Any, count: int) -> int:
    """Send ``count`` frames from the iterator ``frames``, ``WINDOW`` at a time; the
    number of error replies."""
    sent = 0
    errors_before = client.errors
    while sent < count:
        chunk = min(WINDOW, count - sent)
        before = client.replies
        client.transport.write(b"".join(next(frames) for _ in range(chunk)))
        await client.until(before + chunk)
        sent += chunk
    return client.errors - errors_before


def rss(server: RsdProcess) -> int:
    got = server.rss_bytes()
    if got is None:
        raise RuntimeError("rsd exited")
    return got


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--claims", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="100k claims and 100k tasks")
    args = parser.parse_args()
    claims = 100_000 if args.quick else args.claims
    tasks = 100_000 if args.quick else args.tasks
    mib = 2**20
    async with rsd_process("--fsync", "no") as server:
        client = await connect(server.address)
        await hello(client, "bench-memory")
        scope = await create_scope(client)
        await asyncio.sleep(0.5)
        base = rss(server)
        print(f"rsd at rest: {base / mib:.0f} MiB")

        started = time.perf_counter()
        acquire = (
            wire.request_frame(n + 10, Op.CLAIM_ACQUIRE,
                               {"scope": scope, "key": f"key-{n:08d}", "lease_seconds": 600})
            for n in range(claims)
        )
        errors = await pipelined(client, acquire, claims)
        held = rss(server)
        per_claim = (held - base) / claims
        print(f"{claims:,} held claims ({errors} refused, {time.perf_counter() - started:.1f} s):"
              f" {held / mib:.0f} MiB, {per_claim:.0f} bytes per claim")
        projected = base + per_claim * 1_000_000
        label = "measured" if claims == 1_000_000 else "projected"
        print(f"1M held claims ({label}): {projected / 1e6:.0f} MB "
              f"({projected / mib:.0f} MiB); target <= {TARGET_BYTES_1M_CLAIMS / 1e6:.0f} MB")

        started = time.perf_counter()
        submit = (
            wire.request_frame(claims + n + 10, Op.TASK_SUBMIT, {
                "scope": scope, "mailbox": "bench-memory", "key": f"task-{n:08d}",
                "data": {"n": n},
            })
            for n in range(tasks)
        )
        ensure = wire.request_frame(claims + 5, Op.MAILBOX_ENSURE, {"name": "bench-memory"})
        client.transport.write(ensure)
        await client.until(client.replies + 1)
        errors = await pipelined(client, submit, tasks)
        queued = rss(server)
        print(f"{tasks:,} queued tasks ({errors} refused, {time.perf_counter() - started:.1f} s):"
              f" {queued / mib:.0f} MiB, {(queued - held) / tasks:.0f} bytes per task")
        client.transport.close()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
