"""The Python side of the TypeScript SDK's cross-language tests (run by test/xlang.test.ts).

Each subcommand talks to rsd through the Python SDK and prints one JSON line (after any
progress lines the TypeScript test waits for), so the two SDKs are checked against each
other on one server:

    xlang.py planners ADDRESS SCOPE MAILBOX KEY N   N planners submit one key, await it
    xlang.py waiter ADDRESS SCOPE KEY               wait for a claim (lease 5 s)
    xlang.py worker ADDRESS SCOPE MAILBOX           receive one delivery and complete it
    xlang.py submit ADDRESS SCOPE MAILBOX KEY JSON  submit; the task or the error code
    xlang.py send ADDRESS SCOPE MAILBOX WORK_KEY JSON
    xlang.py group ADDRESS SCOPE MAILBOX GROUP N NEED  submit N tasks into GROUP, wait for NEED
    xlang.py consumer ADDRESS SCOPE MAILBOX         consume until the run is cancelled
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from rsclient import AsyncRunstate, RunstateError


def emit(value: Any) -> None:
    print(json.dumps(value), flush=True)


async def planners(address: str, scope: str, mailbox: str, key: str, n: str) -> None:
    async def one(i: int) -> dict[str, Any]:
        async with AsyncRunstate(holder=f"py-planner-{i}", address=address) as rs:
            ticket = await rs.scope(scope).mailbox(mailbox).submit(
                {"company": "acme"}, key=key, subscriber_id=f"py-planner-{i}"
            )
            return await ticket.result(timeout_ms=20_000)

    views = await asyncio.gather(*(one(i) for i in range(int(n))))
    emit([{k: v[k] for k in ("id", "state", "outcome", "attempt", "subscribers")} for v in views])


async def waiter(address: str, scope: str, key: str) -> None:
    async with AsyncRunstate(holder="py-waiter", address=address) as rs:
        claim = rs.scope(scope).claim(key, lease_seconds=5)
        print("WAITING", flush=True)
        lease = await claim.acquire(wait=True, timeout_ms=20_000)
        emit({"generation": lease.generation, "granted_at": time.time()})
        await lease.release()


async def worker(address: str, scope: str, mailbox: str) -> None:
    async with AsyncRunstate(holder="py-worker", address=address) as rs:
        print("RECEIVING", flush=True)
        delivery = await rs.scope(scope).mailbox(mailbox).receive(wait=True, timeout_ms=20_000)
        assert delivery is not None, "no delivery within 20 s"
        await delivery.complete(result={"payload": {"by": "python"}})
        emit({"attempt": delivery.attempt, "id": delivery.id})


async def submit(address: str, scope: str, mailbox: str, key: str, data: str) -> None:
    async with AsyncRunstate(holder="py-submitter", address=address) as rs:
        try:
            ticket = await rs.scope(scope).mailbox(mailbox).submit(json.loads(data), key=key)
        except RunstateError as exc:
            emit({"error": exc.code, "details": exc.details})
            return
        emit({"id": ticket.id, "created": ticket.created})


async def send(address: str, scope: str, mailbox: str, work_key: str, data: str) -> None:
    async with AsyncRunstate(holder="py-sender", address=address) as rs:
        try:
            sent = await rs.scope(scope).mailbox(mailbox).send(json.loads(data), work_key=work_key)
        except RunstateError as exc:
            emit({"error": exc.code, "details": exc.details})
            return
        emit(sent)


async def group(address: str, scope: str, mailbox: str, name: str, n: str, need: str) -> None:
    async with AsyncRunstate(holder="py-group-planner", address=address) as rs:
        run = rs.scope(scope)
        for i in range(int(n)):
            await run.mailbox(mailbox).submit({"i": i}, key=f"part-{i}", group=name)
        print("SUBMITTED", flush=True)
        result = await run.group(name).wait(int(need), cancel_rest=True, timeout_ms=20_000)
        emit({k: result[k] for k in ("reached", "need", "done", "cancelled", "succeeded")})


async def consumer(address: str, scope: str, mailbox: str) -> None:
    async with AsyncRunstate(holder="py-consumer", address=address) as rs:
        handled: list[Any] = []

        async def handle(data: Any, delivery: Any) -> None:
            handled.append(data)
            print("HANDLING", flush=True)
            await asyncio.sleep(30)  # ended by the run's cancellation

        await asyncio.wait_for(rs.scope(scope).mailbox(mailbox).consume(handle), 20)
        emit({"handled": handled})


COMMANDS = {"planners": planners, "waiter": waiter, "worker": worker, "submit": submit,
            "send": send, "group": group, "consumer": consumer}

if __name__ == "__main__":
    asyncio.run(COMMANDS[sys.argv[1]](*sys.argv[2:]))
