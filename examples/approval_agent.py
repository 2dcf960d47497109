"""An agent that drafts, streams its progress, and waits for a person's approval
without holding a worker; a planner follows it and approves.

The writer's handler drafts an email in steps, publishing each with
``delivery.progress``, then suspends for the signal "approval": the task is WAITING, its
lease ends and the worker is free. The planner follows ``ticket.events()`` (progress and
state changes, the outcome last); when the task waits, it approves from a ticket rebuilt
by id, as a web app behind a person's button would. The next delivery carries the
signal, and the writer sends the draft (or not) and completes.

    RUNSTATE_ADDRESS=127.0.0.1:7420 python examples/approval_agent.py
"""

import asyncio
from typing import Any

from rsclient import AsyncRunstate, Delivery


async def draft(to: str, delivery: Delivery) -> str:
    """A long agent step, made of smaller ones the caller may watch."""
    lines = []
    for step in ("greeting", "offer", "signature"):
        await asyncio.sleep(0.02)  # (a model call, in a real agent)
        lines.append(f"{step} for {to}")
        await delivery.progress({"step": step, "done": len(lines), "of": 3})
    return " / ".join(lines)


async def write(data: dict[str, Any], delivery: Delivery) -> None:
    """The writer's handler: drafts, then waits for the approval; sends once approved."""
    if delivery.signal is None:  # first time: draft, then wait holding no worker
        text = await draft(data["to"], delivery)
        await delivery.progress({"draft": text, "waiting_for": "approval"})
        await delivery.suspend("approval", timeout_seconds=86_400)
        return
    verdict = delivery.signal["data"]  # the signal that woke it: {"name", "data"}
    if not verdict["ok"]:
        await delivery.complete(result={"payload": {"sent": False, "by": verdict["by"]}})
        return
    await delivery.progress({"step": "sending"})
    await delivery.complete(result={"payload": {"sent": True, "by": verdict["by"]}})


async def approve(run_id: str, task_id: str) -> None:
    """A person's button, in another process: nothing but the ids at hand."""
    async with AsyncRunstate(holder="web-app") as web:
        answer = await web.scope(run_id).task(task_id).signal(
            "approval", {"ok": True, "by": "dana"}
        )
        print("approval sent, woken:", answer["woken"])


async def main() -> None:
    async with AsyncRunstate(holder="planner") as rs, AsyncRunstate(holder="writer") as w:
        await rs.mailboxes.ensure("outreach")
        run = await rs.scopes.create()
        stop = asyncio.Event()
        worker = asyncio.create_task(
            w.scope(run.id).mailbox("outreach").consume(write, stop_event=stop)
        )
        ticket = await run.mailbox("outreach").submit({"to": "acme"})
        async for event in ticket.events():  # pushed as they happen, the outcome last
            if event.kind == "progress":
                print("progress:", event.data)
            elif event.kind == "state":
                print(f"state: {event.state} (attempt {event.attempt})")
                if event.state == "WAITING":  # the worker is free; a person decides
                    await approve(run.id, ticket.id)
            else:
                print("outcome:", event.state, event.outcome)
        stop.set()
        await worker


if __name__ == "__main__":
    asyncio.run(main())
