"""A research plan: a planning task fans out searches as its children, and a summary
task runs after all of them, with their findings at hand.

The planner submits one "plan" task. Its handler submits a child per topic
(``delivery.submit_child``), then the summary with ``after=`` those children: the
summary is BLOCKED until every search has succeeded, then delivered with
``delivery.parents`` (each search's id -> its outcome). A search that failed would
cancel the summary, naming it (``on_parent_failure="run"`` would run it anyway). A
plan cancelled midway cancels its searches that have not ended.

    RUNSTATE_ADDRESS=127.0.0.1:7420 python examples/research_plan.py
"""

import asyncio
from typing import Any

from rsclient import AsyncRunstate, Delivery

TOPICS = ["pricing", "competitors", "hiring"]


async def work(data: dict[str, Any], delivery: Delivery) -> None:
    """One worker for every step of the plan."""
    if data["step"] == "plan":
        searches = [
            await delivery.submit_child("research", {"step": "search", "topic": topic})
            for topic in data["topics"]
        ]
        await delivery.submit_child("research", {"step": "summary"}, after=searches)
        await delivery.complete(result={"payload": {"searches": len(searches)}})
    elif data["step"] == "search":
        await asyncio.sleep(0.01)  # (a web search and a model call, in a real agent)
        await delivery.complete(result={"payload": f"notes on {data['topic']}"})
    else:  # the summary: every search's outcome is in delivery.parents
        notes = sorted(parent["outcome"] for parent in delivery.parents.values())
        await delivery.complete(result={"payload": " + ".join(notes)})


async def main() -> None:
    async with AsyncRunstate(holder="planner") as rs, AsyncRunstate(holder="worker") as w:
        await rs.mailboxes.ensure("research")
        run = await rs.scopes.create()
        stop = asyncio.Event()
        worker = asyncio.create_task(
            w.scope(run.id).mailbox("research").consume(work, concurrency=4, stop_event=stop)
        )
        box = run.mailbox("research")
        plan = await box.submit({"step": "plan", "topics": TOPICS})
        print("plan:", (await plan.result(timeout_ms=30_000))["outcome"])
        children = await plan.children()
        print("children of the plan:", len(children))
        summary = run.task(children[-1]["id"])
        print("summary:", (await summary.result(timeout_ms=30_000))["outcome"])

        # A plan cancelled while its searches wait: they end with it, naming it.
        stop.set()
        await worker
        other = await box.submit({"step": "plan", "topics": ["later"]})
        search = await box.submit({"step": "search", "topic": "later"}, parent=other)
        await other.cancel("changed our mind")
        print("a cancelled plan's search:", (await search.status())["reason"] == (
            f"parent {other.id} ended CANCELLED"))


if __name__ == "__main__":
    asyncio.run(main())
