"""A move of slots that hold runs whose import the target refuses rolls back: the source
answers the move with the target's reason, keeps its runs and serves them again (the
requests held meanwhile run there), the map does not switch, and the target keeps
nothing of what it took (slotmoves.py, slotimport.py). And the target's own rules of
SLOTS_IMPORT: an admin op, never for slots it owns.

Two servers in one loop (shard "a" the source, "b" the target), the map switch a fake
(no etcd): the wire between them is the real one."""

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
from rsd.slotowner import SlotOwner
from rsproto import Op
from rsproto.slots import SlotMap, slot_of
from tests.support.raw import RawConn, raw_connect

SLOTS = 64
LO, HI = 8, 15


def key_in(lo: int, hi: int, prefix: str) -> str:
    return next(key for key in (f"{prefix}-{n}" for n in itertools.count())
                if lo <= slot_of(key, SLOTS) <= hi)


async def never_switched(lo: int, hi: int, to: str, epoch: int) -> SlotMap:
    raise AssertionError("a refused import must not switch the map")


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Server, Server, dict[str, str]]]:
    """Source "a" (every slot, map epoch 7) and target "b" (none, its map at ``b_epoch``)."""
    tokens = {"admin": new_token(), "client": new_token()}
    path = tmp_path / "tokens"
    path.write_text("".join(f"{hash_token(t)} t {role}\n" for role, t in tokens.items()))
    loop = asyncio.get_running_loop()
    servers: list[Server] = []
    try:
        target = Server(Core(lambda: "unused"), loop, cluster="c",
                        slots=SlotOwner(SlotMap(SLOTS, 9, ((0, SLOTS - 1, "a"),), {}), "b"),
                        auth=Authenticator(str(path)))
        servers.append(target)
        target.core.serve_shard("b", SLOTS)
        host, port = await target.start("127.0.0.1", 0)
        b_address = f"{host}:{port}"
        owner = SlotOwner(SlotMap(SLOTS, 7, ((0, SLOTS - 1, "a"),),
                                  {"a": "127.0.0.1:1", "b": b_address}), "a")
        owner.switch = never_switched
        source = Server(Core(lambda: "unused"), loop, cluster="c", slots=owner,
                        auth=Authenticator(str(path)))
        servers.append(source)
        source.core.serve_shard("a", SLOTS)
        source.moves.token = tokens["admin"]
        host, port = await source.start("127.0.0.1", 0)
        yield source, target, {"a": f"{host}:{port}", "b": b_address, **tokens}
    finally:
        for server in servers:
            await server.stop()


async def connected(address: str, token: str) -> RawConn:
    conn = await raw_connect(address)
    await conn.hello("t", token=token)
    return conn


async def test_a_refused_import_leaves_the_runs_on_the_source_and_nothing_on_the_target(
    pair: tuple[Server, Server, dict[str, str]],
) -> None:
    source, target, place = pair
    admin = await connected(place["a"], place["admin"])
    run = key_in(LO, HI, "run")
    await admin.ok(Op.SCOPE_CREATE, {"scope": run})
    await admin.ok(Op.MAILBOX_ENSURE, {"name": "work", "mode": "WORK"})
    await admin.ok(Op.TASK_SUBMIT, {"scope": run, "mailbox": "work", "data": {"n": 1}})
    # b's map is newer than a's (epoch 9 > 7): it refuses the import (UNAVAILABLE).
    code, message, _ = await admin.error(Op.SLOTS_MOVE, {"lo": LO, "hi": HI, "to": "b"})
    assert code == "UNAVAILABLE" and "did not take the runs" in message, message
    assert "older than this shard's" in message
    assert source.slots.owns_all and source.slots.map.epoch == 7
    assert (await admin.ok(Op.SCOPE_STATUS, {"scope": run}))["scope"] == run
    assert target.core.runs_in_slots(0, SLOTS - 1) == 0


async def test_slots_import_is_an_admin_op_and_never_for_the_targets_own_slots(
    pair: tuple[Server, Server, dict[str, str]],
) -> None:
    source, _, place = pair
    client = await connected(place["a"], place["client"])
    code, _, _ = await client.error(Op.SLOTS_IMPORT, {"lo": LO, "hi": HI, "abort": True})
    assert code == "PERMISSION_DENIED"
    admin = await connected(place["a"], place["admin"])
    code, message, _ = await admin.error(Op.SLOTS_IMPORT, {"lo": LO, "hi": HI,
                                                           "abort": True})
    assert code == "INVALID_ARGUMENT" and "this shard's ('a') already" in message
    assert source.slots.owns_all
