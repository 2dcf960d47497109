"""A slot move under load: how long the moved slots' writes pause, and what the other
slots feel meanwhile.

    python -m bench.shardmove [--fsync always] [--moves 6] [--state 1000]
    python -m bench --only shardmove

Two shards (``bench.shards.Shards``: one primary each and, under ``--fsync always``, its
synchronous standby, on one etcd member on loopback), the slots spread evenly. One SDK
client (one connection per shard's primary, as any client of a sharded cluster) drives
``CLIENTS`` coroutines, each acquiring and releasing claims on fresh keys in its own run:
half of them in runs placed in a range of ``RANGE`` slots that moves (the "moved" runs,
which also hold ``--state`` queued tasks between them, so every move carries that much
state), half in runs on slots that never move, on both shards (the "other" runs). The
range is moved ``--moves`` times, back and forth between the shards (``rsctl slots move``),
``GAP`` seconds apart.

Printed, over the moves:
- the moved slots' write pause as the source measured it (how long their requests were
  held: its log line), p50 and max;
- the same pause as a client sees it: the longest acquire on a moved run that overlapped
  the move (held, answered MOVED, sent again to the new owner), p50 and max;
- the other slots' acquire latency, p99, during the moves beside outside them (a
  connection that also carries a moved run's request waits with it: see docs/cluster.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.shards import running_shards, slot_map
from rsclient import AsyncRunstate, RunstateError
from rsproto.slots import SlotMap, slot_of

CLIENTS = 32  # coroutines in all: half on moved runs, half on the others
RANGE = 64  # slots moved each time
GAP = 1.0  # seconds of load between moves (and before the first, after the last)
LEASE_SECONDS = 10.0
HELD = re.compile(r"slots (\d+)-(\d+) moved to shard '(\w+)' .* with (\d+) runs; their "
                  r"requests were held ([\d.]+) ms")


@dataclass
class Load:
    """Every acquire: (began, ended) per group, on the bench's perf_counter clock."""

    moved: list[tuple[float, float]] = field(default_factory=list)
    other: list[tuple[float, float]] = field(default_factory=list)
    refused: int = 0  # releases refused (a moved lease released at its old shard)
    stop: bool = False


def placements(owned: SlotMap, slots: range, inside: bool, count: int) -> list[str]:
    """``count`` placement strings whose slots are inside (or outside) ``slots``, spread
    over the shards when outside."""
    found: list[str] = []
    shards = [entry.shard for entry in owned.shards()]
    for n in range(1_000_000):
        name = f"move-{n}"
        slot = slot_of(name, owned.slots)
        if (slot in slots) != inside:
            continue
        if not inside and owned.owner(slot) != shards[len(found) % len(shards)]:
            continue
        found.append(name)
        if len(found) == count:
            return found
    raise RuntimeError("no placements found")


async def drive(rs: AsyncRunstate, placement: str, into: list[tuple[float, float]],
                load: Load) -> None:
    """Acquire and release fresh keys in a run placed at ``placement`` until stopped."""
    run = await rs.scopes.create(placement=placement)
    clock = time.perf_counter
    n = 0
    while not load.stop:
        began = clock()
        lease = await run.claim(f"k{n}", LEASE_SECONDS).acquire()
        into.append((began, clock()))
        n += 1
        try:
            await lease.release()
        except RunstateError:
            load.refused += 1


async def fill(rs: AsyncRunstate, placement: str, tasks: int) -> None:
    """``tasks`` queued tasks in a run placed at ``placement``: state every move carries."""
    run = await rs.scopes.create(placement=placement)
    box = run.mailbox("backlog")
    for lo in range(0, tasks, 256):
        await box.submit_many([{"data": {"n": i}, "key": f"t{i}"}
                               for i in range(lo, min(tasks, lo + 256))])


def move(address: str, lo: int, hi: int, to: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rsctl", "--address", address, "slots", "move",
         f"{lo}-{hi}", "--to", to, "--json"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"rsctl slots move failed: {done.stdout}{done.stderr}")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def overlapping(samples: list[tuple[float, float]], windows: list[tuple[float, float]],
                ) -> tuple[list[list[float]], list[float]]:
    """Each window's latencies of the samples that overlap it, and the others'."""
    inside: list[list[float]] = [[] for _ in windows]
    outside: list[float] = []
    for began, ended in samples:
        for k, (lo, hi) in enumerate(windows):
            if began <= hi and ended >= lo:
                inside[k].append(ended - began)
                break
        else:
            outside.append(ended - began)
    return inside, outside


async def measure(fsync: str, moves: int, state: int) -> dict[str, Any]:
    async with running_shards(2, fsync) as shards:
        address = shards.nodes[0].address
        owned = await slot_map(address)
        first = owned.ranges[0]  # (lo, hi, shard): the range moved is this one's start
        lo, hi = first[0], first[0] + RANGE - 1
        home, away = first[2], next(e.shard for e in owned.shards() if e.shard != first[2])
        inside = placements(owned, range(lo, hi + 1), True, CLIENTS // 2 + 1)
        outside = placements(owned, range(lo, hi + 1), False, CLIENTS // 2)
        load = Load()
        async with AsyncRunstate(holder="bench-shardmove",
                                 address=",".join(n.address for n in shards.nodes)) as rs:
            await rs.mailboxes.ensure("backlog", mode="WORK")  # on every shard
            await fill(rs, inside[-1], state)
            drivers = [asyncio.ensure_future(drive(rs, p, load.moved, load))
                       for p in inside[:-1]]
            drivers += [asyncio.ensure_future(drive(rs, p, load.other, load))
                        for p in outside]
            windows: list[tuple[float, float]] = []
            await asyncio.sleep(GAP)
            for k in range(moves):
                to = away if k % 2 == 0 else home
                began = time.perf_counter()
                await asyncio.to_thread(move, address, lo, hi, to)
                windows.append((began, time.perf_counter()))
                await asyncio.sleep(GAP)
            load.stop = True
            await asyncio.gather(*drivers)
        held = [float(m[4]) for node in shards.nodes for m in HELD.findall(node.log())
                if int(m[0]) == lo]
    moved_in, _ = overlapping(load.moved, windows)
    other_in, other_out = overlapping(load.other, windows)
    seen = [max(w) * 1000 for w in moved_in if w]
    during = [x for w in other_in for x in w]
    return {
        "fsync": fsync, "moves": moves, "slots": RANGE, "state_tasks": state,
        "held_ms": {"p50": pct(held, 0.5), "max": max(held, default=float("nan")),
                    "moves": len(held)},
        "client_pause_ms": {"p50": pct(seen, 0.5), "max": max(seen, default=float("nan"))},
        "other_p99_ms": {"during": pct(during, 0.99) * 1000,
                         "outside": pct(other_out, 0.99) * 1000},
        "acquires": {"moved": len(load.moved), "other": len(load.other)},
        "releases_refused": load.refused,
    }


def report(result: dict[str, Any]) -> str:
    held, seen, other = result["held_ms"], result["client_pause_ms"], result["other_p99_ms"]
    return (f"fsync {result['fsync']}: {result['moves']} moves of {result['slots']} slots "
            f"carrying {result['state_tasks']} queued tasks: requests held p50 "
            f"{held['p50']:.1f} ms, max {held['max']:.1f} ms (source's count); longest "
            f"acquire on a moved run p50 {seen['p50']:.1f} ms, max {seen['max']:.1f} ms; "
            f"other slots' acquire p99 {other['during']:.1f} ms during the moves, "
            f"{other['outside']:.1f} ms outside ({result['acquires']['other']:,} acquires; "
            f"{result['releases_refused']} releases of moved leases refused)")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.shardmove", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fsync", default="always", help="policies (default always)")
    parser.add_argument("--moves", type=int, default=6)
    parser.add_argument("--state", type=int, default=1000,
                        help="queued tasks the moved runs hold (default 1000)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    results = []
    for fsync in args.fsync.split(","):
        result = asyncio.run(measure(fsync, args.moves, args.state))
        print(report(result), flush=True)
        results.append(result)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
