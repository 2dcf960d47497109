"""Schedule fire jitter: how late a fire's task reaches a waiting worker.

Starts ``--schedules`` schedules of ``every_seconds=1`` in one run (each into the same
mailbox), with one client parked in RECEIVE on that mailbox; for ``--seconds`` it takes
every delivery and records, for each, the wall-clock time it arrived minus its fire time
(read from its key, ``schedule:<name>:<fire time>``): the lateness a worker sees, the
server's timer, the submit and the delivery included. Prints one JSON line: fires seen,
p50, p99 and max in ms, and any fire time seen twice (must be 0).

    .venv/bin/python -m bench.schedules [--seconds 10] [--schedules 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from datetime import UTC, datetime

from bench.harness import rsd_process
from rsclient import AsyncRunstate


def fire_time(key: str) -> float:
    stamp = key.rsplit(":", 3)
    return datetime.strptime(":".join(stamp[-3:]), "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=UTC).timestamp()


async def measure(address: str, seconds: float, schedules: int) -> tuple[list[float], int]:
    """Lateness of each fire in ms, and how many fire keys were seen more than once."""
    async with AsyncRunstate(holder="bench-schedules", address=address) as rs:
        await rs.mailboxes.ensure("bench-fires")
        run = await rs.scopes.create()
        for i in range(schedules):
            await run.schedules.ensure(f"s{i}", mailbox="bench-fires", every_seconds=1)
        box = run.mailbox("bench-fires")
        late: list[float] = []
        keys: Counter[str] = Counter()
        start = time.time()
        while time.time() - start < seconds:
            got = await box.receive_many(256, wait=True, timeout_ms=2000)
            now = time.time()
            for delivery in got:
                assert delivery.key is not None
                keys[delivery.key] += 1
                late.append((now - fire_time(delivery.key)) * 1000)
            await asyncio.gather(*(d.complete(None) for d in got))
        return late, sum(1 for n in keys.values() if n > 1)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] if ordered else 0.0


async def run(seconds: float, schedules: int) -> dict[str, float]:
    async with rsd_process("--fsync", "always") as server:
        late, doubled = await measure(server.address, seconds, schedules)
    return {"fires": len(late), "p50_ms": pct(late, 0.5), "p99_ms": pct(late, 0.99),
            "max_ms": max(late, default=0.0), "doubled": doubled}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.schedules", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--schedules", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.seconds, args.schedules))))


if __name__ == "__main__":
    main()
