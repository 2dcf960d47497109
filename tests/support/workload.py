"""The randomized workload of the cluster history tests, recorded op by op in a
``History`` (support/history.py), and what the tests read off it.

A ``Workload`` is the clients, each an ``AsyncRunstate`` given every node's address:
planners submit keyed tasks (keys shared between them) and wait for their results; two
workers run ``consume()`` and complete each delivery with an outcome naming themselves
and the attempt; holders contend for four claims, check their fencing token while they
hold one (and now and then a token of an earlier grant, which must be refused), renew,
and release. ``start`` sets them going, ``until`` lets them work after a fault, ``stop``
ends them (and says which crashed), ``final_reads`` reads every acknowledged change on
the final primary, ``close`` ends whatever is left.

``unavailability(history, start, end)`` measures how long the cluster acknowledged no
change during a fault (for the log; tests assert rules, not timings); ``done`` counts the
changes acknowledged in a while (a test whose clients did nothing after a fault would
check nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import Awaitable
from typing import Any

from rsclient import AsyncRunstate, RunstateError
from rsclient.client import Scope
from rsclient.deliveries import Delivery

from .history import History, Op, Process, Unanswered, release

__all__ = ["CLAIM_KEYS", "CLAIM_LEASE", "WRITES", "Workload", "done", "unavailability"]

SHARED = 4  # a planner's key is new, or one of the last SHARED keys drawn by any planner
# Claims: three holders, four keys. A grant whose reply was lost (the primary killed) or
# a release that was (the primary paused) holds its key until its lease ends: enough keys
# stay free for the holders to go on meanwhile.
CLAIM_KEYS = ("w", "x", "y", "z")
CLAIM_LEASE = 5  # seconds, the least a claim may ask for
WRITES = ("submit", "complete", "acquire", "release")  # the ops that change state


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


class Workload:
    """Three planners, two workers and three holders on one scope, recorded in
    ``history``; ``address`` names every node; ``rng`` draws every choice (the test's
    seed makes them again); ``placement`` places the scope (a sharded cluster)."""

    def __init__(self, history: History, address: str, rng: random.Random,
                 connect_timeout: float = 10.0, placement: str | None = None) -> None:
        self.history = history
        self.placement = placement  # a sharded cluster: the run is placed there
        self.address = address
        self.rng = rng
        self.connect_timeout = connect_timeout
        self.clients: list[AsyncRunstate] = []
        self.work: list[asyncio.Task[None]] = []  # workers and holders: stop when told
        self.waiting: list[asyncio.Task[None]] = []  # planners: cancelled, last ops info
        self.stopping = asyncio.Event()
        self.run_id = ""

    def client(self, name: str) -> tuple[Process, AsyncRunstate]:
        rs = AsyncRunstate(holder=name, address=self.address,
                           connect_timeout=self.connect_timeout)
        self.clients.append(rs)
        return self.history.process(name, rs), rs

    async def start(self) -> None:
        """Make the mailbox and the scope, and set every client going."""
        _, setup = self.client("setup")
        await setup.mailboxes.ensure("work", mode="WORK")
        self.run_id = (await (setup.scopes.create() if self.placement is None else
                              setup.scopes.create(placement=self.placement))).id
        rng, stop, loop = self.rng, self.stopping, asyncio.get_running_loop()
        granted: list[dict[str, Any]] = []
        made = [0]
        for i in range(3):
            proc, rs = self.client(f"planner-{i}")
            self.waiting.append(loop.create_task(_planner(
                proc, rs.scope(self.run_id), random.Random(rng.random()), stop, made)))
        for i in range(2):
            proc, rs = self.client(f"worker-{i}")
            self.work.append(loop.create_task(_worker(
                proc, rs.scope(self.run_id), random.Random(rng.random()), stop)))
        for i in range(3):
            proc, rs = self.client(f"holder-{i}")
            self.work.append(loop.create_task(_holder(
                proc, rs, rs.scope(self.run_id), random.Random(rng.random()), stop, granted)))

    async def until(self, since: float, at_least: float, *fs: str | tuple[str, ...],
                    at_most: float = 5.0) -> None:
        """Let the workload run ``at_least`` seconds, and on until an op of each function
        ``fs`` (a tuple: of one of its functions) invoked after ``since`` was acknowledged
        (at most ``at_most`` s: the clients reconnect, workers park again, a takeover's
        acknowledgements wait for its standby's copy, a claim may be held by a grant
        whose reply was lost until its lease ends)."""
        history = self.history
        loop = asyncio.get_running_loop()
        start = loop.time()
        wanted = [(f,) if isinstance(f, str) else f for f in fs]
        while loop.time() - start < at_most:
            if loop.time() - start >= at_least and all(
                    any(op.f in any_of and op.ok and op.invoked > since for op in history.ops)
                    for any_of in wanted):
                return
            await asyncio.sleep(0.05)

    async def stop(self) -> list[str]:
        """Tell every client to stop (planners are cancelled); the clients that crashed."""
        self.stopping.set()
        for task in self.waiting:
            task.cancel()
        ended = await asyncio.wait_for(
            asyncio.gather(*self.work, *self.waiting, return_exceptions=True), 10)
        return [repr(end) for end in ended if isinstance(end, BaseException)
                and not isinstance(end, asyncio.CancelledError)]

    async def fence_across(self, switched: float) -> list[Op]:
        """Across a move of the run's slot (seen switched at ``switched``): for each claim
        key granted both before and after it, a fence check, on the owner now, of the
        token of its last grant acknowledged before (the old owner's, older than the
        new owner's grant: refused, ``check_stale_tokens_refused``); the checks' ops. If
        no key was granted on both sides (the holders' time after the move is short), the
        checker grants the last key granted before once more itself, waiting out a
        moved lease, and checks that key's old token while it holds the new grant."""
        grants = [op for op in self.history.ops if op.f == "acquire" and op.ok]
        old: dict[str, Op] = {}
        for op in grants:
            if op.completed is not None and op.completed < switched:
                old[op.value["key"]] = op  # (in invocation order: the last wins)
        again = {op.value["key"] for op in grants if op.invoked > switched} & set(old)
        fencer, rs = self.client("fencer")
        run = rs.scope(self.run_id)

        def stale(key: str) -> dict[str, Any]:
            return {"key": key, "token": old[key].reply["token"],
                    "generation": old[key].reply["generation"]}

        for key in sorted(again):
            with contextlib.suppress(RunstateError):
                await _fence(fencer, rs, run, stale(key))
        if not again and old:
            key = max(old, key=lambda key: old[key].completed or 0.0)
            claim = run.claim(key, lease_seconds=CLAIM_LEASE)
            lease = await fencer.call(
                "acquire", {"key": key},
                functools.partial(claim.acquire, wait=True, timeout_ms=3000 * CLAIM_LEASE),
                reply=lambda lease: {"token": lease.token(), "generation": lease.generation})
            fencer.hold(lease)
            mine = {"key": key, "token": lease.token(), "generation": lease.generation}
            with contextlib.suppress(RunstateError):
                await _fence(fencer, rs, run, stale(key))
            with contextlib.suppress(RunstateError, Unanswered):
                await fencer.call("release", mine, functools.partial(release, lease),
                                  reply=lambda _: {})
        return [op for op in self.history.ops
                if op.process == fencer.name and op.f == "fence"]

    async def final_reads(self) -> None:
        """After every fault: every acknowledged change read on the final primary."""
        self.history.begin_final()
        final, rs = self.client("final")
        await _final_reads(final, rs.scope(self.run_id), self.history)

    async def close(self) -> None:
        """End every client, whatever happened."""
        self.stopping.set()
        for task in self.work + self.waiting:
            task.cancel()
        for rs in self.clients:
            with contextlib.suppress(Exception):
                await rs.close()


def done(history: History, since: float, *fs: str, until: float | None = None) -> dict[str, int]:
    """How many ops of each function ``fs`` invoked after ``since`` (and before
    ``until``, default the final reads) were acknowledged."""
    end = until if until is not None else (history.final_at or float("inf"))
    return {f: sum(1 for op in history.ops if op.f == f and op.ok and since < op.invoked < end)
            for f in fs}


def unavailability(history: History, start: float, end: float) -> tuple[float, float]:
    """The longest stretch without an acknowledged change (``WRITES``' completions, the
    final reads apart) that overlaps a fault from ``start`` to ``end``: when it began
    (the last change acknowledged before it, or ``start`` if none came before) and when
    it ended (inf if no change was acknowledged after it)."""
    final = history.final_at if history.final_at is not None else float("inf")
    acked = sorted(op.completed for op in history.ops if op.f in WRITES and op.ok
                   and op.completed is not None and op.invoked < final)
    edges = [max((when for when in acked if when <= start), default=start)]
    edges += [when for when in acked if when > start]
    longest = (edges[0], edges[0])
    for began, ended in zip(edges, [*edges[1:], float("inf")], strict=True):
        if began > end:
            break
        if ended - began > longest[1] - longest[0]:
            longest = (began, ended)
    return longest
