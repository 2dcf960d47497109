"""Over the wire, through the Python SDK: tasks submitted ``after`` others stay BLOCKED,
and a parent's children stay its children, through a kill -9 of rsd (the links are
fields of the task's ITEM_ENQUEUED, journaled before the submit is answered): after
the restart the parent's completion lets the blocked task go with its parents'
outcomes, ``ticket.children()`` lists the children, and cancelling a parent cancels its
unfinished child. The core rules (replay and snapshot equal to live) are
tests/test_core_a_task_after_its_parents_starts_only_when_they_succeed.py's; this one's
reason to exist is the journal and recovery of a real process, and the SDK's API.
"""

from __future__ import annotations

from collections.abc import Callable

from support.process import Rsd

from rsclient import AsyncRunstate
from tests.support import aio


async def test_blocked_tasks_and_children_survive_a_kill_9(rsds: Callable[..., Rsd]) -> None:
    server = rsds("parents")
    address = await server.start()
    rs = AsyncRunstate(holder="planner", address=address)
    try:
        await rs.mailboxes.ensure("jobs")
        box = (await rs.scopes.create(id="r")).mailbox("jobs")
        plan = await box.submit({"step": "plan"}, key="plan")
        delivery = await box.receive()
        assert delivery is not None and delivery.task_id == plan.id
        child = await delivery.submit_child("jobs", {"step": "search"}, key="search")
        other = await delivery.submit_child("jobs", {"step": "spare"})
        summary = await box.submit({"step": "sum"}, after=[plan, child.id])
        assert summary.view["state"] == "BLOCKED"
        await delivery.complete({"payload": {"plan": 1}})
    finally:
        await aio.close_quietly(rs)
    await server.kill()
    address = await server.start()
    async with AsyncRunstate(holder="worker", address=address) as rs:
        run = rs.scope("r")
        box = run.mailbox("jobs")
        assert (await run.task(summary.id).status())["state"] == "BLOCKED"
        children = await run.task(plan.id).children()
        assert [c["id"] for c in children] == [child.id, other.id]
        assert (await box.inspect())["blocked_by_parents"] == 1
        search = await box.receive()
        assert search is not None and search.id == child.id and search.parents == {}
        await search.complete({"payload": "found"})
        await run.task(other.id).cancel()
        last = await box.receive(wait=True, timeout_ms=30_000)
        assert last is not None and last.id == summary.id
        assert {k: v["outcome"] for k, v in last.parents.items()} == {
            plan.id: {"plan": 1}, child.id: "found"}
        await last.complete()
        # a cancelled parent's unfinished child is cancelled with it
        parent = await box.submit("parent")
        taken = await box.receive()
        assert taken is not None and taken.id == parent.id
        kid = await taken.submit_child("jobs", "kid")
        await parent.cancel()
        view = await kid.status()
        assert view["state"] == "CANCELLED"
        assert view["reason"] == f"parent {parent.id} ended CANCELLED"
    assert await server.stop() == 0
