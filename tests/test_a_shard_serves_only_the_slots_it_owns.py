"""A shard serves the runs, pools and quotas of the slots it owns, and nothing else: a
request for another shard's slot is answered MOVED (the slot, its owner, the owner's
primary, the map's epoch) and not executed; fresh run ids are minted in its own slots; a
placement puts a run in the placement's slot; a pool or quota serves runs of every shard,
and a task's needs name those of its run's shard. A server alone owns every slot and
answers SLOT_MAP with the whole map.

The map is given with ``server.slots.adopt(...)``, as the cluster side does at each change
it watches in etcd: no etcd is needed for the rules of one node."""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from rsd.core import Core
from rsd.server import Server
from rsd.slotowner import SlotOwner
from rsproto import Op
from rsproto.slots import DEFAULT_SHARD, DEFAULT_SLOTS, SlotMap, slot_of
from tests.support.process import Rsd
from tests.support.raw import RawConn, raw_connect

SLOTS = 1024
HALVES = SlotMap(SLOTS, 3, ((0, 511, "a"), (512, SLOTS - 1, "b")),
                 {"a": "127.0.0.1:7001", "b": "127.0.0.1:7002"})


def key_in(shard: str, prefix: str = "run") -> str:
    """A key whose slot ``HALVES`` gives to ``shard``."""
    return next(key for key in (f"{prefix}-{n}" for n in itertools.count())
                if HALVES.owner_of(key) == shard)


async def second_connection(server: Server) -> RawConn:
    """Another connection to ``server`` (HELLO not sent)."""
    host, port = server._server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
    return await raw_connect(f"{host}:{port}")


async def served(server: Server) -> AsyncIterator[RawConn]:
    host, port = await server.start("127.0.0.1", 0)
    conn = await raw_connect(f"{host}:{port}")
    await conn.hello()
    try:
        yield conn
    finally:
        conn.close()
        await server.stop()


@pytest.fixture
async def shard_a() -> AsyncIterator[tuple[Server, RawConn]]:
    """A server of shard "a" of a cluster, holding ``HALVES`` (slots 0-511 are its)."""
    server = Server(Core(lambda: secrets.token_hex(12)), asyncio.get_running_loop(),
                    cluster="c", slots=SlotOwner(SlotMap.whole("a", SLOTS, 1, None), "a"))
    server.slots.adopt(HALVES)
    async for conn in served(server):
        yield server, conn


async def test_a_server_alone_owns_every_slot_and_answers_slot_map_with_the_whole_map() -> None:
    server = Server(Core(lambda: secrets.token_hex(12)), asyncio.get_running_loop())
    assert server.slots.owns_all and server.batches.slots is server.slots
    async for conn in served(server):
        assert await conn.ok(Op.SLOT_MAP, {}) == {
            "slots": DEFAULT_SLOTS, "map_epoch": 0,
            "shards": [{"shard": DEFAULT_SHARD, "primary": None,
                        "ranges": [[0, DEFAULT_SLOTS - 1]]}]}
        for n in range(20):  # any run id at all is its
            assert (await conn.ok(Op.SCOPE_CREATE, {"scope": f"run-{n}"}))["created"]
        other = await second_connection(server)
        hello = await other.hello()
        other.close()
        assert "shard" not in hello and "cluster" not in hello


async def test_a_node_of_a_cluster_names_its_shard_and_map_in_hello(
    shard_a: tuple[Server, RawConn],
) -> None:
    other = await second_connection(shard_a[0])
    hello = await other.hello()
    other.close()
    assert hello["shard"] == {"name": "a", "slots": SLOTS, "map_epoch": 3}


async def test_a_request_for_another_shards_slot_is_answered_moved_and_not_executed(
    shard_a: tuple[Server, RawConn],
) -> None:
    server, conn = shard_a
    theirs = key_in("b")
    code, _, details = await conn.error(Op.SCOPE_CREATE, {"scope": theirs})
    assert code == "MOVED"
    assert details == {"slot": slot_of(theirs, SLOTS), "shard": "b",
                       "primary": "127.0.0.1:7002", "map_epoch": 3}
    assert ("default", theirs) not in server.core.scopes  # nothing was executed
    assert not server.core.effects.records
    for op, args in ((Op.SCOPE_STATUS, {"scope": theirs}),
                     (Op.CLAIM_ACQUIRE, {"scope": theirs, "key": "k"}),
                     (Op.TASK_SUBMIT, {"scope": theirs, "mailbox": "m", "data": 1}),
                     (Op.POOL_ENSURE, {"name": key_in("b", "pool"), "size": 1})):
        assert (await conn.error(op, args))[0] == "MOVED", op
    # Its own slots are served; ops with no run (PING, a mailbox's declaration) too.
    ours = key_in("a")
    assert (await conn.ok(Op.SCOPE_CREATE, {"scope": ours}))["created"]
    await conn.ok(Op.MAILBOX_ENSURE, {"name": "m", "mode": "WORK"})
    await conn.ok(Op.TASK_SUBMIT, {"scope": ours, "mailbox": "m", "data": 1})
    await conn.ok(Op.PING, {})
    assert await conn.ok(Op.SLOT_MAP, {}) == HALVES.to_wire()


async def test_fresh_run_ids_are_minted_only_in_the_shards_own_slots(
    shard_a: tuple[Server, RawConn],
) -> None:
    _, conn = shard_a
    for _ in range(40):
        scope = (await conn.ok(Op.SCOPE_CREATE, {}))["scope"]
        assert HALVES.owner_of(scope) == "a", scope
    # A shard that owns no slot mints none: MOVED to the owner of an id's slot.
    server, _ = shard_a
    server.slots.adopt(SlotMap(SLOTS, 4, ((0, SLOTS - 1, "b"),), HALVES.primaries))
    code, _, details = await conn.error(Op.SCOPE_CREATE, {})
    assert code == "MOVED" and details["shard"] == "b" and details["map_epoch"] == 4


async def test_a_placement_puts_the_run_in_the_slot_of_the_placement(
    shard_a: tuple[Server, RawConn],
) -> None:
    _, conn = shard_a
    ours, theirs = key_in("a", "acme"), key_in("b", "acme")
    scope = (await conn.ok(Op.SCOPE_CREATE, {"placement": ours}))["scope"]
    assert scope.startswith("{" + ours + "}") and len(scope) == len(ours) + 2 + 24
    assert slot_of(scope, SLOTS) == slot_of(ours, SLOTS)
    code, _, details = await conn.error(Op.SCOPE_CREATE, {"placement": theirs})
    assert (code, details["slot"]) == ("MOVED", slot_of(theirs, SLOTS))
    for args, says in (({"placement": ours, "scope": key_in("a")}, "not both"),
                       ({"placement": 7}, "placement must be a string"),
                       ({"placement": ""}, "placement must be 1 to 64 UTF-8 bytes"),
                       ({"placement": "a{b"}, "must not contain")):
        code, message, _ = await conn.error(Op.SCOPE_CREATE, args)
        assert code == "INVALID_ARGUMENT" and says in message, (args, message)


async def test_a_pool_serves_runs_of_every_shard_and_a_tasks_needs_name_one_shard(
    shard_a: tuple[Server, RawConn],
) -> None:
    _, conn = shard_a
    run_a = (await conn.ok(Op.SCOPE_CREATE, {"scope": key_in("a")}))["scope"]
    run_b = key_in("b")
    pool_a, pool_b = key_in("a", "pool"), key_in("b", "pool")
    await conn.ok(Op.POOL_ENSURE, {"name": pool_a, "size": 2})
    await conn.ok(Op.QUOTA_ENSURE, {"name": pool_a, "limit": 2, "per_seconds": 60})
    await conn.ok(Op.MAILBOX_ENSURE, {"name": "m", "mode": "WORK"})
    # A run of shard b takes a slot and a quota amount of shard a's (their home).
    await conn.ok(Op.POOL_ACQUIRE, {"scope": run_b, "pool": pool_a})
    await conn.ok(Op.QUOTA_TAKE, {"scope": run_b, "quota": pool_a})
    # A run of this shard never made is still NOT_FOUND.
    code, _, _ = await conn.error(Op.POOL_ACQUIRE, {"scope": key_in("a", "x"), "pool": pool_a})
    assert code == "NOT_FOUND"
    code, message, _ = await conn.error(Op.POOL_ACQUIRE, {"scope": run_a, "pool": pool_b})
    assert code == "MOVED", message  # the pool's shard serves it
    # A task may need another shard's pools and quotas (its shard asks that one for a
    # grant: rsd/core/work/grants.py), but not this shard's and another's together.
    await conn.ok(Op.TASK_SUBMIT, {"scope": run_a, "mailbox": "m", "data": 1,
                                   "needs": {"pools": [pool_b]}})
    await conn.ok(Op.MESSAGE_SEND, {"scope": run_a, "mailbox": "m", "data": 1,
                                    "needs": {"quotas": {pool_b: 1}}})
    refused: list[tuple[Op, dict[str, Any]]] = [
        (Op.TASK_SUBMIT, {"scope": run_a, "mailbox": "m", "data": 1,
                          "needs": {"pools": [pool_a, pool_b]}}),
        (Op.MESSAGE_SEND, {"scope": run_a, "mailbox": "m", "data": 1,
                           "needs": {"pools": [pool_a], "quotas": {pool_b: 1}}}),
        (Op.TASK_SUBMIT_MANY, {"scope": run_a, "mailbox": "m",
                               "items": [{"data": 1, "needs": {"pools": [pool_a]}},
                                         {"data": 2, "needs": {"pools": [pool_b]}}]}),
    ]
    for op, args in refused:
        code, message, _ = await conn.error(op, args)
        assert code == "INVALID_ARGUMENT" and "different shards" in message, (op, message)
    # Together (one shard), they are served.
    await conn.ok(Op.POOL_ACQUIRE, {"scope": run_a, "pool": pool_a})
    await conn.ok(Op.TASK_SUBMIT, {"scope": run_a, "mailbox": "m", "data": 1,
                                   "needs": {"pools": [pool_a]}})


def test_a_map_of_a_lower_epoch_is_ignored_and_one_of_other_slots_refused() -> None:
    owner = SlotOwner(HALVES, "a")
    assert not owner.owns_all
    owner.adopt(SlotMap.whole("a", SLOTS, 2, None))  # older than HALVES' epoch 3
    assert owner.map is HALVES
    owner.adopt(SlotMap.whole("a", SLOTS, 5, None))
    assert owner.owns_all and owner.map.epoch == 5
    with pytest.raises(ValueError, match="slots are fixed"):
        owner.adopt(SlotMap.whole("a", 16, 6, None))


async def test_rsd_alone_holds_every_one_of_the_slots_it_was_given(
    rsd_factory: Callable[..., Rsd],
) -> None:
    server = rsd_factory("--slots", "16", "--shard", "ignored-alone")
    conn = await raw_connect(server.address)
    try:
        assert "shard" not in await conn.hello()
        assert await conn.ok(Op.SLOT_MAP, {}) == {
            "slots": 16, "map_epoch": 0,
            "shards": [{"shard": DEFAULT_SHARD, "primary": None, "ranges": [[0, 15]]}]}
    finally:
        conn.close()
