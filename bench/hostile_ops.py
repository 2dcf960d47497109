"""Hostile rows for the ops added in the tenth wave (``bench.hostile`` keys 8a..8f).

Each attack is one client trying to make a single request, or a short sequence, cost
the server out of proportion to its own size: a run cancel that ends 100,000 tasks, a
group met by one success with thousands of waiters parked on it, batched receives and
batched submits at their byte limits on connections that never read, a flood of forced
snapshots, and paged admin listings of a huge run. ``bench.hostile`` runs each against
a fresh rsd beside its bystander and reports RSS growth and the bystander's PING.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from bench.hostile_clients import Raw
from rsproto import Op

if TYPE_CHECKING:
    from bench.hostile import Ctx

__all__ = [
    "batch_receives_unread", "big_run_cancel", "group_fan_out", "listings_of_a_big_run",
    "prepare_batch_receives", "prepare_big_run", "prepare_group_fan_out", "snapshot_flood",
    "submit_many_at_the_limit",
]


async def _run(ctx: Ctx) -> tuple[Raw, str]:
    conn = await Raw.open(ctx.server.address)
    await conn.ok(Op.MAILBOX_ENSURE, {"name": "jobs"})
    scope = (await conn.ok(Op.SCOPE_CREATE, {}))["scope"]
    return conn, scope


async def _submit(conn: Raw, scope: str, count: int, data: Any = None,
                  group: str | None = None) -> int:
    """``count`` tasks through TASK_SUBMIT_MANY, 256 a frame, 8 frames a window."""
    done = 0
    while done < count:
        frames = []
        for _ in range(8):
            size = min(256, count - done)
            if size <= 0:
                break
            items = [{"key": f"t{done + i}", "data": data,
                      **({"group": group} if group else {})} for i in range(size)]
            frames.append(conn.frame(Op.TASK_SUBMIT_MANY, {"scope": scope, "mailbox": "jobs",
                                                          "items": items, "slim": True}))
            done += size
        await conn.roundtrip(frames, timeout=60)
    return done


# ---- 8a. one SCOPE_CANCEL ends a run of 100,000 tasks ----------------------------------


async def prepare_big_run(ctx: Ctx) -> str:
    conn, scope = await _run(ctx)
    count = ctx.n(100_000, 30_000)
    started = time.monotonic()
    await _submit(conn, scope, count)
    ctx.state.update(conn=conn, scope=scope, count=count)
    return f"{count} tasks in one run ({time.monotonic() - started:.1f} s to submit)"


async def big_run_cancel(ctx: Ctx) -> str:
    conn, scope, count = ctx.state["conn"], ctx.state["scope"], ctx.state["count"]
    started = time.monotonic()
    reply = await conn.ok(Op.SCOPE_CANCEL, {"scope": scope}, timeout=60)
    answered = time.monotonic() - started
    while True:  # until every task is CANCELLED
        status = await conn.ok(Op.SCOPE_STATUS, {"scope": scope}, timeout=60)
        if status["tasks"].get("CANCELLED", 0) >= count or time.monotonic() - started > 60:
            break
        await ctx.hold(0.05)
    return (f"SCOPE_CANCEL answered in {answered * 1000:.0f} ms (tasks {reply['tasks']}); "
            f"all {status['tasks'].get('CANCELLED', 0)} CANCELLED after "
            f"{time.monotonic() - started:.1f} s")


# ---- 8b. one success meets thousands of GROUP_WAITs for the whole group ---------------


async def prepare_group_fan_out(ctx: Ctx) -> str:
    conn, scope = await _run(ctx)
    tasks = waiters = ctx.n(10_000, 3_000)
    await _submit(conn, scope, tasks, group="g")
    leases: list[bytes] = []
    while len(leases) < tasks:
        got = await conn.ok(Op.RECEIVE, {"scope": scope, "mailbox": "jobs", "max": 256})
        leases += [d["lease"] for d in got["deliveries"]]
    for start in range(0, tasks - 1, 2000):  # all but the last one
        await conn.roundtrip([conn.frame(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": i})
                              for i, lease in enumerate(leases[start : min(start + 2000,
                                                                           tasks - 1)])],
                             timeout=60)
    parker = await Raw.open(ctx.server.address)
    parker.send(b"".join(parker.frame(Op.GROUP_WAIT, {"scope": scope, "group": "g",
                                                      "need": tasks, "outcomes": False,
                                                      "timeout_ms": 3_600_000})
                         for _ in range(waiters)))
    await parker.drain()
    await conn.ok(Op.PING, {})
    ctx.state.update(conn=conn, parker=parker, last=leases[-1], tasks=tasks, waiters=waiters)
    return f"{waiters} GROUP_WAITs parked for all {tasks} tasks of one group (never read)"


async def group_fan_out(ctx: Ctx) -> str:
    conn = ctx.state["conn"]
    started = time.monotonic()
    await conn.ok(Op.DELIVERY_COMPLETE, {"lease": ctx.state["last"], "outcome": 0}, timeout=120)
    took = time.monotonic() - started
    await ctx.hold(ctx.n(5, 3))
    ctx.state["parker"].close()
    owed = ctx.state["waiters"] * ctx.state["tasks"] * 40 / (1 << 20)
    return (f"the last success answered in {took * 1000:.0f} ms; "
            f"{ctx.state['waiters']} replies of {ctx.state['tasks']} entries owed "
            f"(~{owed:,.0f} MB encoded) to a connection that never reads")


# ---- 8c. RECEIVE max=256 at 512 KiB a batch, on connections that never read -----------


async def prepare_batch_receives(ctx: Ctx) -> str:
    conn, scope = await _run(ctx)
    conns = ctx.n(40, 16)
    per_conn = 8
    batches = conns * per_conn
    await _submit(conn, scope, batches * 128, data=b"d" * 4000)  # 128 x 4 KB: 512 KB a batch
    ctx.state.update(conn=conn, scope=scope, conns=conns, per_conn=per_conn)
    return f"{batches * 128} tasks of 4 KB"


async def batch_receives_unread(ctx: Ctx) -> str:
    conn, scope = ctx.state["conn"], ctx.state["scope"]
    conns, per_conn = ctx.state["conns"], ctx.state["per_conn"]
    batches = conns * per_conn
    readers = [await Raw.open(ctx.server.address) for _ in range(conns)]
    for reader in readers:
        reader.send(b"".join(reader.frame(Op.RECEIVE, {"scope": scope, "mailbox": "jobs",
                                                       "max": 256, "lease_seconds": 600})
                             for _ in range(per_conn)))
    await ctx.hold(ctx.n(8, 4))
    status = await conn.ok(Op.SCOPE_STATUS, {"scope": scope})
    for reader in readers:
        reader.close()
    owed = batches * 512 / 1024
    return (f"{conns} conns x {per_conn} RECEIVE max=256 unread (~{owed:,.0f} MB of "
            f"deliveries asked for); running {status['tasks'].get('RUNNING', 0)}")


# ---- 8d. TASK_SUBMIT_MANY of 256 items filling the frame, pipelined, unread -----------


async def submit_many_at_the_limit(ctx: Ctx) -> str:
    _, scope = await _run(ctx)
    conns = [await Raw.open(ctx.server.address) for _ in range(4)]
    frames_each = ctx.n(60, 20)
    data = b"s" * 4000  # 256 items x ~4 KB: just under the 1 MiB frame
    sent = 0
    for n, conn in enumerate(conns):
        for f in range(frames_each):
            items = [{"key": f"c{n}-{f}-{i}", "data": data} for i in range(256)]
            conn.send(conn.frame(Op.TASK_SUBMIT_MANY, {"scope": scope, "mailbox": "jobs",
                                                      "items": items}))
            sent += 1
    await ctx.hold(ctx.n(10, 5))
    got = await conns[0].collect(frames_each, timeout=30)
    errors = sum(1 for msg in got if msg[0] == 3)
    for conn in conns:
        conn.close()
    return (f"4 conns x {frames_each} TASK_SUBMIT_MANY of 256 x 4 KB "
            f"({sent * 256:,} tasks, ~{sent:,} MB sent); first conn: {len(got)} answered, "
            f"{errors} refused")


# ---- 8e. SNAPSHOT_NOW flood ------------------------------------------------------------


async def snapshot_flood(ctx: Ctx) -> str:
    conn, scope = await _run(ctx)
    await _submit(conn, scope, ctx.n(50_000, 10_000))
    flood = await Raw.open(ctx.server.address)
    total = ctx.n(2000, 500)
    started = time.monotonic()
    got = await flood.roundtrip([flood.frame(Op.SNAPSHOT_NOW, {}) for _ in range(total)],
                                timeout=60)
    took = time.monotonic() - started
    codes: dict[str, int] = {}
    for msg in got:
        key = "ok" if msg[0] == 2 else str(msg[2])
        codes[key] = codes.get(key, 0) + 1
    flood.close()
    return f"{total} SNAPSHOT_NOW pipelined over a run of tasks: {codes} in {took:.1f} s"


# ---- 8f. paged admin listings of a huge run, pipelined --------------------------------


async def listings_of_a_big_run(ctx: Ctx) -> str:
    conn, scope, count = ctx.state["conn"], ctx.state["scope"], ctx.state["count"]
    lister = await Raw.open(ctx.server.address)
    total = ctx.n(2000, 500)
    frames = []
    for i in range(total):
        op = (Op.ADMIN_TASKS, Op.ADMIN_CLAIMS, Op.ADMIN_SCOPES)[i % 3]
        args: dict[str, Any] = {"scope": scope} if op != Op.ADMIN_SCOPES else {}
        if op == Op.ADMIN_TASKS:
            args["state"] = "SUCCEEDED"  # matches none: every page scans its most
        frames.append(lister.frame(op, {**args, "limit": 1000}))
    started = time.monotonic()
    got = await lister.roundtrip(frames, timeout=90)
    took = time.monotonic() - started
    errors = sum(1 for msg in got if msg[0] == 3)
    lister.close()
    del conn
    return (f"{total} admin listings (limit 1000, tasks filtered to none) of a run of "
            f"{count} tasks: {len(got)} answered ({errors} errors) in {took:.1f} s")
