"""The steps of ``python -m bench``: each measures one thing on a fresh rsd (fresh data
directory) and, where a user would pick something else for the job, the same thing on a
fresh peer with matched durability, and returns its figures.

Every step reuses the single-purpose programs of ``bench/`` (claims, tasks, renewals,
durability, cluster) and the peers' counterparts (``redis_claims``, ``beanstalk_tasks``).

``cluster`` (``bench.cluster``: a three-node cluster beside a single rsd, its takeovers
and its replication lag) needs etcd and takes minutes: it runs only when named
(``--only cluster``), once unless ``--repeat`` says otherwise (``OPT_IN``);
BENCH_CLUSTER_LOGS=DIR keeps its node and etcd logs there.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import statistics
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bench import (
    beanstalk_tasks,
    claims,
    cluster,
    durability,
    fanout,
    keyed,
    ordered,
    progress,
    redis_claims,
    renewals,
    schedules,
    shardmove,
    shards,
    tasks,
    waits,
)
from bench.claims import pct
from bench.figures import Figure
from bench.harness import rsd_process
from bench.peers import beanstalkd_server, redis_server
from bench.state import hold_leases, queue_tasks
from bench.takeover import (
    LEASE_SECONDS,
    REDIS_POLL_SECONDS,
    fast_takeovers,
    redis_takeover,
    takeover,
)

__all__ = ["OPT_IN", "STEPS", "Context"]

CLIENTS = 64  # coroutines on the one rsd / redis-py client, tasks in flight
PEER_DURABILITY = {
    "no": ("Redis without persistence", "beanstalkd without -b"),
    "always": ("Redis appendfsync always", "beanstalkd -b -f 0"),
}


@dataclass
class Context:
    """What every step needs: its time per measurement, the size mode and the peers."""

    seconds: float
    quick: bool
    peers: dict[str, str]
    kills: int | None = None  # the cluster step's kills of its primary (None: its default)

    def command(self, step: str) -> str:
        """The command that reproduces this step's figures."""
        return f"python -m bench --only {step}" + (" --quick" if self.quick else "")

    @property
    def levels(self) -> list[int]:
        return [1, 64, 1024] if self.quick else [1, 4, 16, 64, 256, 1024]

    @property
    def lease_counts(self) -> list[int]:
        return [10_000] if self.quick else [10_000, 100_000]

    @property
    def queued(self) -> int:
        return 10_000 if self.quick else 100_000

    @property
    def recovery_size(self) -> int:
        return 10_000 if self.quick else 100_000


def say(line: str) -> None:
    """A progress line on stderr."""
    print(line, file=sys.stderr, flush=True)


class Measured(Protocol):
    """A server this harness started (rsd or a peer), whose memory it reads."""

    def rss_bytes(self) -> int | None: ...


def _rss(server: Measured) -> int:
    value = server.rss_bytes()
    if value is None:
        raise RuntimeError("the server exited during the measurement")
    return int(value)


async def step_claims(ctx: Context, policy: str) -> list[Figure]:
    async with rsd_process("--fsync", policy) as server:
        rate = await claims.throughput(server.address, CLIENTS, ctx.seconds)
    peers: dict[str, float] = {}
    if "redis" in ctx.peers:
        async with redis_server(ctx.peers["redis"], durable=policy == "always") as redis:
            peers["redis"] = await redis_claims.claims(redis.port, CLIENTS, ctx.seconds,
                                                       processes=redis_claims.PROCESSES)
    return [Figure(
        f"claims.{policy}",
        f"claims acquire+release, 1 client, {CLIENTS} coroutines, rsd --fsync {policy} "
        f"(peer: redis-py, the {CLIENTS} coroutines in {redis_claims.PROCESSES} processes, "
        f"{PEER_DURABILITY[policy][0]})",
        "pairs/s", ctx.command(f"claims-{policy}"), rate, peers,
    )]


def cpu_per_task(processes: dict[str, float], tasks_done: float) -> dict[str, float]:
    """The extra columns of a task row: each process's CPU seconds over the window as
    microseconds per task (``name CPU us/task``), so the table shows what a task cost
    every process beside the throughput."""
    if tasks_done <= 0:
        return {}
    return {f"{name} CPU us/task": seconds / tasks_done * 1e6
            for name, seconds in processes.items()}


async def rsd_tasks(
    ctx: Context, *rsd_args: str, filled: int = 0
) -> tuple[float, list[float], dict[str, float], float]:
    """bench.tasks' planner + consume() worker on a fresh rsd (``filled`` other tasks
    queued first): tasks/s, the sorted latencies, the CPU per task of rsd, the planner
    and the worker, and rsd's RSS growth per queued task."""
    server_cpu: list[float] = []
    clients: list[float] = []
    async with rsd_process(*rsd_args) as server:
        per_task_bytes = 0.0
        if filled:
            before = _rss(server)
            filler = await queue_tasks(server.address, filled)
            per_task_bytes = (_rss(server) - before) / filled
        rate, latencies = await tasks.measure(server.address, ctx.seconds, CLIENTS, CLIENTS,
                                              server.cpu_seconds, server_cpu, clients)
        if filled:
            filler.transport.close()
    cpu = cpu_per_task({"rsd": server_cpu[0], "planner": clients[0], "worker": clients[1]},
                       len(latencies))
    return rate, latencies, cpu, per_task_bytes


async def beanstalkd_tasks(ctx: Context, durable: bool, peers: dict[str, float],
                           extra: dict[str, float], filled: int = 0) -> float:
    """The beanstalkd peer in its best shape (bench.beanstalk_tasks): its rate into
    ``peers``, its server's and its clients' CPU per job into ``extra``; returns the
    server's RSS growth per job of ``filled`` jobs left ready in another tube first."""
    async with beanstalkd_server(ctx.peers["beanstalkd"], durable) as bs:
        per_job = 0.0
        if filled:
            before = _rss(bs)
            await asyncio.to_thread(beanstalk_tasks.fill, bs.port, filled)
            per_job = (_rss(bs) - before) / filled
        run = await beanstalk_tasks.tasks(bs.port, bs.proc.pid, ctx.seconds)
    peers["beanstalkd"] = run.rate
    extra |= cpu_per_task({"beanstalkd": run.server_cpu, "greenstalk clients": run.client_cpu},
                          run.jobs)
    return per_job


async def step_tasks(ctx: Context, policy: str) -> list[Figure]:
    rate, _, extra, _ = await rsd_tasks(ctx, "--fsync", policy)
    peers: dict[str, float] = {}
    if "beanstalkd" in ctx.peers:
        await beanstalkd_tasks(ctx, policy == "always", peers, extra)
    return [Figure(
        f"tasks.{policy}",
        f"tasks submit->receive->complete->result, 1 planner ({CLIENTS} in flight) + 1 "
        f"worker process, rsd --fsync {policy} (peer: greenstalk, {beanstalk_tasks.SHAPE}, "
        f"{PEER_DURABILITY[policy][1]})",
        "tasks/s", ctx.command(f"tasks-{policy}"), rate, peers, extra=extra,
    )]


async def step_manual(ctx: Context) -> list[Figure]:
    server_cpu: list[float] = []
    client_cpu: list[float] = []
    async with rsd_process("--fsync", "no") as server:
        rate = await tasks.manual(server.address, ctx.seconds, CLIENTS, server.cpu_seconds,
                                  server_cpu, client_cpu)
    extra = cpu_per_task({"rsd": server_cpu[0], "client (planner and worker)": client_cpu[0]},
                         rate * ctx.seconds)
    peers: dict[str, float] = {}
    if "beanstalkd" in ctx.peers:
        await beanstalkd_tasks(ctx, False, peers, extra)
    return [Figure(
        "tasks.manual",
        f"tasks, the guide's manual loop: submit->receive->complete from {CLIENTS} "
        f"coroutines of 1 client, rsd --fsync no (peer: greenstalk, {beanstalk_tasks.SHAPE}, "
        f"{PEER_DURABILITY['no'][1]})",
        "tasks/s", ctx.command("tasks-manual"), rate, peers, extra=extra,
    )]


async def step_renewals(ctx: Context) -> list[Figure]:
    echo = await renewals.echo_rate(ctx.seconds, 512)
    async with rsd_process("--fsync", "no") as server:
        single, batched, errors, _ = await renewals.renewal_rates(server.address, ctx.seconds,
                                                               512, 1000)
    if errors:
        raise RuntimeError(f"{errors} renewals were refused")
    command = ctx.command("renewals")
    return [
        Figure("renewals.single", "LEASE_RENEW, one lease per frame, pipelined (window 512) "
               "(peer: a bare uvloop msgpack echo server)", "frames/s", command, single,
               {"echo": echo}),
        Figure("renewals.batch", "LEASE_RENEW, 1000 leases per frame", "renewals/s", command,
               batched),
    ]


async def step_handoff(ctx: Context) -> list[Figure]:
    async with rsd_process("--fsync", "no") as server:
        samples = await claims.handoff(server.address, 100 if ctx.quick else 500)
    return [Figure("handoff", "release -> waiter grant on another client, --fsync no",
                   "ms p50", ctx.command("handoff"), pct(samples, 0.5), better="lower",
                   extra={"p99 ms": pct(samples, 0.99)})]


async def step_result_latency(ctx: Context) -> list[Figure]:
    async with rsd_process("--fsync", "no") as server:
        _, latencies = await tasks.measure(server.address, ctx.seconds, 1, 1)
    return [Figure("result-latency", "complete -> result push, one task in flight, --fsync no",
                   "ms p50", ctx.command("result-latency"), pct(latencies, 0.5),
                   better="lower", extra={"p99 ms": pct(latencies, 0.99)})]


async def step_signal_round_trip(ctx: Context) -> list[Figure]:
    async with rsd_process("--fsync", "no") as server:
        whole, woken = await waits.round_trips(server.address, 200 if ctx.quick else 1000)
    return [Figure("signal-round-trip",
                   "suspend -> signal -> redelivery of a waiting task, --fsync no", "ms p50",
                   ctx.command("signal-round-trip"), pct(whole, 0.5), better="lower",
                   extra={"p99 ms": pct(whole, 0.99),
                          "signal -> redelivery p50 ms": pct(woken, 0.5),
                          "signal -> redelivery p99 ms": pct(woken, 0.99)})]


async def step_progress(ctx: Context) -> list[Figure]:
    followers = 10
    rate, latencies, missed = await progress.run(ctx.seconds, followers, 16)
    command = ctx.command("progress")
    return [
        Figure("progress", f"progress events through one task to {followers} followers "
               "(ticket.events()), 16 progress() in flight, --fsync no, the per-task rate "
               "raised (--test-progress-rate)", "events/s", command, rate,
               extra={"missed": float(missed)}),
        Figure("progress-latency", f"progress() -> the event in each of {followers} "
               "followers' hands, one in flight, --fsync no", "ms p50", command,
               pct(latencies, 0.5), better="lower", extra={"p99 ms": pct(latencies, 0.99)}),
    ]


async def step_fanout(ctx: Context) -> list[Figure]:
    children = 1000
    (fan_submits, fan_tasks), (plain_submits, plain_tasks) = await fanout.run(
        children, 1 if ctx.quick else 3)
    command = ctx.command("fanout")
    what = (f"a held root, {children} children after it (after=[root], parent=root), 16 "
            "joins after 63 children each and a final join after them: 1,018 tasks, one "
            "consume() worker (64 at a time), --fsync no (peer: as many plain submits, the "
            "same client and worker)")
    return [
        Figure("fanout-submits", f"{what}: the submits (all BLOCKED)", "submits/s", command,
               fan_submits, {"plain submits": plain_submits}),
        Figure("fanout", f"{what}: submits, then the root's completion and the drain",
               "tasks/s", command, fan_tasks, {"plain submits": plain_tasks}),
    ]


async def step_takeover(ctx: Context) -> list[Figure]:
    async with rsd_process("--fsync", "no") as server:
        took = await takeover(server.address)
        fast = await fast_takeovers(server.address, 5 if ctx.quick else 30)
    peers: dict[str, float] = {}
    if "redis" in ctx.peers:
        async with redis_server(ctx.peers["redis"], durable=False) as redis:
            peers["redis"] = await redis_takeover(redis.port)
    return [
        Figure("takeover", f"kill -9 of a holder process -> grant to a waiter (lease "
               f"{LEASE_SECONDS} s; peer: a Redis lock of {LEASE_SECONDS} s, the waiter "
               f"retrying SET NX every {REDIS_POLL_SECONDS * 1000:.0f} ms)", "s",
               ctx.command("takeover"), took, peers, better="lower"),
        Figure("takeover.release-on-disconnect", "the same, the claim taken with "
               f"release_on_disconnect ({len(fast)} kills; peer: the Redis lock above)",
               "ms p50", ctx.command("takeover"), pct(fast, 0.5),
               {peer: value * 1000 for peer, value in peers.items()}, better="lower",
               extra={"p99 ms": pct(fast, 0.99)}),
    ]


async def step_schedule_jitter(ctx: Context) -> list[Figure]:
    async with rsd_process("--fsync", "always") as server:
        late, doubled = await schedules.measure(
            server.address, 4.0 if ctx.quick else max(10.0, ctx.seconds), 20)
    return [Figure("schedule-jitter", "fire time -> task in a parked worker's hands, 20 "
                   "schedules of every_seconds=1, --fsync always", "ms p99",
                   ctx.command("schedule-jitter"), schedules.pct(late, 0.99), better="lower",
                   extra={"p50 ms": schedules.pct(late, 0.5), "fires": float(len(late)),
                          "doubled": float(doubled)})]


async def step_fsync(ctx: Context) -> list[Figure]:
    figures = []
    for policy in ("always", "everysec", "no"):
        changes, fsyncs = await durability.policy_throughput(policy, ctx.seconds, CLIENTS)
        figures.append(Figure(
            f"fsync.{policy}", f"journaled changes, {CLIENTS} clients on 4 connections, "
            f"--fsync {policy}", "changes/s", ctx.command("fsync"), changes,
            extra={"fsyncs/s": fsyncs}))
    return figures


async def step_recovery(ctx: Context) -> list[Figure]:
    n = ctx.recovery_size
    with contextlib.redirect_stdout(io.StringIO()):
        journal = durability.recover_journal(n)
        snapshot = durability.recover_snapshot(n)
    command = ctx.command("recovery")
    return [
        Figure("recovery.journal", f"recovery of a journal of {n:,} records", "s", command,
               journal, better="lower"),
        Figure("recovery.snapshot", f"recovery of a snapshot of {n:,} live tasks", "s",
               command, snapshot, better="lower"),
    ]


async def step_held_leases(ctx: Context) -> list[Figure]:
    figures = []
    for count in ctx.lease_counts:
        samples: list[float] = []
        async with rsd_process("--fsync", "no") as server:
            before = _rss(server)
            holder = await hold_leases(server.address, count)
            per_claim = (_rss(server) - before) / count
            rate = await claims.throughput(server.address, CLIENTS, ctx.seconds, samples)
            holder.transport.close()
        peers: dict[str, float] = {}
        memory_peers: dict[str, float] = {}
        extra = {"rsd p50 ms": pct(samples, 0.5), "rsd p99 ms": pct(samples, 0.99)}
        if "redis" in ctx.peers:
            async with redis_server(ctx.peers["redis"], durable=False) as redis:
                before = _rss(redis)
                await redis_claims.hold_keys(redis.port, count)
                memory_peers["redis"] = (_rss(redis) - before) / count
                samples = []
                peers["redis"] = await redis_claims.claims(redis.port, CLIENTS, ctx.seconds,
                                                           samples, redis_claims.PROCESSES)
                extra |= {"redis p50 ms": pct(samples, 0.5), "redis p99 ms": pct(samples, 0.99)}
        command = ctx.command("held-leases")
        figures += [
            Figure(f"held-leases.{count}", f"claims acquire+release, {CLIENTS} coroutines, "
                   f"with {count:,} other leases held, --fsync no (peer: redis-py in "
                   f"{redis_claims.PROCESSES} processes)", "pairs/s", command, rate,
                   peers, extra=extra),
            Figure(f"memory.claim.{count}", f"server memory per held claim ({count:,} held; "
                   "peer: RSS per Redis lock key)", "bytes", command, per_claim,
                   memory_peers, better="lower"),
        ]
    return figures


async def step_queued_tasks(ctx: Context) -> list[Figure]:
    count = ctx.queued
    rate, latencies, cpu, per_task = await rsd_tasks(ctx, "--fsync", "no", filled=count)
    extra = {"result p50 ms": pct(latencies, 0.5), "result p99 ms": pct(latencies, 0.99),
             **cpu}
    peers: dict[str, float] = {}
    memory_peers: dict[str, float] = {}
    if "beanstalkd" in ctx.peers:
        memory_peers["beanstalkd"] = await beanstalkd_tasks(ctx, False, peers, extra,
                                                            filled=count)
    command = ctx.command("queued-tasks")
    return [
        Figure(f"queued-tasks.{count}", f"tasks cycle, {CLIENTS} in flight, with {count:,} "
               "other tasks queued, --fsync no", "tasks/s", command, rate, peers,
               extra=extra),
        Figure(f"memory.task.{count}", f"server memory per queued task ({count:,} queued; "
               "peer: RSS per beanstalkd job)", "bytes", command, per_task, memory_peers,
               better="lower"),
    ]


async def step_concurrency(ctx: Context) -> list[Figure]:
    figures = []
    for level in ctx.levels:
        samples: list[float] = []
        async with rsd_process("--fsync", "no") as server:
            rate = await claims.throughput(server.address, level, ctx.seconds, samples)
        extra = {"coroutines": float(level), "rsd p50 ms": pct(samples, 0.5),
                 "rsd p99 ms": pct(samples, 0.99)}
        peers: dict[str, float] = {}
        if "redis" in ctx.peers:
            samples = []
            async with redis_server(ctx.peers["redis"], durable=False) as redis:
                peers["redis"] = await redis_claims.claims(redis.port, level, ctx.seconds,
                                                           samples)
            extra |= {"redis p50 ms": pct(samples, 0.5), "redis p99 ms": pct(samples, 0.99)}
        figures.append(Figure(
            f"concurrency.{level}", f"claims acquire+release, {level} coroutines on 1 client, "
            "--fsync no (peer: Redis without persistence, redis-py in 1 process alike)",
            "pairs/s",
            ctx.command("concurrency"), rate, peers, extra=extra))
    return figures


async def step_cluster(ctx: Context) -> list[Figure]:
    if cluster.etcd_binary() is None:
        say("cluster: skipped, etcd is not installed (apt-get install etcd-server, as root)")
        return []
    kills = ctx.kills if ctx.kills is not None else (
        cluster.QUICK_KILLS if ctx.quick else cluster.DEFAULT_KILLS)
    logs = os.environ.get("BENCH_CLUSTER_LOGS")  # keep the node and etcd logs there
    figs = await cluster.measure(ctx.seconds, kills, keep_logs=Path(logs) if logs else None,
                                 progress=say)
    for line in cluster.report(figs).splitlines():
        say(f"  {line}")
    command = ctx.command("cluster") + (f" --kills {ctx.kills}" if ctx.kills is not None
                                        else "")
    shape = ("3 rsd nodes + 3 etcd members on loopback, --fsync always (peer: a single rsd "
             "--fsync always; target cluster/single >= 0.5)")
    out: list[Figure] = []
    for what, unit, shape_of in (
        ("claims", "pairs/s", f"claims acquire+release, 1 client, {CLIENTS} coroutines, "),
        ("tasks", "tasks/s", f"tasks submit->receive->complete->result, 1 planner "
                             f"({CLIENTS} in flight) + 1 worker process, "),
    ):
        rate = figs.throughput[what]
        if not rate.failed:  # (a failed window is in the report above)
            out.append(Figure(f"cluster.{what}", shape_of + shape, unit, command,
                              rate.cluster, {"single": rate.single}))
    done = figs.takeover.done
    if done:
        firsts = [t.first_ack for t in done]
        out.append(Figure(
            "cluster.takeover", f"kill -9 of the primary -> first acknowledged change on "
            f"the new primary, p50 over {len(done)} kills (cluster lease {figs.lease} s; "
            f"target max <= {figs.target:g} s)", "s", command, statistics.median(firsts),
            better="lower", extra={
                "max s": max(firsts),
                "election p50 s": statistics.median(t.elected for t in done),
                "kills": float(len(done)),
            }))
    lag = figs.lag
    if lag.worst_records or lag.worst:
        worst = lag.worst_records or lag.worst
        unit = "records" if lag.worst_records else "bytes"
        out.append(Figure(
            "cluster.lag", f"replication lag under the claims and tasks load, the standby "
            f"furthest behind, p50 of samples every 0.1 s ({unit}: "
            + ("SERVER_STATS' lag_records" if lag.worst_records
               else "journal bytes, measured from outside") + ")", unit, command,
            pct_of(worst, 0.5), better="lower",
            extra={f"p99 {unit}": pct_of(worst, 0.99), f"max {unit}": float(max(worst)),
                   "max bytes (outside)": float(max(lag.worst)) if lag.worst else 0.0,
                   "held batches max": float(max(lag.held_batches, default=0))}))
    return out


async def step_ordered(ctx: Context) -> list[Figure]:
    """Delivery with 10 priorities and 1,000 fairness keys, beside plain FIFO (the
    "peer"): the pure core's drain and the drain over the wire (bench/ordered.py)."""
    items = 20_000 if ctx.quick else ordered.ITEMS
    figures = await ordered.measure(items, 1 if ctx.quick else 3)
    return [
        Figure(
            f"ordered.{where}",
            f"deliveries (receive + complete) of {items:,} queued messages with 10 "
            f"priorities x 1,000 fairness keys, {how} (peer: the same, plain FIFO)",
            "deliveries/s", ctx.command("ordered"), figures[f"{where}.ordered"],
            {"plain FIFO": figures[f"{where}.plain"]},
        )
        for where, how in (("core", "the pure core"),
                           ("wire", "16 coroutines of 1 client, rsd --fsync no"))
    ]


async def step_keyed(ctx: Context) -> list[Figure]:
    """Tasks with 10,000 distinct concurrency keys, beside plain tasks (the "peer"):
    submit, delivery and completion in the pure core and over the wire
    (bench/keyed.py)."""
    items = 20_000 if ctx.quick else keyed.ITEMS
    figures = await keyed.measure(items, 1 if ctx.quick else 3)
    return [
        Figure(
            f"keyed.{where}",
            f"{items:,} tasks submitted, delivered and completed, each with one of 10,000 "
            f"concurrency keys (limit 2), {how} (peer: the same, plain tasks)",
            "tasks/s", ctx.command("keyed"), figures[f"{where}.keyed"],
            {"plain tasks": figures[f"{where}.plain"]},
        )
        for where, how in (("core", "the pure core, per CPU second"),
                           ("wire", "submit_many, then 16 coroutines of 1 client, "
                                    "rsd --fsync no"))
    ]


async def step_shards(ctx: Context) -> list[Figure]:
    """Claims and tasks through 1, 2 and 4 one-node shards beside a single rsd
    (bench/shards.py): the aggregate throughput and each shard's CPU per operation."""
    if cluster.etcd_binary() is None:
        say("shards: skipped, etcd is not installed (apt-get install etcd-server, as root)")
        return []
    counts = (1, 2) if ctx.quick else (1, 2, 4)
    out: list[Figure] = []
    for fsync in ("no", "always"):
        single = await shards.measure_single(ctx.seconds, fsync)
        runs = [await shards.measure_sharded(n, ctx.seconds, fsync) for n in counts]
        for i, (kind, unit) in enumerate((("claims", "pairs/s"), ("tasks", "tasks/s"))):
            for line in shards.report(single[i], [run[i] for run in runs]):
                say(f"  {line}")
            base = single[i].us_per_op()[0]
            for run in (run[i] for run in runs):
                tax = max(run.us_per_op()) / base
                out.append(Figure(
                    f"shards.{kind}.{fsync}.{run.shards}",
                    f"{kind} through {run.shards} one-node shard(s), each with its own "
                    f"client processes as the single rsd has, --fsync {fsync} (peer: a "
                    f"single rsd alone; target 2 shards >= 1.5x on 2 cores, tax <= 1.1)",
                    unit, ctx.command("shards"), run.rate, {"single": single[i].rate},
                    extra={"CPU per op, worst shard / single": tax}))
    for fsync in ("no", "always"):
        out.append(await _slot_move_figure(ctx, fsync))
    return out


async def _slot_move_figure(ctx: Context, fsync: str) -> Figure:
    """A slot move under load (bench/shardmove.py): the moved slots' write pause, p50
    over the moves, with its max and the other slots' p99 beside."""
    moved = await shardmove.measure(fsync, 2 if ctx.quick else 6, 1000)
    say(f"  {shardmove.report(moved)}")
    held, seen, other = moved["held_ms"], moved["client_pause_ms"], moved["other_p99_ms"]
    return Figure(
        f"shards.move.{fsync}",
        f"write pause of {moved['slots']} slots moved under load between two shards, "
        f"their runs holding {moved['state_tasks']:,} queued tasks, --fsync {fsync}: "
        "requests held, p50 over the moves (extra: max, the client-seen pause, the other "
        "slots' p99 during and outside the moves)",
        "ms", ctx.command("shards"), held["p50"], better="lower",
        extra={"held max ms": held["max"], "client-seen p50 ms": seen["p50"],
               "client-seen max ms": seen["max"], "other p99 during ms": other["during"],
               "other p99 outside ms": other["outside"]})


def pct_of(values: list[int], p: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(len(ordered) * p))])


STEPS: dict[str, Callable[[Context], Awaitable[list[Figure]]]] = {
    "claims-no": lambda ctx: step_claims(ctx, "no"),
    "claims-always": lambda ctx: step_claims(ctx, "always"),
    "tasks-no": lambda ctx: step_tasks(ctx, "no"),
    "tasks-always": lambda ctx: step_tasks(ctx, "always"),
    "tasks-manual": step_manual,
    "renewals": step_renewals,
    "handoff": step_handoff,
    "result-latency": step_result_latency,
    "signal-round-trip": step_signal_round_trip,
    "progress": step_progress,
    "fanout": step_fanout,
    "takeover": step_takeover,
    "schedule-jitter": step_schedule_jitter,
    "fsync": step_fsync,
    "recovery": step_recovery,
    "held-leases": step_held_leases,
    "queued-tasks": step_queued_tasks,
    "concurrency": step_concurrency,
    "ordered": step_ordered,
    "keyed": step_keyed,
    "cluster": step_cluster,
    "shards": step_shards,
}

OPT_IN = frozenset({"cluster", "shards"})
"""Steps run only when named with --only (and once unless --repeat is given)."""
