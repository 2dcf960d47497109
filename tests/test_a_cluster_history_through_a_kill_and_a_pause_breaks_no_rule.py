"""A randomized workload on a three-node cluster (``--fsync always``, a 2 s cluster
lease) whose primary is killed (SIGKILL) mid-workload, and whose next primary is then
paused (SIGSTOP) past its lease and woken: the whole history, recorded op by op
(support/history.py), keeps every rule of the checker: no acknowledged change lost,
never two live holders of one claim, one result per task (and a refused completion is
not it), stale tokens refused, no reply from a replaced primary.

The clients, each an ``AsyncRunstate`` given every node: planners submit keyed tasks
(keys shared between them) and wait for their results; two workers run ``consume()``
and complete each delivery with an outcome naming themselves and the attempt; holders
contend for four claims, check their fencing token while they hold one (and now and then
a token of an earlier grant, which must be refused), renew, and release. The seed of
the randomness is printed, and named in a failure; ``RSD_HISTORY_SEED`` runs one again
(the same choices: keys, holds, pauses; the cluster's timing is its own). The history
is written beside the test's nodes (``history.jsonl``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.cluster import LEASE, kill_all, node_args, primary, start_all, watch_primaries
from support.etcd import EtcdCluster
from support.history import History, Process, Unanswered, check, release, report
from support.process import Rsd

from rsclient import AsyncRunstate, RunstateError
from rsclient.client import Scope
from rsclient.deliveries import Delivery

SHARED = 4  # a planner's key is new, or one of the last SHARED keys drawn by any planner
# Claims: three holders, four keys. A grant whose reply was lost (the primary killed) or
# a release that was (the primary paused) holds its key until its lease ends: enough keys
# stay free for the holders to go on meanwhile.
CLAIM_KEYS = ("w", "x", "y", "z")
CLAIM_LEASE = 5  # seconds, the least a claim may ask for
EXIT_STEPPED_DOWN = 75


async def _planner(proc: Process, run: Scope, rng: random.Random, stop: asyncio.Event,
                   made: list[int]) -> None:
    """Submit a task (mostly a new key, else one of the last few, often another
    planner's) and wait for its result; again until told to stop."""
    mailbox = run.mailbox("work")
    while not stop.is_set():
        n = rng.randrange(max(0, made[0] - SHARED), made[0] + 1)
        made[0] += 1
        try:
            ticket = await proc.call(
                "submit", {"key": f"k{n}", "input": {"n": n}},
                functools.partial(mailbox.submit, {"n": n}, key=f"k{n}"),
                reply=lambda ticket: {"task": ticket.id})
            await proc.call("result", {"task": ticket.id},
                            functools.partial(ticket.result, timeout_ms=2000),
                            reply=lambda view: {"state": view["state"],
                                                "outcome": view.get("outcome")})
        except RunstateError:
            await asyncio.sleep(0.05)
        await asyncio.sleep(rng.uniform(0, 0.03))


async def _worker(proc: Process, run: Scope, rng: random.Random, stop: asyncio.Event) -> None:
    async def handle(data: Any, delivery: Delivery) -> None:
        await asyncio.sleep(rng.uniform(0, 0.05))
        outcome = {"n": data["n"], "by": proc.name, "attempt": delivery.attempt}
        await proc.call("complete", {"task": delivery.task_id, "outcome": outcome},
                        lambda: delivery.complete(result={"payload": outcome}),
                        reply=lambda _: {})

    await run.mailbox("work").consume(handle, concurrency=2, lease_seconds=CLAIM_LEASE,
                                      stop_event=stop, shutdown_timeout=2.0,
                                      on_error=lambda exc, delivery: None)


async def _holder(proc: Process, rs: AsyncRunstate, run: Scope, rng: random.Random,
                  stop: asyncio.Event, granted: list[dict[str, Any]]) -> None:
    """Acquire, hold a while (fence checks, a renewal, now and then an old token's
    check), release; again until told to stop."""
    while not stop.is_set():
        key = rng.choice(CLAIM_KEYS)
        claim = run.claim(key, lease_seconds=CLAIM_LEASE)
        try:
            lease = await proc.call("acquire", {"key": key}, claim.acquire,
                                    reply=lambda lease: {"token": lease.token(),
                                                         "generation": lease.generation})
        except RunstateError:
            await asyncio.sleep(rng.uniform(0.02, 0.1))
            continue
        proc.hold(lease)
        mine = {"key": key, "token": lease.token(), "generation": lease.generation}
        granted.append(mine)
        until = asyncio.get_running_loop().time() + (
            rng.uniform(1.0, 3.0) if rng.random() < 0.2 else rng.uniform(0.05, 0.4))
        with contextlib.suppress(RunstateError):
            while asyncio.get_running_loop().time() < until and not stop.is_set():
                which = rng.random()
                if which < 0.2 and len(granted) > 1:
                    old = rng.choice(granted[:-1])  # most likely stale by now
                    await _fence(proc, rs, run, old)
                elif which < 0.3:
                    await proc.call("renew", mine, lease.renew, reply=lambda _: {})
                else:
                    await _fence(proc, rs, run, mine)
                await asyncio.sleep(rng.uniform(0.02, 0.1))
        with contextlib.suppress(RunstateError, Unanswered):
            await proc.call("release", mine, functools.partial(release, lease),
                            reply=lambda _: {})
        await asyncio.sleep(rng.uniform(0, 0.1))


async def _fence(proc: Process, rs: AsyncRunstate, run: Scope, grant: dict[str, Any]) -> None:
    await proc.call("fence", grant,
                    lambda: rs.fence.status(run, grant["key"], grant["token"]),
                    reply=lambda status: {"current": status["current"],
                                          "generation": status["generation"]})


async def _until(history: History, since: float, at_least: float, *fs: str,
                 at_most: float = 5.0) -> None:
    """Let the workload run ``at_least`` seconds, and on until an op of each function
    ``fs`` invoked after ``since`` was acknowledged (at most ``at_most`` s: the clients
    reconnect, workers park again, a takeover's acknowledgements wait for its standby's
    copy, a claim may be held by a grant whose reply was lost until its lease ends)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while loop.time() - start < at_most:
        if loop.time() - start >= at_least and all(
                any(op.f == f and op.ok and op.invoked > since for op in history.ops)
                for f in fs):
            return
        await asyncio.sleep(0.05)


async def _final_reads(proc: Process, run: Scope, history: History) -> None:
    """After every fault: each key acknowledged, each task seen and each claim, read
    on the final primary."""
    submitted = {op.value["key"]: op.value["input"] for op in history.ops
                 if op.f == "submit" and op.ok}
    tasks = {op.reply["task"] for op in history.ops if op.f == "submit" and op.ok}
    tasks |= {op.value["task"] for op in history.ops if op.f == "complete" and op.ok}
    mailbox = run.mailbox("work")
    reads: list[Awaitable[Any]] = [proc.call("submit", {"key": key, "input": data},
                                         functools.partial(mailbox.submit, data, key=key),
                                         reply=lambda ticket: {"task": ticket.id})
                                   for key, data in sorted(submitted.items())]
    reads += [proc.call("status", {"task": task}, run.task(task).status,
                        reply=lambda view: {"state": view["state"],
                                            "outcome": view.get("outcome")})
              for task in sorted(tasks)]
    reads += [proc.call("inspect", {"key": key}, run.claim(key).inspect,
                        reply=lambda view: {"held": view["held"],
                                            "generation": view["generation"]})
              for key in CLAIM_KEYS]
    await asyncio.gather(*reads)  # pipelined on one connection


async def test_a_cluster_history_through_a_kill_and_a_pause_breaks_no_rule(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    seed = int(os.environ.get("RSD_HISTORY_SEED") or random.randrange(1 << 32))
    print(f"history seed {seed} (RSD_HISTORY_SEED={seed} runs it again)")
    rng = random.Random(seed)
    etcd = etcd_cluster(3)
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    history = History(float(LEASE))
    clients: list[AsyncRunstate] = []
    work: list[asyncio.Task[None]] = []  # workers and holders: they stop when told
    waiting: list[asyncio.Task[None]] = []  # planners: cancelled, their last ops info
    stop = asyncio.Event()

    def client(name: str) -> tuple[Process, AsyncRunstate]:
        rs = AsyncRunstate(holder=name, address=everyone, connect_timeout=10.0)
        clients.append(rs)
        return history.process(name, rs), rs

    def seen(node: Rsd, epoch: int) -> None:
        history.node("primary", node.address, epoch)

    try:
        await start_all(etcd, nodes)
        for node in nodes:
            history.node("started", node.address)
        everyone = ",".join(node.address for node in nodes)
        async with watch_primaries(nodes, seen):
            first, probe, epoch = await primary(nodes)
            await probe.close()
            _, setup = client("setup")
            await setup.mailboxes.ensure("work", mode="WORK")
            run = await setup.scopes.create()
            granted: list[dict[str, Any]] = []
            made = [0]
            loop = asyncio.get_running_loop()
            for i in range(3):
                proc, rs = client(f"planner-{i}")
                waiting.append(loop.create_task(_planner(proc, rs.scope(run.id),
                                                         random.Random(rng.random()),
                                                         stop, made)))
            for i in range(2):
                proc, rs = client(f"worker-{i}")
                work.append(loop.create_task(_worker(proc, rs.scope(run.id),
                                                     random.Random(rng.random()), stop)))
            for i in range(3):
                proc, rs = client(f"holder-{i}")
                work.append(loop.create_task(_holder(proc, rs, rs.scope(run.id),
                                                     random.Random(rng.random()), stop,
                                                     granted)))

            await asyncio.sleep(rng.uniform(0.5, 1.0))
            killed = history.node("killed", first.address)
            await first.kill()
            survivors = [node for node in nodes if node is not first]
            second, probe, epoch = await primary(survivors, after=epoch)
            await probe.close()
            # It comes back as a standby (in time to be the next primary's standby).
            history.node("started", first.address)  # no later than the process starts
            restarted = loop.create_task(first.start(*node_args(etcd, f"n{nodes.index(first)}")))
            await _until(history, killed.at, rng.uniform(0.3, 0.8),
                         "submit", "complete", "acquire", "fence", "release")
            await restarted
            paused = history.node("paused", second.address)
            second.pause()
            _, probe, epoch = await primary(  # it is replaced while it sleeps
                [node for node in nodes if node is not second], after=epoch)
            await probe.close()
            await asyncio.sleep(paused.at + float(LEASE) + 0.2 - history.now())  # past it
            resumed = history.node("resumed", second.address)
            second.resume()
            assert await second.exited(10) == EXIT_STEPPED_DOWN, second.log()[-2000:]
            await _until(history, resumed.at, rng.uniform(0.3, 0.8), "submit", "complete")
            stop.set()
            for task in waiting:
                task.cancel()
            ended = await asyncio.wait_for(
                asyncio.gather(*work, *waiting, return_exceptions=True), 10)
            crashed = [repr(end) for end in ended if isinstance(end, BaseException)
                       and not isinstance(end, asyncio.CancelledError)]
            assert not crashed, f"clients failed: {crashed} (seed {seed})"
            history.begin_final()
            final, rs = client("final")
            await _final_reads(final, rs.scope(run.id), history)
    finally:
        stop.set()
        for task in work + waiting:
            task.cancel()
        for rs in clients:
            with contextlib.suppress(Exception):
                await rs.close()
        await kill_all(nodes)
        history.dump(tmp_path / "history.jsonl")  # whatever happened
    violations = check(history)
    if violations:
        pytest.fail(report(history, violations, seed) + f"\nhistory: {tmp_path}/history.jsonl")
    _assert_the_workload_went_on_after_each_fault(history, seed)


def _assert_the_workload_went_on_after_each_fault(history: History, seed: int) -> None:
    """Not a rule of the history: a test whose clients did nothing after the faults
    would check nothing. After the kill: every kind of change; after the pause (a short
    while of work before the end): submits, completions, and claims held (a grant or a
    holder's fence check: both keys may be held through that while)."""
    at = {event.kind: event.at for event in history.nodes}
    assert history.final_at is not None
    counts = Counter(f"{op.f} {op.outcome}" for op in history.ops)

    def done(since: float, *fs: str) -> dict[str, int]:
        return {f: sum(1 for op in history.ops if op.f == f and op.ok
                       and since < op.invoked < (history.final_at or 0)) for f in fs}

    after_kill = done(at["killed"], "submit", "complete", "acquire", "fence", "release")
    assert all(after_kill.values()), f"after the kill: {after_kill}; all: {counts} (seed {seed})"
    after_pause = done(at["paused"], "submit", "complete", "acquire", "fence")
    assert after_pause["submit"] and after_pause["complete"] and (
        after_pause["acquire"] or after_pause["fence"]), (
        f"after the pause: {after_pause}; all: {counts} (seed {seed})")
