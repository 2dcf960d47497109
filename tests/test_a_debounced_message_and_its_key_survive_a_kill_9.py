"""Over the wire: a debounced message waiting out its window, and the key it holds,
outlive a kill -9 of rsd (ITEM_ENQUEUED, DEBOUNCE_KEYED and ITEM_DEBOUNCED are journaled
before the send is answered): after the restart a send with the key still replaces that
message, and it is delivered once, with the newest data. The core rules (replay equal to
live) are tests/test_core_debounced_sends_fold_into_one_waiting_message.py's; this one's
reason to exist is the journal and recovery of a real process.
"""

from __future__ import annotations

from collections.abc import Callable

from support.process import Rsd

from rsclient import AsyncRunstate
from tests.support import aio


async def test_a_debounced_message_and_its_key_survive_a_kill_9(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds("debounced")
    address = await server.start()
    rs = AsyncRunstate(holder="planner", address=address)
    try:
        await rs.mailboxes.ensure("jobs")
        box = (await rs.scopes.create(id="r")).mailbox("jobs")
        first = await box.send({"v": 1}, debounce_key="doc:7", debounce_seconds=600)
        replaced = await box.send({"v": 2}, debounce_key="doc:7", debounce_seconds=600)
        assert replaced["replaced"] is True
        other = await box.send({"w": 1}, debounce_key="doc:8", debounce_seconds=600)
    finally:
        await aio.close_quietly(rs)
    await server.kill()
    address = await server.start()
    async with AsyncRunstate(holder="worker", address=address) as rs:
        box = rs.scope("r").mailbox("jobs")
        assert (await box.inspect())["delayed"] == 2
        assert await box.receive() is None
        last = await box.send({"v": 3}, debounce_key="doc:7", debounce_seconds=0.05)
        assert last == {"id": first["id"], "replay": False, "replaced": True}
        delivery = await box.receive(wait=True, timeout_ms=30_000)
        assert delivery is not None and delivery.id == first["id"]
        assert delivery.data == {"v": 3}
        await delivery.complete()
        again = await box.send({"w": 2}, debounce_key="doc:8", debounce_seconds=600)
        assert again["id"] == other["id"] and again["replaced"] is True
    assert await server.stop() == 0
