"""Durability figures: commit throughput per fsync policy, recovery time, snapshot pause,
and the data directory's size after many finished tasks.

    .venv/bin/python -m bench.durability throughput [--seconds 5] [--clients 64]
    .venv/bin/python -m bench.durability recover-journal [--records 1000000]
    .venv/bin/python -m bench.durability recover-snapshot [--tasks 1000000]
    .venv/bin/python -m bench.durability stall [--tasks 1000000]
    .venv/bin/python -m bench.durability disk [--tasks 1000000]
    .venv/bin/python -m bench.durability all   (small sizes, for a quick look)

- throughput: rsd under each --fsync policy; --clients coroutines spread over 4
  connections each loop acquire+release (two journaled changes); reports changes/s and
  the fsyncs/s the server did (SERVER_STATS).
- recover-journal: writes a journal of N records (claim grants and releases) through
  the real Core and Journal, then times recovery into a fresh Core.
- recover-snapshot: builds N live tasks, writes their snapshot, times recovery.
- stall: starts rsd on a data directory holding N live tasks, probes it with
  back-to-back PINGs while writes push it over --snapshot-bytes, and reports the longest
  PING round trip around the snapshot and the fork pause rsd measured.
- disk: runs N submit -> receive -> complete cycles through Core and Journal with a
  1 s retention on a fake clock (snapshots forked as in rsd), and reports the data
  directory's size against the size of one snapshot of the live state.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import rsd_server
from rsclient import AsyncRunstate
from rsd.core import Core
from rsd.core.machine import DEFAULT_RETENTION_SECONDS
from rsd.disk.snapshots import Snapshots
from rsd.startup import recover
from rsproto import Op


def _core(retention_seconds: float = DEFAULT_RETENTION_SECONDS) -> Core:
    ids = iter(range(1, 1 << 62))
    return Core(
        lambda: f"scope-{next(ids)}", wall_offset=time.time(), retention_seconds=retention_seconds
    )


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


# ---- throughput -----------------------------------------------------------------------


async def policy_throughput(policy: str, seconds: float, clients: int) -> tuple[float, float]:
    """Journaled changes/s and fsyncs/s of a fresh rsd under ``--fsync policy``."""
    async with rsd_server(None, "--fsync", policy) as address:
        conns = [AsyncRunstate(holder=f"bench-{i}", address=address) for i in range(4)]
        for conn in conns:
            await conn.connect()
        run = await conns[0].scopes.create()
        before = await conns[0].server_stats()
        stop_at = time.perf_counter() + seconds
        pairs = 0

        async def loop(i: int) -> None:
            nonlocal pairs
            claim = conns[i % 4].scope(run.id).claim(f"key-{i}")
            while time.perf_counter() < stop_at:
                lease = await claim.acquire()
                await lease.release()
                pairs += 1

        started = time.perf_counter()
        await asyncio.gather(*(loop(i) for i in range(clients)))
        elapsed = time.perf_counter() - started
        after = await conns[0].server_stats()
        fsyncs = after["journal"]["fsyncs"] - before["journal"]["fsyncs"]
        for conn in conns:
            await conn.close()
        return pairs * 2 / elapsed, fsyncs / elapsed


async def throughput(seconds: float, clients: int) -> None:
    for policy in ("always", "everysec", "no"):
        changes, fsyncs = await policy_throughput(policy, seconds, clients)
        print(f"--fsync {policy:8}: {changes:10,.0f} changes/s "
              f"({changes / 2:,.0f} acquire+release pairs/s, {clients} clients), "
              f"{fsyncs:,.0f} fsyncs/s")


# ---- recovery -------------------------------------------------------------------------


def build_journal(directory: Path, records: int) -> None:
    core = _core()
    journal, _ = recover(directory, core, 0.0, policy="no")
    core.connected(1, "bench")
    core.handle(0.0, 1, 0, Op.SCOPE_CREATE, {"scope": "s"})  # runs must exist
    written = 0
    now = 0.0
    batch: list[tuple[Any, ...]] = []
    i = 0
    while written < records:
        reply = core.handle(now, 1, 1, Op.CLAIM_ACQUIRE, {"scope": "s", "key": f"k{i % 50000}"})
        core.handle(now, 1, 2, Op.CLAIM_RELEASE, {"lease": reply["lease"]})
        batch.extend(core.effects.take_records())
        core.effects.take_messages()
        i += 1
        if len(batch) >= 1000:
            journal.write(batch)
            written += len(batch)
            batch = []
    journal.write(batch)
    journal.sync_now()  # and no CLEAN_SHUTDOWN: recovery takes the crash path


def recover_journal(records: int) -> float:
    """Builds a journal of ``records`` records, prints and returns its recovery time (s)."""
    with tempfile.TemporaryDirectory(prefix="rsd-bench-") as tmp:
        directory = Path(tmp)
        started = time.perf_counter()
        build_journal(directory, records)
        built = time.perf_counter() - started
        size = _dir_size(directory)
        started = time.perf_counter()
        _, report = recover(directory, _core(), 0.0, policy="no")
        took = time.perf_counter() - started
        print(f"recovery of a journal of {report.records:,} records ({size / 1e6:.0f} MB, "
              f"built in {built:.1f} s): {took:.2f} s")
        return took


def build_snapshot(directory: Path, tasks: int) -> Core:
    core = _core()
    journal, _ = recover(directory, core, 0.0, policy="no")
    core.connected(1, "bench")
    core.handle(0.0, 1, 0, Op.SCOPE_CREATE, {"scope": "s"})  # runs must exist
    core.handle(0.0, 1, 1, Op.MAILBOX_ENSURE, {"name": "work"})
    for i in range(tasks):
        core.handle(0.0, 1, 1, Op.TASK_SUBMIT, {
            "scope": "s", "mailbox": "work", "key": f"task-{i}",
            "data": {"company": f"company-{i}", "n": i},
        })
        if i % 10000 == 0:
            journal.write(core.effects.take_records())
    journal.write(core.effects.take_records())
    snapshots = Snapshots(journal, core)
    pid = snapshots.start()
    _, status = os.waitpid(pid, 0)
    snapshots.finished(status)
    journal.close()
    return core


def recover_snapshot(tasks: int) -> float:
    """Builds a snapshot of ``tasks`` live tasks, prints and returns its recovery time (s)."""
    with tempfile.TemporaryDirectory(prefix="rsd-bench-") as tmp:
        directory = Path(tmp)
        build_snapshot(directory, tasks)
        size = _dir_size(directory)
        started = time.perf_counter()
        _, report = recover(directory, _core(), 0.0, policy="no")
        took = time.perf_counter() - started
        print(f"recovery of a snapshot of {tasks:,} live tasks ({report.snapshot_records:,} "
              f"records, {size / 1e6:.0f} MB): {took:.2f} s")
        return took


# ---- snapshot stall -------------------------------------------------------------------


async def stall(tasks: int) -> None:
    with tempfile.TemporaryDirectory(prefix="rsd-bench-") as tmp:
        directory = Path(tmp) / "data"
        directory.mkdir()
        build_snapshot(directory, tasks)
        async with rsd_server(
            None, "--data-dir", str(directory), "--snapshot-bytes", str(1 << 20)
        ) as address, AsyncRunstate(holder="probe", address=address) as probe, \
                    AsyncRunstate(holder="writer", address=address) as writer:
            stats = await probe.server_stats()
            before = stats["journal"]["snapshots"]
            worst = 0.0
            done = asyncio.Event()

            async def ping() -> None:
                nonlocal worst
                while not done.is_set():
                    t = time.perf_counter()
                    await probe.ping()
                    worst = max(worst, time.perf_counter() - t)

            async def write() -> None:
                run = writer.scope("s")
                blob = "x" * 4000
                i = 0
                while True:
                    await run.mailbox("work").send({"blob": blob, "i": i})
                    i += 1
                    if i % 50 == 0:
                        s = await writer.server_stats()
                        if s["journal"]["snapshots"] > before:
                            break
                await asyncio.sleep(0.5)  # let the pause, if any, show in the probe
                done.set()

            await asyncio.gather(ping(), write())
            stats = await probe.server_stats()
            print(f"snapshot of {tasks:,} live tasks: fork paused the loop "
                  f"{stats['journal']['last_fork_ms']:.1f} ms; longest PING round trip "
                  f"meanwhile {worst * 1000:.1f} ms")


# ---- disk use -------------------------------------------------------------------------


def disk(tasks: int) -> None:
    with tempfile.TemporaryDirectory(prefix="rsd-bench-") as tmp:
        directory = Path(tmp)
        core = _core(retention_seconds=1.0)
        journal, _ = recover(directory, core, 0.0, policy="no")
        snapshots = Snapshots(journal, core, snapshot_bytes=16 << 20)
        core.connected(1, "bench")
        core.handle(0.0, 1, 0, Op.SCOPE_CREATE, {"scope": "s"})  # runs must exist
        core.handle(0.0, 1, 1, Op.MAILBOX_ENSURE, {"name": "work"})
        now = 0.0
        biggest = 0
        snapshot_size = 0
        for i in range(tasks):
            now += 0.001
            core.handle(now, 1, 1, Op.TASK_SUBMIT, {
                "scope": "s", "mailbox": "work", "key": f"task-{i}", "data": {"n": i},
            })
            got = core.handle(now, 1, 2, Op.RECEIVE, {"scope": "s", "mailbox": "work"})
            core.handle(now, 1, 3, Op.DELIVERY_COMPLETE, {
                "lease": got["delivery"]["lease"], "outcome": {"report": "r" * 200},
            })
            core.tick(now)
            core.effects.take_messages()
            if i % 1000 == 0:
                journal.write(core.effects.take_records())
                if snapshots.due():
                    pid = snapshots.start()
                    _, status = os.waitpid(pid, 0)
                    snapshots.finished(status)
                    snaps = [f for f in directory.iterdir() if f.suffix == ".snap"]
                    snapshot_size = snaps[0].stat().st_size if snaps else 0
                biggest = max(biggest, _dir_size(directory))
        journal.write(core.effects.take_records())
        journal.close()
        final = _dir_size(directory)
        print(f"{tasks:,} submit->complete cycles, results past retention: data directory "
              f"{final / 1e6:.1f} MB at the end, {biggest / 1e6:.1f} MB at most; last snapshot "
              f"{snapshot_size / 1e6:.1f} MB ({core.stats()['items']:,} tombstones kept)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "what",
        choices=["throughput", "recover-journal", "recover-snapshot", "stall", "disk", "all"],
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    args = parser.parse_args()
    if args.what in ("throughput", "all"):
        asyncio.run(throughput(args.seconds if args.what != "all" else 2, args.clients))
    if args.what in ("recover-journal", "all"):
        recover_journal(args.records if args.what != "all" else 100_000)
    if args.what in ("recover-snapshot", "all"):
        recover_snapshot(args.tasks if args.what != "all" else 100_000)
    if args.what in ("stall", "all"):
        asyncio.run(stall(args.tasks if args.what != "all" else 100_000))
    if args.what in ("disk", "all"):
        disk(args.tasks if args.what != "all" else 100_000)


if __name__ == "__main__":
    main()
