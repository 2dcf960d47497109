"""Over the wire, with the Python SDK: ``await delivery.suspend(name, timeout_seconds=)``
frees the worker (WAITING), ``await ticket.signal(name, data)`` (also from a ticket
rebuilt by task id) makes the task ready again with ``delivery.signal`` set; a signal
sent before the suspend wakes it at once; a timeout brings it back with ``signal``
None; a handler of ``consume()`` that suspends is not completed by the loop; refusals
are typed errors; and a waiting task and a kept signal outlive a kill -9.
The core rules are tests/test_core_a_waiting_task_holds_no_worker_and_wakes_on_its_signal.py's;
this one's reason to exist is the SDK's calls, the worker loop and the journal of a real
process (one rsd for the whole file: the suite is CPU-bound).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support.process import Rsd

from rsclient import AsyncRunstate, InvalidArgumentError, RunstateError
from rsclient.deliveries import Delivery
from tests.support import aio


async def _until(check: Callable[[], Any]) -> None:
    """Until ``check()`` (a coroutine function) is true: a condition, not a time."""
    while not await check():
        await asyncio.sleep(0.01)


async def test_suspend_signal_and_timeout_over_the_wire_survive_a_kill_9(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds("waiting")
    address = await server.start()
    rs = AsyncRunstate(holder="agent", address=address)
    try:
        await rs.mailboxes.ensure("approvals")
        run = await rs.scopes.create(id="r")
        box = run.mailbox("approvals")
        # Suspend: the worker is free, the task WAITING; a ticket rebuilt by id signals it.
        ticket = await box.submit({"draft": 1})
        first = await box.receive()
        assert first is not None and first.signal is None
        await first.suspend("approval", timeout_seconds=86_400)
        assert first.settled and first.state == "WAITING"
        assert (await box.inspect())["waiting"] == 1
        view = await ticket.status()
        assert view["state"] == "WAITING"
        assert view["signals"]["waiting_for"] == "approval"
        assert await box.receive() is None
        rebuilt = rs.scope("r").task(ticket.id)
        assert await rebuilt.signal("approval", {"ok": True}) == {
            "id": ticket.id, "state": "PENDING", "woken": True}
        again = await box.receive()
        assert again is not None and again.signal == {"name": "approval", "data": {"ok": True}}
        assert again.attempt == first.attempt  # no attempt spent
        await again.complete({"payload": "sent"})
        assert (await ticket.result(timeout_ms=10_000))["outcome"] == "sent"
        with pytest.raises(InvalidArgumentError, match="has ended"):
            await ticket.signal("approval")

        # A signal sent before the suspend is kept and wakes it at once.
        early = await box.submit({"draft": 2})
        assert (await early.signal("approval", "yes"))["woken"] is False
        got = await box.receive()
        assert got is not None
        await got.suspend("approval")
        assert got.state == "PENDING"
        got = await box.receive()
        assert got is not None and got.signal == {"name": "approval", "data": "yes"}
        # Refusals: another name than the one it waits for, oversized data, a bad timeout
        # (then the delivery is still the worker's).
        with pytest.raises(InvalidArgumentError, match="timeout_seconds"):
            await got.suspend("approval", timeout_seconds=-1)
        assert not got.settled
        await got.suspend("approval", timeout_seconds=0.2)
        with pytest.raises(InvalidArgumentError, match="waits for the signal 'approval'"):
            await early.signal("payment")
        with pytest.raises(InvalidArgumentError, match="max_signal_data_bytes"):
            await early.signal("approval", "x" * 70_000)
        # Its timeout passes first: delivered again with no signal.
        timed_out = await box.receive(wait=True, timeout_ms=30_000)
        assert timed_out is not None and timed_out.id == early.id
        assert timed_out.signal is None
        await timed_out.complete()

        # consume(): a handler that suspends is not completed by the loop; the signal's
        # delivery runs it again, and it completes it then.
        seen: list[Any] = []

        async def handler(data: Any, delivery: Delivery) -> None:
            seen.append(delivery.signal)
            if delivery.signal is None:
                await delivery.suspend("approval")
                return
            await delivery.complete({"payload": {"approved": delivery.signal["data"]}})

        stop = asyncio.Event()
        worker = asyncio.ensure_future(box.consume(handler, stop_event=stop))
        agent = await box.submit({"draft": 3})
        await asyncio.wait_for(_until(lambda: _state_is(agent, "WAITING")), 30)
        await agent.signal("approval", "alice")
        done = await agent.result(timeout_ms=30_000)
        assert done["outcome"] == {"approved": "alice"}
        assert seen == [None, {"name": "approval", "data": "alice"}]
        stop.set()
        await asyncio.wait_for(worker, 30)

        # Left for the kill -9: a waiting task, and a kept signal for a task not yet run.
        waiting = await box.submit({"draft": 4})
        delivery = await box.receive()
        assert delivery is not None and delivery.id == waiting.id
        await delivery.suspend("approval", timeout_seconds=3_600)
        kept = await box.submit({"draft": 5})
        await kept.signal("payment", {"paid": 10})
    finally:
        await aio.close_quietly(rs)
    await server.kill()
    address = await server.start()
    async with AsyncRunstate(holder="agent", address=address) as rs:
        run = rs.scope("r")
        box = run.mailbox("approvals")
        assert (await run.task(waiting.id).status())["state"] == "WAITING"
        assert (await box.inspect())["waiting"] == 1
        got = await box.receive()  # the kept one's task: the only one ready
        assert got is not None and got.id == kept.id
        await got.suspend("payment")
        assert got.state == "PENDING"  # its kept signal survived: woken at once
        got = await box.receive()
        assert got is not None and got.signal == {"name": "payment", "data": {"paid": 10}}
        await got.complete()
        await run.task(waiting.id).signal("approval", "late")
        got = await box.receive()
        assert got is not None and got.signal == {"name": "approval", "data": "late"}
        await got.complete()
        crowded = await box.submit({"draft": 6})
        for n in range(16):
            await crowded.signal(f"s{n}")
        with pytest.raises(RunstateError, match="max_signals_kept") as refused:
            await crowded.signal("one too many")
        assert refused.value.code == "RESOURCE_EXHAUSTED"
    assert await server.stop() == 0


async def _state_is(ticket: Any, state: str) -> bool:
    return bool((await ticket.status())["state"] == state)
