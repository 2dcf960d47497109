"""A shared task: several planners submit the same key and all read its one result;
a worker does the work once.

    RUNSTATE_ADDRESS=127.0.0.1:7420 python examples/shared_task.py
"""

import asyncio

from rsclient import AsyncRunstate, Delivery


async def research_company(name: str) -> dict[str, str]:
    await asyncio.sleep(0.05)
    return {"summary": f"{name} makes anvils"}


async def planner(rs: AsyncRunstate, run_id: str, name: str) -> None:
    ticket = await rs.scope(run_id).mailbox("research").submit(
        {"company": "acme"}, key="research:acme", subscriber_id=name
    )
    outcome = await ticket.result(timeout_ms=300_000)  # pushed, not polled
    if outcome["state"] == "SUCCEEDED":
        print(name, "got", outcome["outcome"], "from task", ticket.id)
    else:
        print(f"{name}: task ended {outcome['state']}: {outcome['reason']}")


async def main() -> None:
    async with AsyncRunstate(holder="planner") as rs, AsyncRunstate(holder="worker") as w:
        await rs.mailboxes.ensure("research", mode="WORK", max_attempts=5)
        run = await rs.scopes.create()
        done = 0

        async def handle(data: dict[str, str], delivery: Delivery) -> None:
            nonlocal done
            report = await research_company(data["company"])
            await delivery.complete(result={"payload": report})
            done += 1

        stop = asyncio.Event()
        worker = asyncio.create_task(w.scope(run.id).mailbox("research").consume(
            handle, concurrency=4, lease_seconds=60, stop_event=stop,
            on_error=lambda err, d: print(f"attempt {d.attempt} failed: {err}"),
        ))
        await asyncio.gather(*(planner(rs, run.id, f"planner-{i}") for i in range(3)))
        stop.set()
        await worker
        print("the work was done", done, "time(s)")


if __name__ == "__main__":
    asyncio.run(main())
