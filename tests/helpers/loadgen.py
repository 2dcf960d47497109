"""Load for crash tests: claims, submits, receives and completions, with a ledger of
every change rsd acknowledged (its reply came back).

Used in-process by tests/test_durability.py (``run_load``), or on its own:

    python loadgen.py ADDRESS SCOPE [--seconds 1] [--tag NAME]

which prints one flushed line per acknowledged change and exits 0 when the time is up or
the server went away:

    GRANT <key> <token> <generation>       a claim acquire succeeded
    SUBMIT <task_id>                        a submit created a task (PENDING)
    DELIVERED <task_id> <attempt> <token>   a receive handed us a delivery (RUNNING)
    COMPLETED <task_id> <json outcome>      a completion was acknowledged (SUCCEEDED)

A change whose reply never came (the server died first) is not in the ledger: it may or
may not have happened. Everything in the ledger must survive a crash under
``--fsync always``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rsclient import AsyncRunstate, ConflictError, RunstateError

__all__ = ["MAILBOX", "Ledger", "TaskAck", "run_load"]

MAILBOX = "crash-jobs"
LEASE_SECONDS = 5  # the shortest lease rsd grants


@dataclass
class TaskAck:
    """The most advanced state of one task that a client was told about."""

    attempt: int = 0  # deliveries acknowledged so far (0: only the submit)
    succeeded: bool = False
    outcome: Any = None


@dataclass
class Ledger:
    tasks: dict[str, TaskAck] = field(default_factory=dict)
    task_ids: list[str] = field(default_factory=list)  # every created task, in ack order
    tokens: list[int] = field(default_factory=list)  # every fencing token, in ack order
    grants: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # key -> (tok, gen)
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


async def _claimer(rs: AsyncRunstate, scope: str, keys: list[str], ledger: Ledger,
                   pace: float, emit: Callable[[str], None]) -> None:
    run = rs.scope(scope)
    while True:
        key = random.choice(keys)
        try:
            lease = await run.claim(key, lease_seconds=LEASE_SECONDS).acquire()
        except ConflictError:
            await asyncio.sleep(pace)
            continue
        token = int(lease.token()[:16], 16)  # the lease id: the handle's first half
        ledger.tokens.append(token)
        ledger.grants.setdefault(key, []).append((token, lease.generation))
        ledger.count("grants")
        emit(f"GRANT {key} {token} {lease.generation}")
        await asyncio.sleep(pace * random.random())
        await lease.release()
        ledger.count("releases")


async def _submitter(rs: AsyncRunstate, scope: str, tag: str, ledger: Ledger, pace: float,
                     emit: Callable[[str], None]) -> None:
    box = rs.scope(scope).mailbox(MAILBOX)
    n = 0
    while True:
        n += 1
        key = f"{tag}-{n}"
        ticket = await box.submit({"tag": tag, "n": n}, key=key)
        if not ticket.created:
            raise AssertionError(f"submit of new key {key} joined task {ticket.id}")
        ledger.tasks[ticket.id] = TaskAck()
        ledger.task_ids.append(ticket.id)
        ledger.count("submits")
        emit(f"SUBMIT {ticket.id}")
        await asyncio.sleep(pace)


async def _worker(rs: AsyncRunstate, scope: str, tag: str, ledger: Ledger, pace: float,
                  emit: Callable[[str], None]) -> None:
    box = rs.scope(scope).mailbox(MAILBOX)
    while True:
        delivery = await box.receive(lease_seconds=LEASE_SECONDS)
        if delivery is None:
            await asyncio.sleep(pace)
            continue
        token = int(delivery.token()[:16], 16)
        ledger.tokens.append(token)
        task_id = delivery.task_id
        assert task_id is not None
        ack = ledger.tasks.setdefault(task_id, TaskAck())
        ack.attempt = max(ack.attempt, delivery.attempt)
        ledger.count("deliveries")
        emit(f"DELIVERED {task_id} {delivery.attempt} {token}")
        await asyncio.sleep(pace * random.random())
        outcome = {"by": tag, "token": token}
        await delivery.complete(result={"payload": outcome})
        ack.succeeded = True
        ack.outcome = outcome
        ledger.count("completions")
        emit(f"COMPLETED {task_id} {json.dumps(outcome)}")


async def run_load(
    rs: AsyncRunstate,
    scope: str,
    tag: str,
    ledger: Ledger,
    *,
    keys: list[str],
    claimers: int = 3,
    submitters: int = 2,
    workers: int = 2,
    pace: float = 0.004,
    emit: Callable[[str], None] = lambda line: None,
) -> BaseException | None:
    """Run the load until one of its coroutines fails (the server died, typically).

    Returns that failure (an UnavailableError when the connection dropped), after
    cancelling the others. Cancel the call to stop it earlier.
    """
    try:  # a failpoint may stop the server at this very write
        await rs.mailboxes.ensure(MAILBOX, max_attempts=100, retry_backoff_ms=0)
    except RunstateError as exc:
        return exc
    jobs = [
        *(_claimer(rs, scope, keys, ledger, pace, emit) for _ in range(claimers)),
        *(_submitter(rs, scope, f"{tag}.{i}", ledger, pace, emit) for i in range(submitters)),
        *(_worker(rs, scope, f"{tag}.{i}", ledger, pace, emit) for i in range(workers)),
    ]
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if not isinstance(exc, RunstateError):
                raise exc  # a broken expectation, not the server going away
            return exc
    return None


async def _main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("scope")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--tag", default="loadgen")
    args = parser.parse_args()
    ledger = Ledger()
    rs = AsyncRunstate(holder=args.tag, address=args.address, connect_timeout=1.0)
    try:
        await rs.scopes.create(id=args.scope)  # runs must exist (idempotent)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                run_load(rs, args.scope, args.tag, ledger, keys=[f"k{i}" for i in range(8)],
                         emit=lambda line: print(line, flush=True)),
                args.seconds,
            )
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(rs.close(), 2)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main()))
