"""SLOTS_MOVE hands a range of this shard's slots to another shard, only when an admin
asks: the requests for those slots are held (not answered, not executed) while the map
is switched in etcd, then answered MOVED to the new owner; a failed switch lets them run
here and answers UNAVAILABLE. Runs that hold pool slots do not move (the core refuses
to export them, and says why), and a server alone has no other shard. A client flooding
a moving slot holds no more of the server than one read: its connection waits with its
first held request.

The switch is a fake ``switch`` callable (what the cluster side gives, doing the
compare-and-swap in etcd), so each step of a move is taken when the test says."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import rsproto as wire
from rsd.core import Core
from rsd.security.auth import Authenticator
from rsd.security.tokens import hash_token, new_token
from rsd.server import Server
from rsd.slotowner import SlotOwner
from rsproto import Kind, Op
from rsproto.slots import SlotMap, slot_of
from tests.support.raw import RawConn, raw_connect
from tests.support.shell import Shell, transport, turn

SLOTS = 64
# Shard "a" owns every slot; shard "b" has started (its primary is known) and owns none.
MAP = SlotMap(SLOTS, 7, ((0, SLOTS - 1, "a"),), {"a": "127.0.0.1:7001", "b": "127.0.0.1:7002"})
LO, HI = 8, 15  # the slots moved


def key_in(lo: int, hi: int, prefix: str = "run") -> str:
    return next(key for key in (f"{prefix}-{n}" for n in itertools.count())
                if lo <= slot_of(key, SLOTS) <= hi)


class FakeSwitch:
    """The cluster side's compare-and-swap: waits for ``go``, then gives the map moved
    (or raises ``failure``)."""

    def __init__(self, owner: SlotOwner) -> None:
        self.owner = owner
        self.go = asyncio.Event()
        self.calls: list[tuple[int, int, str, int]] = []
        self.failure: Exception | None = None
        self.answer: SlotMap | None = None  # what it gives instead of the map moved

    async def __call__(self, lo: int, hi: int, to: str, epoch: int) -> SlotMap:
        self.calls.append((lo, hi, to, epoch))
        await self.go.wait()
        if self.failure is not None:
            raise self.failure
        return self.answer or self.owner.map.moved(lo, hi, to)


def owner_of_a() -> SlotOwner:
    return SlotOwner(MAP, "a")


async def start(server: Server) -> str:
    host, port = await server.start("127.0.0.1", 0)
    return f"{host}:{port}"


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[Server, FakeSwitch, dict[str, str]]]:
    """Shard "a"'s primary with an admin and a client token, and a fake switch."""
    tokens = {"admin": new_token(), "client": new_token()}
    path = tmp_path / "tokens"
    path.write_text("".join(f"{hash_token(token)} t {role}\n" for role, token in tokens.items()))
    owner = owner_of_a()
    switch = FakeSwitch(owner)
    owner.switch = switch
    server = Server(Core(lambda: "unused"), asyncio.get_running_loop(), cluster="c",
                    slots=owner, auth=Authenticator(str(path)))
    address = await start(server)
    try:
        yield server, switch, {"address": address, **tokens}
    finally:
        switch.go.set()
        await server.stop()


async def connected(place: dict[str, str], role: str) -> RawConn:
    conn = await raw_connect(place["address"])
    await conn.hello(role, token=place[role])
    return conn


async def nothing_answered(conn: RawConn) -> bool:
    """Whether ``conn`` has nothing to read after the server has run a few loop turns
    (same loop: the server's turns are this test's)."""
    for _ in range(20):
        await asyncio.sleep(0)
    try:
        await asyncio.wait_for(conn.reader.read(1), 0.05)
    except TimeoutError:
        return True
    return False


async def test_held_requests_are_answered_moved_once_the_map_is_switched(
    node: tuple[Server, FakeSwitch, dict[str, str]],
) -> None:
    server, switch, place = node
    admin, client, bystander = (await connected(place, "admin"), await connected(place, "client"),
                                await connected(place, "client"))
    moving, staying = key_in(LO, HI), key_in(HI + 1, SLOTS - 1)
    move = await admin.request(Op.SLOTS_MOVE, {"lo": LO, "hi": HI, "to": "b"})
    held = await client.request(Op.SCOPE_CREATE, {"scope": moving})
    after = await client.request(Op.PING, {})  # behind it on its connection: waits too
    assert await bystander.ok(Op.SCOPE_CREATE, {"scope": staying})  # other slots go on
    assert await nothing_answered(client) and await nothing_answered(admin)
    assert switch.calls == [(LO, HI, "b", 7)]
    assert ("t", moving) not in server.core.scopes  # held: not executed

    switch.go.set()
    reply = await admin.recv()
    assert reply == [Kind.REPLY, move, {"lo": LO, "hi": HI, "shard": "b", "map_epoch": 8}]
    code, _, details = (await client.recv())[2:]
    assert (code, details) == ("MOVED", {"slot": slot_of(moving, SLOTS), "shard": "b",
                                         "primary": "127.0.0.1:7002", "map_epoch": 8})
    assert (await client.recv())[:2] == [Kind.REPLY, after]
    assert ("t", moving) not in server.core.scopes
    assert server.slots.map.owner(LO) == "b" and server.slots.moving is None
    assert not server.moves.held and held == after - 1


async def test_a_failed_switch_lets_the_held_requests_run_here_and_answers_unavailable(
    node: tuple[Server, FakeSwitch, dict[str, str]],
) -> None:
    server, switch, place = node
    admin, client = await connected(place, "admin"), await connected(place, "client")
    moving = key_in(LO, HI)
    move = await admin.request(Op.SLOTS_MOVE, {"lo": LO, "hi": HI, "to": "b"})
    held = await client.request(Op.SCOPE_CREATE, {"scope": moving})
    assert await nothing_answered(client)
    switch.failure = RuntimeError("the map moved meanwhile")
    switch.go.set()
    answer = await admin.recv()
    assert answer[:3] == [Kind.ERROR, move, "UNAVAILABLE"]
    assert "the map moved meanwhile" in answer[3]
    assert await client.recv() == [Kind.REPLY, held, {"scope": moving, "created": True}]
    assert server.slots.owns_all and server.slots.map is MAP


async def test_a_move_that_fails_unexpectedly_is_answered_and_releases_its_slots(
    node: tuple[Server, FakeSwitch, dict[str, str]],
) -> None:
    """A fault past the switch (here a switch that answered a map the node cannot adopt)
    is answered INTERNAL, naming it; the held requests go on and the server serves (the
    mover was left unanswered, its task's exception unseen)."""
    server, switch, place = node
    switch.answer = SlotMap(2 * SLOTS, 8, ((0, 2 * SLOTS - 1, "b"),), {"b": "127.0.0.1:7002"})
    admin, client = await connected(place, "admin"), await connected(place, "client")
    moving = key_in(LO, HI)
    move = await admin.request(Op.SLOTS_MOVE, {"lo": LO, "hi": HI, "to": "b"})
    held = await client.request(Op.SCOPE_CREATE, {"scope": moving})
    assert await nothing_answered(client)
    switch.go.set()
    answer = await asyncio.wait_for(admin.recv(), 5)
    assert answer[:3] == [Kind.ERROR, move, "INTERNAL"] and "cannot replace" in answer[3]
    assert await asyncio.wait_for(client.recv(), 5) == [
        Kind.REPLY, held, {"scope": moving, "created": True}]
    assert server.slots.moving is None and not server.moves.held
    assert await admin.ok(Op.PING, {})


async def test_slots_move_is_an_admin_operation(
    node: tuple[Server, FakeSwitch, dict[str, str]],
) -> None:
    _, switch, place = node
    client = await connected(place, "client")
    code, message, _ = await client.error(Op.SLOTS_MOVE, {"lo": LO, "hi": HI, "to": "b"})
    assert code == "PERMISSION_DENIED" and "admin operation" in message
    assert not switch.calls


async def test_slots_whose_runs_hold_pool_slots_are_not_moved_and_the_core_says_why(
    node: tuple[Server, FakeSwitch, dict[str, str]],
) -> None:
    server, switch, place = node
    server.core.serve_shard("a", SLOTS)  # as a primary of a cluster does
    admin = await connected(place, "admin")
    tag = key_in(LO, HI, "tag")  # the run and its pool share the tag's slot
    run, pool = f"{{{tag}}}run", f"{{{tag}}}gpu"
    await admin.ok(Op.SCOPE_CREATE, {"scope": run})
    await admin.ok(Op.POOL_ENSURE, {"name": pool, "size": 1})
    await admin.ok(Op.POOL_ACQUIRE, {"scope": run, "pool": pool})
    code, message, _ = await admin.error(Op.SLOTS_MOVE, {"lo": LO, "hi": HI, "to": "b"})
    assert code == "INVALID_ARGUMENT"
    assert message.startswith(f"run {run!r} holds pool slots or tasks that need capacity")
    assert not switch.calls and server.slots.owns_all  # nothing moved, nothing held
    assert await admin.ok(Op.SCOPE_STATUS, {"scope": run})


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        ({"lo": 8, "hi": 7, "to": "b"}, "INVALID_ARGUMENT", "0 <= lo <= hi < 64"),
        ({"lo": 0, "hi": 64, "to": "b"}, "INVALID_ARGUMENT", "0 <= lo <= hi < 64"),
        ({"lo": True, "hi": 9, "to": "b"}, "INVALID_ARGUMENT", "lo must be a slot number"),
        ({"lo": 0, "hi": 9, "to": ""}, "INVALID_ARGUMENT", "to must be a shard's name"),
        ({"lo": 0, "hi": 9, "to": "nowhere"}, "NOT_FOUND", "no shard 'nowhere'"),
    ],
)
async def test_a_bad_move_is_refused_naming_what_is_wrong(
    node: tuple[Server, FakeSwitch, dict[str, str]], args: dict[str, Any], code: str, says: str,
) -> None:
    _, switch, place = node
    admin = await connected(place, "admin")
    got, message, _ = await admin.error(Op.SLOTS_MOVE, args)
    assert (got, says in message) == (code, True), message
    assert not switch.calls


async def test_a_move_of_slots_of_another_shard_is_moved_and_one_to_itself_is_done(
    node: tuple[Server, FakeSwitch, dict[str, str]],
) -> None:
    server, switch, place = node
    server.slots.adopt(MAP.moved(20, 29, "b"))  # epoch 8
    admin = await connected(place, "admin")
    code, _, details = await admin.error(Op.SLOTS_MOVE, {"lo": 10, "hi": 25, "to": "b"})
    assert (code, details["slot"], details["shard"]) == ("MOVED", 20, "b")
    assert await admin.ok(Op.SLOTS_MOVE, {"lo": 0, "hi": 9, "to": "a"}) == {
        "lo": 0, "hi": 9, "shard": "a", "map_epoch": 8}
    assert not switch.calls


async def test_a_server_alone_is_one_shard_and_moves_nothing() -> None:
    server = Server(Core(lambda: "unused"), asyncio.get_running_loop())
    conn = await raw_connect(await start(server))
    try:
        await conn.hello()
        code, message, _ = await conn.error(Op.SLOTS_MOVE, {"lo": 0, "hi": 9, "to": "b"})
        assert code == "INVALID_ARGUMENT" and "a server alone is one shard" in message
        assert server.slots.owns_all
    finally:
        conn.close()
        await server.stop()


async def test_a_client_cannot_grow_the_server_by_flooding_a_moving_slot() -> None:
    owner = owner_of_a()
    switch = FakeSwitch(owner)
    owner.switch = switch
    shell = Shell(cluster="c", slots=owner)
    admin, flooder = shell.connect("admin"), shell.connect("flooder")
    admin.data_received(wire.request_frame(2, Op.SLOTS_MOVE, {"lo": LO, "hi": HI, "to": "b"}))
    await turn()
    moving = key_in(LO, HI)
    count = 20_000
    flood = b"".join(wire.request_frame(rid, Op.SCOPE_CREATE, {"scope": moving})
                     for rid in range(2, count + 2))
    written = len(transport(flooder).messages())
    flooder.data_received(flood)  # one read of every frame (a socket's would be smaller)
    await turn(3)
    # It waits with its first held request: not read, at most one chunk decoded, the
    # rest of the read undecoded (what the client budget counts), nothing answered.
    assert not transport(flooder).reading and flooder in shell.moves.held
    assert flooder.backlog is not None and len(flooder.backlog) <= 128
    assert len(transport(flooder).messages()) == written
    assert ("default", moving) not in shell.core.scopes

    switch.go.set()
    for _ in range(2000):
        await turn()
        if len(transport(flooder).messages()) - written >= count:
            break
    answers = transport(flooder).messages()[written:]
    assert len(answers) == count
    assert all(answer[:1] == [Kind.ERROR] and answer[2] == "MOVED" for answer in answers)
    assert ("default", moving) not in shell.core.scopes
    await shell.stop()
