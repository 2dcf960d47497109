"""A move whose switch of the map surely changed nothing (``SwitchRefused``: the map moved
on, or etcd refused the read before the compare-and-swap, as when etcd's leader is
killed mid-move) rolls back at once: the target drops what it took, the source answers
UNAVAILABLE and serves the held requests (slotmoves.py). Only a switch whose outcome is
unknown waits for the watched map, up to a cluster lease. Before, every failed switch
waited the cluster lease with the slots' requests held: 6-6.6 s without an acknowledged
change on the moving run when the slot-move fault test killed etcd's leader (5 s lease).

Two servers in one loop (shard "a" the source, "b" the target), the map switch a fake
that refuses; the source's cluster lease 60 s, so a wait for the watch would outlast the
answer's timeout here."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rsd.core import Core
from rsd.security.auth import Authenticator
from rsd.security.tokens import hash_token, new_token
from rsd.server import Server
from rsd.slotowner import SlotOwner, SwitchRefused
from rsproto import Kind, Op
from rsproto.slots import SlotMap, slot_of
from tests.support.raw import raw_connect

SLOTS = 64
LO, HI = 8, 15


async def refused(lo: int, hi: int, to: str, epoch: int) -> SlotMap:
    raise SwitchRefused("etcd refused a read of the slot map: etcdserver: leader changed")


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Server, Server, str, str]]:
    """Source "a" (every slot) and target "b" (none), both at map epoch 7; the source's
    address and the admin token."""
    token = new_token()
    path = tmp_path / "tokens"
    path.write_text(f"{hash_token(token)} t admin\n")
    loop = asyncio.get_running_loop()
    servers: list[Server] = []
    try:
        target = Server(Core(lambda: "unused"), loop, cluster="c",
                        slots=SlotOwner(SlotMap(SLOTS, 7, ((0, SLOTS - 1, "a"),), {}), "b"),
                        auth=Authenticator(str(path)))
        servers.append(target)
        target.core.serve_shard("b", SLOTS)
        host, port = await target.start("127.0.0.1", 0)
        owner = SlotOwner(SlotMap(SLOTS, 7, ((0, SLOTS - 1, "a"),),
                                  {"a": "127.0.0.1:1", "b": f"{host}:{port}"}), "a")
        owner.switch = refused
        source = Server(Core(lambda: "unused"), loop, cluster="c", slots=owner,
                        auth=Authenticator(str(path)))
        source.cluster_lease_seconds = 60
        servers.append(source)
        source.core.serve_shard("a", SLOTS)
        source.moves.token = token
        host, port = await source.start("127.0.0.1", 0)
        yield source, target, f"{host}:{port}", token
    finally:
        for server in servers:
            await server.stop()


async def test_a_move_whose_switch_was_refused_is_answered_and_rolled_back_at_once(
    pair: tuple[Server, Server, str, str],
) -> None:
    source, target, address, token = pair
    admin = await raw_connect(address)
    await admin.hello("t", token=token)
    run = next(key for key in (f"run-{n}" for n in itertools.count())
               if LO <= slot_of(key, SLOTS) <= HI)
    await admin.ok(Op.SCOPE_CREATE, {"scope": run})
    await admin.ok(Op.MAILBOX_ENSURE, {"name": "work", "mode": "WORK"})
    await admin.ok(Op.TASK_SUBMIT, {"scope": run, "mailbox": "work", "data": {"n": 1}})
    answer = await admin.call(Op.SLOTS_MOVE, {"lo": LO, "hi": HI, "to": "b"}, timeout=20)
    assert answer[0] == Kind.ERROR and answer[2] == "UNAVAILABLE", answer
    assert "leader changed" in answer[3] and f"slots {LO}-{HI} stay" in answer[3]
    assert source.slots.owns_all and source.slots.moving is None
    assert target.core.runs_in_slots(0, SLOTS - 1) == 0  # told to drop what it took
    task = await admin.ok(Op.TASK_SUBMIT, {"scope": run, "mailbox": "work", "data": 2})
    assert task["state"] == "PENDING"
