"""Over the wire, the old shard of a moved run answers its leases MOVED (protocol.md,
"Slots and shards", "Leases follow their run"): a renewal item gets the outcome "MOVED",
a release or settlement naming a moved handle is refused MOVED with the details of the
run's slot as the shard's map gives them (the slot, its owner, the owner's primary, the
map's epoch: the core knows only the run, batches.py adds where its slot is), and was
not executed; on the new shard the same handles renew and settle; a handle that shard
never had is STALE_CLAIM there (not MOVED). The core's rules of the table (its length,
its replay) are tests/test_core_a_moved_lease_is_answered_moved_by_its_old_shard_for_its_length.py;
this one checks what only the shell adds: the details, and a real move's drop.

Two servers in one loop (shard "a" the source, "b" the target), the map switch a fake
that both adopt (no etcd): the wire between them is the real one."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rsd.core import Core
from rsd.server import Server
from rsd.slotowner import SlotOwner
from rsproto import Op
from rsproto.slots import SlotMap, slot_of
from tests.support.raw import RawConn, raw_connect

SLOTS = 64
LO, HI = 8, 15


def run_in(lo: int, hi: int) -> str:
    return next(key for key in (f"run-{n}" for n in itertools.count())
                if lo <= slot_of(key, SLOTS) <= hi)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Server, Server, str, str]]:
    """Source "a" (every slot, map epoch 7) and target "b" (none), both told of the
    switch (the fake of etcd's compare-and-swap)."""
    loop = asyncio.get_running_loop()
    servers: list[Server] = []
    try:
        target = Server(Core(lambda: "unused"), loop, cluster="c",
                        slots=SlotOwner(SlotMap(SLOTS, 7, ((0, SLOTS - 1, "a"),), {}), "b"))
        servers.append(target)
        target.core.serve_shard("b", SLOTS)
        host, port = await target.start("127.0.0.1", 0)
        b_address = f"{host}:{port}"
        owner = SlotOwner(SlotMap(SLOTS, 7, ((0, SLOTS - 1, "a"),),
                                  {"a": "127.0.0.1:1", "b": b_address}), "a")
        source = Server(Core(lambda: "unused"), loop, cluster="c", slots=owner)
        servers.append(source)
        source.core.serve_shard("a", SLOTS)

        async def switch(lo: int, hi: int, to: str, epoch: int) -> SlotMap:
            new_map = owner.map.moved(lo, hi, to)
            target.slots.adopt(new_map)
            return new_map

        owner.switch = switch
        host, port = await source.start("127.0.0.1", 0)
        yield source, target, f"{host}:{port}", b_address
    finally:
        for server in servers:
            await server.stop()


async def connected(address: str) -> RawConn:
    conn = await raw_connect(address)
    await conn.hello("worker")
    return conn


async def test_the_old_shard_answers_moved_leases_moved_and_the_new_one_serves_them(
    pair: tuple[Server, Server, str, str],
) -> None:
    _, _, a_address, b_address = pair
    a, b = await connected(a_address), await connected(b_address)
    run, stays = run_in(LO, HI), run_in(HI + 1, SLOTS - 1)
    await a.ok(Op.MAILBOX_ENSURE, {"name": "work", "mode": "WORK"})
    await b.ok(Op.MAILBOX_ENSURE, {"name": "work", "mode": "WORK"})
    await a.ok(Op.SCOPE_CREATE, {"scope": run})
    await a.ok(Op.SCOPE_CREATE, {"scope": stays})
    kept = (await a.ok(Op.CLAIM_ACQUIRE, {"scope": stays, "key": "k"}))["lease"]
    claim = (await a.ok(Op.CLAIM_ACQUIRE, {"scope": run, "key": "k",
                                           "lease_seconds": 30}))["lease"]
    await a.ok(Op.TASK_SUBMIT, {"scope": run, "mailbox": "work", "data": {"n": 1}})
    delivery = (await a.ok(Op.RECEIVE, {"scope": run, "mailbox": "work",
                                        "lease_seconds": 30}))["delivery"]
    moved = await a.ok(Op.SLOTS_MOVE, {"lo": LO, "hi": HI, "to": "b"})
    assert moved["map_epoch"] == 8
    assert (await a.ok(Op.LEASE_RENEW, {"leases": [claim]}))["results"] == ["MOVED"]
    assert (await a.ok(Op.LEASE_RENEW, {"leases": [claim, delivery["lease"]]}))[
        "results"] == ["MOVED", "MOVED"]
    where: dict[str, Any] = {"slot": slot_of(run, SLOTS), "shard": "b",
                             "primary": b_address, "map_epoch": 8}
    for op, args in [(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": "a"}),
                     (Op.CLAIM_RELEASE, {"lease": claim})]:
        code, message, details = await a.error(op, args)
        assert (code, details) == ("MOVED", where), message
    # Not executed on the source; on the target both go on under the same handles.
    assert (await b.ok(Op.LEASE_RENEW, {"leases": [claim, delivery["lease"]]}))[
        "results"] == [None, None]
    await b.ok(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": "b"})
    done = await b.ok(Op.TASK_RESULT, {"scope": run, "task": delivery["id"]})
    assert done["outcome"] == "b"
    await b.ok(Op.CLAIM_RELEASE, {"lease": claim})
    # Stale on the target once released there, and a lease it never had (of a run that
    # stayed on the source, where it still renews): STALE_CLAIM, not MOVED.
    assert (await b.ok(Op.LEASE_RENEW, {"leases": [claim, kept]}))["results"] == [
        "STALE_CLAIM", "STALE_CLAIM"]
    code, _, _ = await b.error(Op.CLAIM_RELEASE, {"lease": kept})
    assert code == "STALE_CLAIM"
    assert (await a.ok(Op.LEASE_RENEW, {"leases": [kept]}))["results"] == [None]
