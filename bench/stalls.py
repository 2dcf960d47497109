"""Event-loop stalls while the live state grows: what a client waiting on rsd sees.

Starts rsd (``--fsync no``, a fresh data directory). A separate process pings it every
millisecond (one PING in flight, over its own connection) and records each round trip.
Meanwhile one raw pipelined connection (as bench.memory) creates a run, acquires
``--claims`` claims with 600 s leases and submits ``--tasks`` tasks that stay queued:
the live heap grows while rsd serves, the way CPython's full (generation 2) collections
hurt most. Then it asks for a snapshot (SNAPSHOT_NOW) with all that state held, and
pings on for ``--hold`` seconds with the state at rest.

Prints, per phase, the pings' p50, p99, p99.9 and max round trip and how many took
50 ms (design.md's stall bar) or 100 ms and more; rsd's own count of
loop stalls (SERVER_STATS ``loop``), its garbage collections per generation and the
longest collector step (SERVER_STATS ``gc``, when the server has it) and the snapshot's
fork pause.

    .venv/bin/python -m bench.stalls [--claims 500000] [--tasks 200000] [--hold 2] [--quick]

``--core`` measures instead, without a server or the machine's load in the figures, the
collections themselves: the same claims and tasks applied to the pure core in this
process, once under CPython's default collector and once under rsd's (collector.py),
with every collection's CPU time taken from ``gc.callbacks``: their count by
generation, total and longest.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
from multiprocessing.connection import Connection as Pipe
from typing import Any

import rsproto as wire
from bench.harness import rsd_process
from bench.memory import pipelined
from bench.renewals import Client, connect, create_scope, hello, request
from rsproto import Op

TARGET_STALL_MS = 50.0  # design.md: snapshot stall < 50 ms; no request may stall others
PING_EVERY = 0.001


# ---- the pinger (its own process, its own loop) ----------------------------------------

async def _ping(address: str, pipe: Pipe) -> None:
    client = await connect(address)
    await hello(client, "bench-stalls-ping")
    frame = wire.request_frame(9, Op.PING, {})
    samples: list[tuple[float, float]] = []
    pipe.send("ready")
    due = time.monotonic()
    while not pipe.poll():
        sent = time.monotonic()
        client.transport.write(frame)
        await client.until(client.replies + 1)
        got = time.monotonic()
        samples.append((sent, got - sent))
        due = max(due + PING_EVERY, got)
        await asyncio.sleep(max(0.0, due - time.monotonic()))
    pipe.send(samples)
    client.transport.close()


def pinger(address: str, pipe: Pipe) -> None:
    """Entry of the ping process: ping ``address`` until told to stop, then send back
    every (sent at, round trip) pair, in CLOCK_MONOTONIC seconds (shared by processes)."""
    import uvloop

    uvloop.run(_ping(address, pipe))


# ---- figures ------------------------------------------------------------------------

def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def describe(name: str, samples: list[tuple[float, float]], start: float, end: float) -> str:
    rtts = sorted(rtt for sent, rtt in samples if start <= sent < end)
    rtts_ms = [r * 1000.0 for r in rtts]
    p = [percentile(rtts_ms, q) for q in (0.5, 0.99, 0.999)]
    top = rtts_ms[-1] if rtts_ms else 0.0
    verdict = "met" if top < TARGET_STALL_MS else "missed"
    over = sum(1 for r in rtts_ms if r >= TARGET_STALL_MS)
    over100 = sum(1 for r in rtts_ms if r >= 100.0)
    return (f"{name:<9} {len(rtts):>6} pings  p50 {p[0]:6.2f}  p99 {p[1]:7.2f}  "
            f"p99.9 {p[2]:7.2f}  max {top:7.1f} ms, {over} >= {TARGET_STALL_MS:g} ms, "
            f"{over100} >= 100 ms  (target max < {TARGET_STALL_MS:g} ms: {verdict})")


async def stats(client: Client) -> dict[str, Any]:
    return dict(await request(client, Op.SERVER_STATS, {}))


def collector_line(before: dict[str, Any], after: dict[str, Any]) -> str:
    loop = (f"rsd loop stalls >= 100 ms: {after['loop']['stalls'] - before['loop']['stalls']}"
            f" (longest so far {after['loop']['longest_stall_ms']} ms)")
    if not after.get("gc"):
        return loop + "; no gc counters in SERVER_STATS"
    b, a = before["gc"], after["gc"]
    runs = [x - y for x, y in zip(a["collections"], b["collections"], strict=True)]
    found = sum(a["collected"]) - sum(b["collected"])
    return (f"{loop}; collections by generation {runs} ({found} unreachable objects found), "
            f"collector steps {a['steps'] - b['steps']}, longest step so far "
            f"{a['longest_step_ms']} ms")


# ---- --core: the collections themselves, on the pure core -------------------------

def core_collections(claims: int, tasks: int, policy: bool) -> str:
    """Build the state on a bare core; what the collections cost meanwhile."""
    import gc
    import os

    from rsd.collector import NEVER, STEP_GENERATIONS, settle
    from rsd.core import Core

    now = 0.0
    core = Core(lambda: "bench-run", random_bytes=os.urandom)
    core.connected(1, "bench", tenant="default", admin=True)
    core.handle(now, 1, 1, Op.SCOPE_CREATE, {"scope": "run"})
    core.handle(now, 1, 2, Op.MAILBOX_ENSURE, {"name": "jobs"})
    gc.collect()
    gc.freeze()
    saved = gc.get_threshold()
    if policy:
        gc.set_threshold(saved[0], saved[1], NEVER)
    times: list[tuple[int, float]] = []
    began: list[float] = [0.0]

    def measure(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.thread_time()
        else:
            times.append((info["generation"], time.thread_time() - began[0]))

    gc.callbacks.append(measure)
    try:
        for n in range(claims + tasks):
            if n < claims:
                core.handle(now, 1, n + 10, Op.CLAIM_ACQUIRE,
                            {"scope": "run", "key": f"key-{n:08d}", "lease_seconds": 600})
            else:
                core.handle(now, 1, n + 10, Op.TASK_SUBMIT, {
                    "scope": "run", "mailbox": "jobs", "key": f"task-{n:08d}", "data": {"n": n}})
            if n % 1000 == 0:
                core.effects.take_records()
                core.effects.take_messages()
                if policy and gc.get_count()[2] >= STEP_GENERATIONS:
                    settle()  # what the server's timer does
    finally:
        gc.callbacks.remove(measure)
        gc.set_threshold(*saved)
        gc.unfreeze()
    counts = [sum(1 for g, _ in times if g == gen) for gen in range(3)]
    worst = max((t for _, t in times), default=0.0)
    full = [t for g, t in times if g == 2]
    name = "rsd's collector" if policy else "CPython default"
    return (f"{name:<16} collections by generation {counts}, {sum(t for _, t in times):.2f} s "
            f"CPU in all, longest {worst * 1000:.1f} ms, longest full "
            f"{max(full, default=0.0) * 1000:.1f} ms")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--claims", type=int, default=500_000)
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--hold", type=float, default=2.0, help="seconds pinged at rest")
    parser.add_argument("--quick", action="store_true", help="100k claims and 50k tasks")
    parser.add_argument("--core", action="store_true",
                        help="measure the collections on the pure core in this process")
    args = parser.parse_args()
    claims = 100_000 if args.quick else args.claims
    tasks = 50_000 if args.quick else args.tasks
    if args.core:
        print(f"{claims:,} claims + {tasks:,} tasks applied to the core:")
        for policy in (False, True):
            print(core_collections(claims, tasks, policy))
        return
    async with rsd_process("--fsync", "no") as server:
        client = await connect(server.address)
        await hello(client, "bench-stalls")
        scope = await create_scope(client)
        ours, theirs = multiprocessing.Pipe()
        ping = multiprocessing.get_context("spawn").Process(
            target=pinger, args=(server.address, theirs), daemon=True)
        ping.start()
        if ours.recv() != "ready":
            raise RuntimeError("the pinger did not start")
        await asyncio.sleep(0.5)
        phases: list[tuple[str, float, float]] = []
        first = await stats(client)

        began = time.monotonic()
        acquire = (
            wire.request_frame(n + 10, Op.CLAIM_ACQUIRE,
                               {"scope": scope, "key": f"key-{n:08d}", "lease_seconds": 600})
            for n in range(claims)
        )
        refused = await pipelined(client, acquire, claims)
        client.transport.write(
            wire.request_frame(5, Op.MAILBOX_ENSURE, {"name": "bench-stalls"}))
        await client.until(client.replies + 1)
        submit = (
            wire.request_frame(claims + n + 10, Op.TASK_SUBMIT, {
                "scope": scope, "mailbox": "bench-stalls", "key": f"task-{n:08d}",
                "data": {"n": n},
            })
            for n in range(tasks)
        )
        refused += await pipelined(client, submit, tasks)
        phases.append(("build", began, time.monotonic()))
        built = await stats(client)
        print(f"built {claims:,} claims + {tasks:,} tasks in {phases[0][2] - began:.1f} s "
              f"({refused} refused), rsd at {(server.rss_bytes() or 0) / 2**20:.0f} MiB")

        began = time.monotonic()
        client.transport.write(wire.request_frame(6, Op.SNAPSHOT_NOW, {}))
        await client.until(client.replies + 1)
        await asyncio.sleep(0.2)
        phases.append(("snapshot", began, time.monotonic()))
        snapped = await stats(client)
        journal = snapped.get("journal") or {}

        began = time.monotonic()
        await asyncio.sleep(args.hold)
        phases.append(("at rest", began, time.monotonic()))
        rest = await stats(client)

        ours.send("stop")
        samples = ours.recv()
        ping.join(10)
        client.transport.close()
    for name, start, end in phases:
        print(describe(name, samples, start, end))
    print(f"build:    {collector_line(first, built)}")
    print(f"snapshot: {collector_line(built, snapped)}; fork paused "
          f"{journal.get('last_fork_ms')} ms ({journal.get('snapshots')} snapshots so far)")
    print(f"at rest:  {collector_line(snapped, rest)}")


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
