"""Hostile clients against a fresh rsd: every attack of issue 8, and what each one costs.

Each attack runs against an rsd of its own (started on 127.0.0.1, stopped after). Beside
it run a bystander process (``bench.hostile_clients``: a 5 s claim renewed by the SDK,
a PING about every 10 ms) and a sampler of the server's resident memory (VmRSS from
/proc). After each attack the table gets one row:

    attack | RSS growth MB (peak; after) | bystander PING max/p99 ms | leases lost | notes

Targets (issue 8): RSS growth under 64 MB per attack, bystander PING p99 under 50 ms,
0 leases lost; rows that miss one are listed at the end. Every attack is bounded in
count and in time, an attack that grows rsd past ``RSS_CAP`` is stopped early, and the
program ends by itself.

    .venv/bin/python -m bench.hostile [--quick] [--only 1,2a,...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from bench.harness import RsdProcess, start_rsd, stop_rsd
from bench.hostile_clients import Raw, bystander_main
from bench.hostile_ops import (
    batch_receives_unread,
    big_run_cancel,
    group_fan_out,
    listings_of_a_big_run,
    prepare_batch_receives,
    prepare_big_run,
    prepare_group_fan_out,
    snapshot_flood,
    submit_many_at_the_limit,
)
from rsproto import MAX_FRAME_BYTES, Op

MB = 1 << 20
RSS_CAP = 2048 * MB  # an attack that grows rsd by this much is stopped early
TARGET_RSS_MB = 64
TARGET_P99_MS = 50
MASS_LEASE_SECONDS = 15  # row 4e: long enough to acquire 100,000 claims first


@dataclass
class Ctx:
    """What an attack gets: its server, its size, and a flag raised at the memory cap."""

    server: RsdProcess
    quick: bool
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    state: dict[str, Any] = field(default_factory=dict)

    def n(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    async def hold(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the memory cap was hit."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.abort.wait(), seconds)


Step = Callable[[Ctx], Awaitable[str]]


@dataclass
class Attack:
    key: str
    name: str
    run: Step
    prepare: Step | None = None
    args: tuple[str, ...] = ()
    budget: float = 120.0  # seconds for the measured part
    nofile: int | None = None  # rsd's descriptor limit, if this attack sets one
    watched: bool = True  # False: the attack stops rsd itself (no bystander, no RSS)


@dataclass
class Row:
    key: str
    name: str
    rss_peak_mb: float | None = None
    rss_after_mb: float | None = None
    ping: dict[str, Any] | None = None
    notes: str = ""


# ---- helpers ----------------------------------------------------------------------------


async def _setup_conn(ctx: Ctx) -> tuple[Raw, str]:
    """A connection with the mailbox ``jobs`` ensured and a fresh scope."""
    conn = await Raw.open(ctx.server.address)
    await conn.ok(Op.MAILBOX_ENSURE, {"name": "jobs"})
    scope = (await conn.ok(Op.SCOPE_CREATE, {}))["scope"]
    return conn, scope


def _count_errors(msgs: list[Any]) -> dict[str, int]:
    codes: dict[str, int] = {}
    for msg in msgs:
        if msg[0] == 3:
            codes[msg[2]] = codes.get(msg[2], 0) + 1
    return codes


async def _park_receives(conn: Raw, scope: str, count: int) -> int:
    """Park ``count`` RECEIVE waits on ``conn``, with timeouts spread over the hour so
    that they land in many timer buckets; returns the first request id."""
    first = conn.next_id
    chunk = 4096
    for start in range(0, count, chunk):
        frames = [
            conn.frame(Op.RECEIVE, {"scope": scope, "mailbox": "jobs", "wait": True,
                                    "timeout_ms": 600_000 + (i * 7919) % 3_000_000})
            for i in range(start, min(count, start + chunk))
        ]
        conn.send(b"".join(frames))
        await conn.drain()
    await conn.ok(Op.PING, {}, timeout=60)  # answered once every wait before it is parked
    return first


# ---- 1. reply amplification -----------------------------------------------------------


async def prepare_amplification(ctx: Ctx) -> str:
    conn, scope = await _setup_conn(ctx)
    task = await conn.ok(Op.TASK_SUBMIT, {"scope": scope, "mailbox": "jobs", "key": "big",
                                          "data": None})
    got = await conn.ok(Op.RECEIVE, {"scope": scope, "mailbox": "jobs"})
    await conn.ok(Op.DELIVERY_COMPLETE, {"lease": got["delivery"]["lease"],
                                         "outcome": b"r" * 250_000})
    ctx.state.update(conn=conn, scope=scope, task=task["id"])
    return ""


async def amplification(ctx: Ctx) -> str:
    scope, task = ctx.state["scope"], ctx.state["task"]
    attackers = [await Raw.open(ctx.server.address) for _ in range(6)]
    per_conn = 0
    for conn in attackers:
        frames: list[bytes] = []
        size = 0
        while size < 60_000:
            frame = conn.frame(Op.TASK_STATUS, {"scope": scope, "task": task})
            frames.append(frame)
            size += len(frame)
        per_conn = len(frames)
        conn.send(b"".join(frames))  # and never read
    await ctx.hold(ctx.n(8, 4))
    for conn in attackers:
        conn.close()
    owed = 6 * per_conn * 250_000 / MB
    return f"6 x {per_conn} TASK_STATUS unread ({owed:,.0f} MB of replies owed)"


# ---- 2. requests whose cost grows with server state -----------------------------------


async def prepare_parked(ctx: Ctx) -> str:
    conn, scope = await _setup_conn(ctx)
    count = ctx.n(65_536, 16_384)
    started = time.monotonic()
    first = await _park_receives(conn, scope, count)
    ctx.state.update(conn=conn, first=first, count=count)
    return f"{count} parked receives ({time.monotonic() - started:.1f} s to park)"


async def stats_storm(ctx: Ctx) -> str:
    conn = await Raw.open(ctx.server.address)
    frames = [conn.frame(Op.SERVER_STATS, {}) for _ in range(1000)]
    started = time.monotonic()
    got = await conn.roundtrip(frames, timeout=ctx.n(90, 45))
    took = time.monotonic() - started
    conn.close()
    return f"1000 SERVER_STATS: {len(got)} answered in {took:.1f} s"


async def cancel_newest_first(ctx: Ctx) -> str:
    conn, first, count = ctx.state["conn"], ctx.state["first"], ctx.state["count"]
    ids = range(first + count - 1, first - 1, -1)
    frames = [conn.frame(Op.CANCEL, {"request": rid}) for rid in ids]
    started = time.monotonic()
    conn.send(b"".join(frames))
    got = await conn.collect(2 * count, timeout=ctx.n(90, 45))
    took = time.monotonic() - started
    done = sum(1 for msg in got if msg[0] == 2 and msg[2].get("cancelled"))
    return f"{count} CANCEL newest-first: {done} cancelled in {took:.1f} s"


# ---- 3. descriptors -------------------------------------------------------------------


async def prepare_flood(ctx: Ctx) -> str:
    conn, scope = await _setup_conn(ctx)
    ctx.state.update(conn=conn, scope=scope)
    return ""


async def flood(ctx: Ctx) -> str:
    server = ctx.server
    limit = _nofile_of(server.pid)
    hello = Raw.__new__(Raw)
    hello.next_id = 1
    hello_frame = hello.frame(Op.HELLO, {"version": 1, "holder": "flood"})
    opened: list[asyncio.StreamWriter] = []
    why_stopped = "reached the bound"
    host, _, port = server.address.rpartition(":")
    try:
        for _ in range(limit + 256):
            if ctx.abort.is_set():
                why_stopped = "memory cap"
                break
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2)
            except (OSError, TimeoutError) as exc:
                why_stopped = type(exc).__name__
                break
            writer.write(hello_frame)
            opened.append(writer)
        await asyncio.sleep(0.5)
        new_conn = await _fresh_connection(server.address)
        # Make rsd open files: write past --snapshot-bytes (1 MB) through an open connection.
        conn, scope = ctx.state["conn"], ctx.state["scope"]
        writes = "writes ok"
        try:
            for i in range(8):
                await conn.ok(Op.TASK_SUBMIT, {"scope": scope, "mailbox": "jobs",
                                               "key": f"w{i}", "data": b"w" * 200_000},
                              timeout=5)
        except Exception as exc:
            writes = f"write {i} failed ({type(exc).__name__})"
        await asyncio.sleep(1.0)
        alive = "rsd alive" if server.proc.returncode is None else (
            f"rsd EXITED {server.proc.returncode}"
        )
    finally:
        for writer in opened:
            with contextlib.suppress(Exception):
                writer.transport.abort()
    return (f"{len(opened)} connections opened (rsd nofile {limit}; stopped: {why_stopped}); "
            f"{new_conn}; {writes}; {alive}")


async def _fresh_connection(address: str) -> str:
    """What a new connection gets: served, refused with an error frame (and how fast),
    or nothing (left waiting in the kernel's accept queue)."""
    started = time.monotonic()
    try:
        fresh = await Raw.open(address, hello=False, timeout=2)
    except Exception as exc:
        return f"a new connection cannot connect ({type(exc).__name__})"
    try:
        fresh.send(fresh.frame(Op.HELLO, {"version": 1, "holder": "fresh"}))
        got = await fresh.collect(1, timeout=2)
    finally:
        fresh.close()
    took = (time.monotonic() - started) * 1000
    if not got:
        return "a new connection gets no answer in 2 s"
    if got[0][0] == 3:
        return f"a new connection is refused with {got[0][2]} in {took:.0f} ms"
    return "a new connection is served"


def _nofile_of(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise RuntimeError("no descriptor limit found")


# ---- 4. memory that never comes back --------------------------------------------------


async def _windowed(conn: Raw, frames_for: Callable[[int, int], list[bytes]], total: int,
                    ctx: Ctx, deadline: float) -> tuple[int, dict[str, int]]:
    """Send ``total`` requests in windows of 2,000, reading each window's answers."""
    done = 0
    errors: dict[str, int] = {}
    while done < total and not ctx.abort.is_set() and time.monotonic() < deadline:
        size = min(2000, total - done)
        frames = frames_for(done, size)
        got = await conn.roundtrip(frames, timeout=30)
        for code, n in _count_errors(got).items():
            errors[code] = errors.get(code, 0) + n
        done += size
    return done, errors


async def made_up_reads(ctx: Ctx) -> str:
    conn, _ = await _setup_conn(ctx)
    total = ctx.n(100_000, 20_000)

    def frames(start: int, size: int) -> list[bytes]:
        return [conn.frame(Op.RECEIVE, {"scope": f"madeup{i:09d}", "mailbox": "jobs"})
                for i in range(start, start + size)]

    done, errors = await _windowed(conn, frames, total, ctx, time.monotonic() + 100)
    return f"{done} receives on made-up scope ids; errors {errors or 'none'}"


async def cancelled_waits(ctx: Ctx) -> str:
    conn, scope = await _setup_conn(ctx)
    total = ctx.n(100_000, 20_000)
    done = 0
    deadline = time.monotonic() + 100
    while done < total and not ctx.abort.is_set() and time.monotonic() < deadline:
        size = min(1000, total - done)
        frames = []
        for _ in range(size):
            rid = conn.next_id
            frames.append(conn.frame(Op.RECEIVE, {"scope": scope, "mailbox": "jobs",
                                                  "wait": True, "timeout_ms": 3_600_000}))
            frames.append(conn.frame(Op.CANCEL, {"request": rid}))
        await conn.roundtrip(frames, timeout=30)  # a CANCEL reply + CANCELLED per pair
        done += size
    return f"{done} hour-long waits parked and cancelled"


async def released_claims(ctx: Ctx) -> str:
    conn, scope = await _setup_conn(ctx)
    total = ctx.n(100_000, 20_000)
    done = 0
    deadline = time.monotonic() + 100
    while done < total and not ctx.abort.is_set() and time.monotonic() < deadline:
        size = min(2000, total - done)
        grants = await conn.roundtrip(
            [conn.frame(Op.CLAIM_ACQUIRE, {"scope": scope, "key": f"k{i}", "lease_seconds": 5})
             for i in range(done, done + size)], timeout=30)
        leases = [msg[2]["lease"] for msg in grants if msg[0] == 2]
        await conn.roundtrip([conn.frame(Op.CLAIM_RELEASE, {"lease": lease})
                              for lease in leases], timeout=30)
        done += size
    return f"{done} distinct claims acquired and released"


async def partial_frames(ctx: Ctx) -> str:
    conns = [await Raw.open(ctx.server.address) for _ in range(100)]
    header = struct.pack(">I", MAX_FRAME_BYTES)
    body = b"\x00" * (MAX_FRAME_BYTES - 1)  # one byte short: never a whole frame
    piece = 64 * 1024
    for conn in conns:
        conn.send(header)
    for start in range(0, len(body), piece):  # in pieces: every read adds to the buffer
        for conn in conns:
            conn.send(body[start : start + piece])
        await asyncio.sleep(0.01)
        if ctx.abort.is_set():
            break
    await ctx.hold(ctx.n(5, 3))
    closed = sum(1 for conn in conns if conn.writer.transport.is_closing())
    refused = 0
    for conn in conns:
        got = await conn.collect(1, timeout=0.05)
        refused += sum(1 for msg in got if msg[0] == 3 and msg[2] == "RESOURCE_EXHAUSTED")
        conn.close()
    return (f"100 connections each holding a 1 MiB frame less one byte; {closed} closed by "
            f"us; {refused} closed by rsd (RESOURCE_EXHAUSTED, client buffer budget)")


async def prepare_mass_expiry(ctx: Ctx) -> str:
    conn, scope = await _setup_conn(ctx)
    total = 100_000
    leases: list[Any] = []
    started = time.monotonic()
    for start in range(0, total, 2000):
        got = await conn.roundtrip(
            [conn.frame(Op.CLAIM_ACQUIRE, {"scope": scope, "key": f"k{i}",
                                           "lease_seconds": MASS_LEASE_SECONDS})
             for i in range(start, start + 2000)], timeout=30)
        leases += [msg[2]["lease"] for msg in got if msg[0] == 2]
    ctx.state.update(conn=conn, leases=leases)
    return f"{len(leases)} claims held ({time.monotonic() - started:.1f} s to acquire)"


async def mass_expiry(ctx: Ctx) -> str:
    """Renew every lease in one burst (the fast path: a few ms in all), so that they all
    come due within a few ms of each other; drop the connection; wait for the expiry."""
    conn, leases = ctx.state["conn"], ctx.state["leases"]
    frames = [conn.frame(Op.LEASE_RENEW, {"leases": leases[i : i + 1000]})
              for i in range(0, len(leases), 1000)]
    got = await conn.roundtrip(frames, timeout=30)
    renewed = sum(r is None for msg in got if msg[0] == 2 for r in msg[2]["results"])
    conn.close()
    await ctx.hold(MASS_LEASE_SECONDS + 3)
    stats_conn = await Raw.open(ctx.server.address)
    stats = await stats_conn.ok(Op.SERVER_STATS, {})
    stats_conn.close()
    return (f"{renewed} leases renewed at once, then expiring together; "
            f"{stats['core']['leases']} left after {MASS_LEASE_SECONDS + 3} s; "
            f"loop stalls {stats['loop'].get('stalls')}")


# ---- 5. recovery at the mercy of payload bytes ----------------------------------------


def _frame_like(count: int) -> bytes:
    """``count`` frames in the journal's version-1 framing (length, CRC-32, msgpack
    batch), back to back: what a torn-tail scan might take for real frames."""
    out = bytearray()
    for i in range(count):
        payload = msgpack.packb([[1, i]], use_bin_type=True)
        out += struct.pack(">II", len(payload), zlib.crc32(payload)) + payload
    return bytes(out)


async def torn_journal(ctx: Ctx) -> str:
    server = ctx.server
    frames = ctx.n(6000, 1000)
    fake = _frame_like(frames)
    conn, scope = await _setup_conn(ctx)
    await conn.ok(Op.TASK_SUBMIT, {"scope": scope, "mailbox": "jobs", "key": "before",
                                   "data": {"n": 1}})
    await conn.ok(Op.TASK_SUBMIT, {"scope": scope, "mailbox": "jobs", "key": "frame-like",
                                   "data": fake})
    conn.close()
    server.proc.kill()  # kill -9 after the acknowledged write
    await server.proc.wait()
    segment = max(server.data_dir.glob("journal-*.log"))
    data = segment.read_bytes()
    at = data.rfind(fake)
    if at < 0:
        return "frame-like payload not found verbatim in the last segment"
    middle = at + len(_frame_like(frames // 2))  # a fake frame boundary inside the payload
    outcomes: list[str] = []
    slowest = 0.0
    for align in range(8):
        with tempfile.TemporaryDirectory(prefix="rsd-torn-") as copy:
            target = Path(copy) / "data"
            shutil.copytree(server.data_dir, target)
            with open(target / segment.name, "r+b") as torn:
                torn.truncate(middle + align)
            started = time.monotonic()
            try:
                restarted = await start_rsd(target, ready_timeout=ctx.n(120, 60),
                                            stderr=asyncio.subprocess.DEVNULL)
            except RuntimeError as exc:
                outcomes.append(f"+{align}: restart refused ({str(exc)[:30]})")
            else:
                outcomes.append(f"+{align}: ok")
                await stop_rsd(restarted.proc)
            slowest = max(slowest, time.monotonic() - started)
    refused = [o for o in outcomes if "restart refused" in o]
    return (f"last write torn at 8 alignments inside {frames} frame-like frames: "
            f"{8 - len(refused)}/8 restart; slowest restart {slowest:.1f} s"
            + (f"; {'; '.join(refused)}" if refused else ""))


# ---- 6. lost answers ------------------------------------------------------------------


async def _garbage_trial(
    ctx: Ctx, checker: Raw, key: str, split: bool, delay: float = 0.0
) -> tuple[int, int, int]:
    """20 CLAIM_ACQUIREs then a garbage frame: in one write, or (``split``) the garbage
    a moment later, when the acquires have run and their replies may wait for the fsync.
    Returns (replies missing, keys granted without an answer, error frame missing)."""
    conn = await Raw.open(ctx.server.address)
    first = conn.next_id
    acquires = [conn.frame(Op.CLAIM_ACQUIRE, {"scope": "answers", "key": f"{key}-{i}",
                                              "lease_seconds": 5}) for i in range(20)]
    garbage = struct.pack(">I", 3) + b"\xc1\xc1\xc1"  # 0xc1 is never valid msgpack
    if split:
        conn.send(b"".join(acquires))
        await conn.drain()
        if delay:
            time.sleep(delay)  # a moment, shorter than a loop turn's timer resolution
        conn.send(garbage)
    else:
        conn.send(b"".join(acquires) + garbage)
    got = await conn.collect(100, timeout=5)
    conn.close()
    replies = {msg[1] for msg in got if msg[0] == 2 and first <= msg[1] < first + 20}
    no_error = not any(msg[0] == 3 and msg[1] == 0 for msg in got)
    views = await checker.roundtrip(
        [checker.frame(Op.CLAIM_INSPECT, {"scope": "answers", "key": f"{key}-{i}"})
         for i in range(20)], timeout=10)
    held = {i for i, msg in enumerate(views) if msg[0] == 2 and msg[2].get("held")}
    orphans = len({i for i in held if first + i not in replies})
    return 20 - len(replies), orphans, int(no_error)


async def answers_before_goodbye(ctx: Ctx) -> str:
    trials = ctx.n(300, 50)
    deadline = time.monotonic() + 90
    checker = await Raw.open(ctx.server.address)
    parts = []
    for split in (False, True):
        lossy = orphan_trials = orphans = no_error = done = 0
        for trial in range(trials // 2):
            if time.monotonic() > deadline or ctx.abort.is_set():
                break
            missing, orphaned, error_missing = await _garbage_trial(
                ctx, checker, f"{split}-{trial}", split, (trial % 6) * 0.0001)
            lossy += missing > 0
            orphans += orphaned
            orphan_trials += orphaned > 0
            no_error += error_missing
            done += 1
        how = "garbage in a 2nd write" if split else "garbage in the same write"
        parts.append(f"{how}: replies missing in {lossy}/{done} trials, {orphans} keys "
                     f"granted unanswered ({orphan_trials} trials), error frame missing "
                     f"in {no_error}")
    checker.close()
    oversized = ctx.n(20, 5)
    too_large = 0
    for _ in range(oversized):
        conn = await Raw.open(ctx.server.address)
        size = MAX_FRAME_BYTES + 1
        with contextlib.suppress(Exception):
            conn.send(struct.pack(">I", size) + b"\x00" * size)
            await conn.drain(5)
        got = await conn.collect(1, timeout=3)
        too_large += any(msg[0] == 3 and msg[2] == "FRAME_TOO_LARGE" for msg in got)
        conn.close()
    return (f"20 acquires, then {'; '.join(parts)}; oversized frame with body: "
            f"FRAME_TOO_LARGE {too_large}/{oversized} (else reset)")


# ---- 7. the SDK believes a lease for too long -----------------------------------------


def _take_when_free(address: str, scope: str, granted_at: list[float],
                    granted: threading.Event) -> None:
    """In a thread of its own: wait for the claim ``k`` and note when it is granted."""
    from rsclient import AsyncRunstate

    async def take() -> None:
        async with AsyncRunstate(holder="next-owner", address=address) as rs:
            theirs = await rs.scope(scope).claim("k", lease_seconds=5).acquire(
                wait=True, timeout_ms=20_000)
            granted_at.append(time.monotonic())
            granted.set()
            await theirs.release()

    asyncio.run(take())


async def sdk_blocked_loop(ctx: Ctx) -> str:
    from rsclient import AsyncRunstate

    trials = ctx.n(2, 1)
    stale: list[float] = []
    working: list[float] = []
    first_look: list[bool] = []
    address = ctx.server.address
    async with AsyncRunstate(holder="blocked", address=address) as rs:
        for _ in range(trials):
            run = await rs.scopes.create()
            lease = await run.claim("k", lease_seconds=5).acquire()
            granted = threading.Event()
            granted_at: list[float] = []
            thread = threading.Thread(
                target=_take_when_free, args=(address, run.id, granted_at, granted),
                daemon=True,
            )
            thread.start()
            granted.wait(15)  # the holder's event loop is blocked meanwhile
            if not granted_at:
                return "the next owner was never granted the key"
            first_look.append(lease.is_lost)
            # The code keeps working without yielding (50 ms steps, up to 2 s), looking
            # at is_lost between steps as the guide says; then it yields.
            while not lease.is_lost and time.monotonic() - granted_at[0] < 2.0:
                time.sleep(0.05)
            working.append(time.monotonic() - granted_at[0])
            while not lease.is_lost and time.monotonic() - granted_at[0] < 15:
                await asyncio.sleep(0.001)
            stale.append(time.monotonic() - granted_at[0])
            await asyncio.to_thread(thread.join, 10)
    return (f"after a blocked loop: lost at the first look in {sum(first_look)}/{trials}; "
            f"is_lost said held up to {max(working) * 1000:.0f} ms after the next owner's "
            f"grant while the code worked on without yielding (bound 2000 ms), "
            f"{max(stale) * 1000:.0f} ms in all")


ATTACKS = [
    Attack("1", "reply amplification (6 conns x 60 KB TASK_STATUS, 250 KB result)",
           amplification, prepare_amplification),
    Attack("2a", "1000 SERVER_STATS pipelined, many parked waits", stats_storm,
           prepare_parked),
    Attack("2b", "parked receives cancelled newest-first", cancel_newest_first,
           prepare_parked),
    Attack("3", "connection flood up to the file limit", flood, prepare_flood,
           args=("--snapshot-bytes", "1000000"), nofile=4096),
    Attack("4a", "receives on made-up run ids", made_up_reads),
    Attack("4b", "hour-long waits cancelled", cancelled_waits),
    Attack("4c", "distinct claims acquired and released", released_claims),
    Attack("4d", "100 conns holding a 1 MiB partial frame", partial_frames),
    Attack("4e", "100,000 leases expiring at one instant", mass_expiry, prepare_mass_expiry),
    Attack("5", "torn journal, frame-like payloads, restart", torn_journal, watched=False,
           budget=400.0),
    Attack("6", "pipelined acquires + garbage; oversized frame (--fsync always)",
           answers_before_goodbye, args=("--fsync", "always")),
    Attack("7", "SDK: loop blocked past a 5 s lease", sdk_blocked_loop),
    Attack("8a", "SCOPE_CANCEL of a run of 100,000 tasks", big_run_cancel, prepare_big_run),
    Attack("8b", "one success meets 10,000 GROUP_WAITs for 10,000 tasks", group_fan_out,
           prepare_group_fan_out),
    Attack("8c", "RECEIVE max=256 at 512 KiB a batch, unread", batch_receives_unread,
           prepare_batch_receives),
    Attack("8d", "TASK_SUBMIT_MANY of 256 x 4 KB, pipelined", submit_many_at_the_limit),
    Attack("8e", "SNAPSHOT_NOW flood", snapshot_flood),
    Attack("8f", "paged admin listings of a huge run", listings_of_a_big_run, prepare_big_run),
]


# ---- measuring ------------------------------------------------------------------------


class Bystander:
    """The bystander process: started on a server, asked for a report per window."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, address: str) -> Bystander:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.hostile", "--bystander", address,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if line.strip() != b"ready":
            raise RuntimeError(f"bystander did not start: {line!r}")
        return cls(proc)

    async def report(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"report\n")
        await self.proc.stdin.drain()
        report: dict[str, Any] = json.loads(
            await asyncio.wait_for(self.proc.stdout.readline(), 30)
        )
        return report

    async def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def _sample_rss(server: RsdProcess, base: int, peak: list[int], ctx: Ctx) -> None:
    while True:
        rss = server.rss_bytes()
        if rss is None:
            return
        peak[0] = max(peak[0], rss)
        if rss - base > RSS_CAP:
            ctx.abort.set()
        await asyncio.sleep(0.05)


@contextlib.contextmanager
def _nofile(limit: int | None) -> Any:
    """Lower this process's descriptor limit while rsd is started (rsd inherits it)."""
    if limit is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def measure(attack: Attack, quick: bool) -> Row:
    row = Row(attack.key, attack.name)
    with tempfile.TemporaryDirectory(prefix="rsd-hostile-") as data:
        log = open(Path(data) / "rsd.log", "wb")  # noqa: SIM115 - closed below
        with _nofile(attack.nofile):
            server = await start_rsd(Path(data) / "data", *attack.args, stderr=log)
        ctx = Ctx(server, quick)
        notes: list[str] = []
        bystander: Bystander | None = None
        try:
            if attack.prepare is not None:
                notes.append(await attack.prepare(ctx))
            if attack.watched:
                bystander = await Bystander.start(server.address)
                await bystander.report()  # the window opens now
            base = server.rss_bytes() or 0
            peak = [base]
            sampler = asyncio.create_task(_sample_rss(server, base, peak, ctx))
            try:
                notes.append(await asyncio.wait_for(attack.run(ctx), attack.budget))
            except TimeoutError:
                notes.append(f"stopped at the {attack.budget:.0f} s budget")
            except Exception as exc:
                notes.append(f"attack failed: {type(exc).__name__}: {exc}"[:160])
            if ctx.abort.is_set():
                notes.append(f"stopped at the {RSS_CAP // MB} MB memory cap")
            if attack.watched:
                await asyncio.sleep(1.0)  # let the server settle, still measured
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            if bystander is not None:
                after = server.rss_bytes()
                row.ping = await bystander.report()
                row.rss_peak_mb = (peak[0] - base) / MB
                row.rss_after_mb = None if after is None else (after - base) / MB
        finally:
            if bystander is not None:
                await bystander.stop()
            code = await stop_rsd(server.proc)
            log.close()
        if code not in (0, None) and attack.watched and "EXITED" not in "".join(notes):
            notes.append(f"rsd exit code {code}")
            tail = (Path(data) / "rsd.log").read_text(errors="replace").strip().splitlines()
            if tail:
                notes.append(f"log: {tail[-1][:120]}")
    row.notes = "; ".join(n for n in notes if n)
    return row


def _fmt(row: Row) -> list[str]:
    rss = "-" if row.rss_peak_mb is None else (
        f"{row.rss_peak_mb:.0f}" + ("" if row.rss_after_mb is None else
                                    f" ({row.rss_after_mb:.0f} after)")
    )
    if row.ping is None:
        ping, lost = "-", "-"
    else:
        ping = f"{row.ping['max_ms']:.0f} / {row.ping['p99_ms']:.0f}"
        if row.ping["errors"]:
            ping += f" ({row.ping['errors']} failed)"
        lost = str(row.ping["lost"])
    return [f"{row.key} {row.name}", rss, ping, lost, row.notes]


def _misses(row: Row) -> list[str]:
    out = []
    if row.rss_peak_mb is not None and row.rss_peak_mb >= TARGET_RSS_MB:
        out.append(f"RSS +{row.rss_peak_mb:.0f} MB")
    if row.ping is not None:
        if not row.ping["p99_ms"] < TARGET_P99_MS:
            out.append(f"PING p99 {row.ping['p99_ms']:.0f} ms")
        if row.ping["lost"]:
            out.append(f"{row.ping['lost']} lease(s) lost")
    if any(word in row.notes for word in ("restart refused", "EXITED", "exit code")):
        out.append("rsd refused to start or exited")
    return out


def print_table(rows: list[Row]) -> None:
    header = ["attack", "RSS growth MB", "bystander PING max/p99 ms", "leases lost", "notes"]
    lines = [header] + [_fmt(row) for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    for i, line in enumerate(lines):
        print(" | ".join(cell.ljust(widths[j]) if j < 4 else cell
                         for j, cell in enumerate(line)))
        if i == 0:
            print("-+-".join("-" * w for w in widths) + "-+-" + "-" * 5)
    print(f"\ntargets: RSS growth < {TARGET_RSS_MB} MB, PING p99 < {TARGET_P99_MS} ms, "
          f"0 leases lost")
    for row in rows:
        missed = _misses(row)
        if missed:
            print(f"  {row.key}: misses {', '.join(missed)}")


async def main(args: argparse.Namespace) -> None:
    chosen = [a for a in ATTACKS if not args.only or a.key in args.only.split(",")]
    rows = []
    for attack in chosen:
        started = time.monotonic()
        print(f"[{attack.key}] {attack.name} ...", file=sys.stderr, flush=True)
        row = await measure(attack, args.quick)
        print(f"[{attack.key}] {time.monotonic() - started:.0f} s: {_fmt(row)[1:]}",
              file=sys.stderr, flush=True)
        rows.append(row)
    print_table(rows)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts, shorter holds")
    parser.add_argument("--only",
                        help="comma-separated attack keys (1,2a,2b,3,4a..4e,5,6,7,8a..8f)")
    parser.add_argument("--bystander", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bystander:
        bystander_main(args.bystander)
        return
    os.environ.pop("RUNSTATE_ADDRESS", None)
    asyncio.run(main(args))


if __name__ == "__main__":
    cli()
