"""A client of a sharded cluster sends each request to the shard that owns it
(``rsclient/shards.py``), by the one table both SDKs follow (``sdkrules.ROUTE``).

A run's requests go to the primary of the shard owning its slot, one connection per
shard primary, made when first needed; a lease is renewed, settled and released on the
connection that granted it; a mailbox declaration reaches every shard; a run made with
a placement is made where the placement's slot lives. A request answered MOVED was not
executed: the map is asked again and the request goes to the owner, at most
MAX_REDIRECTS times in a row. A server alone, or a cluster whose one shard owns every
slot, is one connection and asks no map: the session's request methods stay the
connection's own, so a request costs what it did before shards.

Fake nodes (support/fake.py) stand in for each shard's primary: each tells its shard in
HELLO, answers SLOT_MAP with the cluster's map and MOVED for a run another shard owns.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from support.aio import eventually_true
from support.fake import DROP, FakeNode, Refusal

from rsclient import AsyncRunstate, UnavailableError
from rsclient.sync import Runstate
from rsproto import ErrorCode, Op
from rsproto.sdkrules import MAX_REDIRECTS, route_key
from rsproto.slots import SlotMap, slot_of

SLOTS = 2  # slot 0 is east's, slot 1 west's


def run_on(slot: int) -> str:
    """A run id whose slot is ``slot``."""
    return next(key for i in itertools.count() if slot_of(key := f"run-{i}", SLOTS) == slot)


EAST_RUN, WEST_RUN = run_on(0), run_on(1)
PLACEMENT = next(p for i in itertools.count() if slot_of(p := f"tenant-{i}", SLOTS) == 1)


class Cluster:
    """Two shards, ``east`` and ``west``, each a fake primary serving one map."""

    def __init__(self, east: FakeNode, west: FakeNode) -> None:
        self.east, self.west = east, west
        self.map = SlotMap(SLOTS, 2, ((0, 0, "east"), (1, 1, "west")),
                           {"east": east.address, "west": west.address})
        self.moved: list[tuple[str, int]] = []  # (node, op) answered MOVED
        serve(east, "east", self)
        serve(west, "west", self)

    def shard_of(self, node: FakeNode) -> str:
        return "east" if node is self.east else "west"


def _handle(shard: str) -> bytes:
    return (shard[0] * 16).encode()


def _created(shard: str, args: dict[str, Any]) -> str:
    """The id SCOPE_CREATE gives: the one chosen, a placed one, or a fresh one."""
    if args.get("scope"):
        return str(args["scope"])
    if args.get("placement"):
        return placed(args["placement"])
    return f"fresh-{shard}"


def placed(placement: str) -> str:
    return "{" + placement + "}" + "0" * 24


def replies(shard: str) -> dict[int, Callable[[dict[str, Any]], Any]]:
    handle = _handle(shard)
    delivery = {"id": f"t-{shard}", "kind": "task", "task_id": f"t-{shard}", "key": None,
                "data": shard, "attempt": 1, "lease": handle, "lease_seconds": 30}
    view = {"id": f"t-{shard}", "state": "PENDING", "created": True}
    return {
        Op.CLAIM_ACQUIRE: lambda args: {"lease": handle, "generation": 1,
                                        "lease_seconds": args["lease_seconds"]},
        Op.CLAIM_RELEASE: lambda args: {"released": True},
        Op.TASK_SUBMIT: lambda args: view,
        Op.TASK_STATUS: lambda args: view,
        Op.TASK_RESULT: lambda args: {**view, "state": "SUCCEEDED", "outcome": shard},
        Op.MAILBOX_ENSURE: lambda args: {"name": args["name"], "created": shard == "east"},
        Op.RECEIVE: lambda args: {"delivery": delivery},
        Op.DELIVERY_COMPLETE: lambda args: {"id": f"t-{shard}", "state": "SUCCEEDED"},
        Op.SCOPE_CREATE: lambda args: {"scope": _created(shard, args), "created": True},
        Op.SCOPE_STATUS: lambda args: {"scope": args["scope"], "state": "open"},
    }


def serve(node: FakeNode, shard: str, cluster: Cluster) -> None:
    """``node`` is ``shard``'s primary: its HELLO names the shard, SLOT_MAP answers the
    cluster's map, a request whose key's slot another shard owns is answered MOVED."""
    node.shard = {"name": shard, "slots": SLOTS, "map_epoch": cluster.map.epoch}
    node.handlers[Op.SLOT_MAP] = lambda args: cluster.map.to_wire()
    for op, reply in replies(shard).items():
        node.handlers[op] = owned(node, shard, cluster, op, reply)


def owned(node: FakeNode, shard: str, cluster: Cluster, op: int,
          reply: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    def answer(args: dict[str, Any]) -> Any:
        _, key = route_key(op, args)
        if key is not None:
            slot = slot_of(key, SLOTS)
            owner = cluster.map.owner(slot)
            if owner != shard:
                cluster.moved.append((shard, op))
                return Refusal(ErrorCode.MOVED, f"slot {slot} is shard {owner}'s", {
                    "slot": slot, "shard": owner, "primary": cluster.map.primaries[owner],
                    "map_epoch": cluster.map.epoch})
        return reply(args)
    return answer


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    east, west = FakeNode("east"), FakeNode("west")
    await east.start()
    await west.start()
    yield Cluster(east, west)
    await east.close()
    await west.close()


def scopes(node: FakeNode, op: int) -> list[str]:
    """The run of every ``op`` request ``node`` got."""
    return [args["scope"] for seen, args in node.requests if seen == op]


async def test_requests_of_runs_on_two_shards_go_to_their_shards_connection(
    cluster: Cluster,
) -> None:
    east, west = cluster.east, cluster.west
    rs = AsyncRunstate("holder", east.address)  # one node given: the map names the rest
    try:
        east_box, west_box = rs.scope(EAST_RUN).mailbox("m"), rs.scope(WEST_RUN).mailbox("m")
        # The first request waits for the connect that learns the map: routed too.
        await west_box.submit(1, key="k")
        await east_box.submit(2, key="k")
        assert (await rs.scope(WEST_RUN).task("t-west").result(1000))["outcome"] == "west"
        assert (await rs.scope(EAST_RUN).status())["state"] == "open"
        await rs.scope(WEST_RUN).status()
    finally:
        await rs.close()
    assert scopes(east, Op.TASK_SUBMIT) == [EAST_RUN]
    assert scopes(west, Op.TASK_SUBMIT) == [WEST_RUN]
    assert scopes(west, Op.TASK_RESULT) == [WEST_RUN]
    assert scopes(east, Op.SCOPE_STATUS) == [EAST_RUN]
    assert scopes(west, Op.SCOPE_STATUS) == [WEST_RUN]
    assert cluster.moved == []  # routed by the map, not by trial and error
    assert (east.hellos, west.hellos) == (1, 1)  # one connection per shard primary
    assert east.ops().count(Op.SLOT_MAP) == 1 and Op.SLOT_MAP not in west.ops()


async def test_a_lease_is_renewed_settled_and_released_on_the_connection_that_granted_it(
    cluster: Cluster,
) -> None:
    east, west = cluster.east, cluster.west
    west_handle = _handle("west")
    async with AsyncRunstate("holder", east.address) as rs:
        lease = await rs.scope(WEST_RUN).claim("k", lease_seconds=3).acquire()
        await eventually_true(lambda: Op.LEASE_RENEW in west.ops(), timeout=4)  # the keeper
        await lease.renew()
        delivery = await rs.scope(WEST_RUN).mailbox("m").receive()
        assert delivery is not None and delivery.data == "west"
        await delivery.complete()
        await lease.release()
        stop = asyncio.Event()

        async def handle(data: Any, got: Any) -> None:
            stop.set()
        await rs.scope(WEST_RUN).mailbox("m").consume(handle, stop_event=stop)
    renewed = [args["leases"] for op, args in west.requests if op == Op.LEASE_RENEW]
    assert renewed and all(leases == [west_handle] for leases in renewed)
    settled = [args["lease"] for op, args in west.requests if op == Op.DELIVERY_COMPLETE]
    assert settled and set(settled) == {west_handle}
    assert [args["lease"] for op, args in west.requests if op == Op.CLAIM_RELEASE] == [
        west_handle]
    for op in (Op.LEASE_RENEW, Op.DELIVERY_COMPLETE, Op.CLAIM_RELEASE, Op.RECEIVE):
        assert op not in east.ops()


async def test_a_mailbox_declaration_reaches_every_shard_that_owns_slots(
    cluster: Cluster,
) -> None:
    east, west = cluster.east, cluster.west
    # A third shard that owns no slot (a shard being added) is not asked.
    cluster.map = SlotMap(SLOTS, 2, cluster.map.ranges, {**cluster.map.primaries, "spare": None})
    rs = AsyncRunstate("holder", west.address)
    try:
        reply = await rs.mailboxes.ensure("jobs")  # the first request: it waits for the map
    finally:
        await rs.close()
    assert reply == {"name": "jobs", "created": True}  # the first shard's answer (east's)
    assert [args["name"] for op, args in east.requests if op == Op.MAILBOX_ENSURE] == ["jobs"]
    assert [args["name"] for op, args in west.requests if op == Op.MAILBOX_ENSURE] == ["jobs"]


async def test_a_refusal_of_one_shard_fails_the_declaration(cluster: Cluster) -> None:
    cluster.west.handlers[Op.MAILBOX_ENSURE] = lambda args: Refusal(
        ErrorCode.INVALID_ARGUMENT, "mode must be WORK or ...")
    async with AsyncRunstate("holder", cluster.east.address) as rs:
        with pytest.raises(Exception) as raised:
            await rs.mailboxes.ensure("jobs", mode="NOPE")
    assert getattr(raised.value, "code", None) == ErrorCode.INVALID_ARGUMENT


async def test_a_placement_is_sent_and_its_run_made_on_the_shard_of_its_slot(
    cluster: Cluster,
) -> None:
    east, west = cluster.east, cluster.west
    async with AsyncRunstate("holder", east.address) as rs:
        run = await rs.scopes.create(placement=PLACEMENT)
        fresh = await rs.scopes.create()  # no run named yet: where it lands (home)
        with pytest.raises(Exception, match="not both"):
            await rs.scopes.create("chosen", placement=PLACEMENT)
        with pytest.raises(Exception, match="placement must not contain"):
            await rs.scopes.create(placement="a{b}")
    assert run.id == placed(PLACEMENT)
    assert slot_of(run.id, SLOTS) == slot_of(PLACEMENT, SLOTS) == 1
    assert [args for op, args in west.requests if op == Op.SCOPE_CREATE] == [
        {"placement": PLACEMENT}]
    assert fresh.id == "fresh-east"


async def test_the_sync_client_sends_a_placement_too(cluster: Cluster) -> None:
    def create() -> str:
        with Runstate("holder", cluster.east.address) as rs:
            return rs.scopes.create(placement=PLACEMENT).id
    assert await asyncio.to_thread(create) == placed(PLACEMENT)
    assert [args for op, args in cluster.west.requests if op == Op.SCOPE_CREATE] == [
        {"placement": PLACEMENT}]


async def test_a_request_answered_moved_is_sent_once_more_to_the_owner(
    cluster: Cluster,
) -> None:
    east, west = cluster.east, cluster.west
    async with AsyncRunstate("holder", east.address) as rs:
        await rs.scope(WEST_RUN).status()  # the map known, west connected
        # Slot 1 moves to east (an operator's `rsctl slots move`): west answers MOVED.
        cluster.map = cluster.map.moved(1, 1, "east")
        for node in (east, west):
            node.shard = {**(node.shard or {}), "map_epoch": cluster.map.epoch}
        await rs.scope(WEST_RUN).mailbox("m").submit(1, key="k")
        assert (await rs.scope(WEST_RUN).task("t-east").result(1000))["outcome"] == "east"
        lease = await rs.scope(WEST_RUN).claim("c").acquire()
        assert lease.handle == _handle("east")
        await lease.release()
    assert cluster.moved == [("west", Op.TASK_SUBMIT)]  # once: the map was refreshed
    assert west.ops().count(Op.SLOT_MAP) == 1  # asked on the connection that answered
    assert scopes(east, Op.TASK_SUBMIT) == [WEST_RUN]  # executed once, by the owner
    assert [args["lease"] for op, args in east.requests if op == Op.CLAIM_RELEASE] == [
        _handle("east")]


async def test_moved_answers_past_max_redirects_raise_unavailable_with_code_moved(
    cluster: Cluster,
) -> None:
    east, west = cluster.east, cluster.west
    # West's node believes east owns slot 1, and east's map says west does: a map that
    # does not settle.
    stale = cluster.map.moved(1, 1, "east")
    for op in (Op.SCOPE_STATUS, Op.TASK_RESULT):
        west.handlers[op] = lambda args: Refusal(ErrorCode.MOVED, "moved", {
            "slot": 1, "shard": "east", "primary": east.address, "map_epoch": stale.epoch})
    async with AsyncRunstate("holder", east.address) as rs:
        with pytest.raises(UnavailableError) as raised:
            await rs.scope(WEST_RUN).status()
        with pytest.raises(UnavailableError) as waited:
            await rs.scope(WEST_RUN).task("t").result(1000)  # a wait follows MOVED too
    assert raised.value.code == ErrorCode.MOVED
    assert raised.value.details["shard"] == "east"  # the last answer's details kept
    assert west.ops().count(Op.SCOPE_STATUS) == 1 + MAX_REDIRECTS
    assert waited.value.code == ErrorCode.MOVED


@pytest.mark.parametrize("shard", [None, {"name": "default", "slots": 1024, "map_epoch": 1}])
async def test_a_server_alone_or_one_shard_is_one_connection_and_asks_no_map(
    shard: dict[str, Any] | None,
) -> None:
    node = FakeNode("alone")
    await node.start()
    node.shard = shard
    node.handlers.update(replies("east"))
    try:
        async with AsyncRunstate("holder", node.address) as rs:
            await rs.scope(EAST_RUN).mailbox("m").submit(1, key="k")
            await rs.scope(WEST_RUN).mailbox("m").submit(1, key="k")
            await rs.mailboxes.ensure("m")
            # The session's request methods are still the connection's own: nothing is
            # hashed or looked up per request.
            assert rs._session.request == rs._conn.request
            assert rs._session.request_cancellable == rs._conn.request_cancellable
            assert rs._session.router is None
    finally:
        await node.close()
    assert node.hellos == 1
    assert Op.SLOT_MAP not in node.ops()
    assert node.ops() == [Op.TASK_SUBMIT, Op.TASK_SUBMIT, Op.MAILBOX_ENSURE]


async def test_a_node_of_another_shard_redirects_to_the_primary_its_map_names(
    cluster: Cluster,
) -> None:
    east, west = cluster.east, cluster.west
    # The map the client first reads names east's node as west's primary (stale): its
    # HELLO names shard east, so the client reads east's map there and goes to west.
    stale = SlotMap(SLOTS, 2, cluster.map.ranges, {"east": east.address, "west": east.address})
    east.handlers[Op.SLOT_MAP] = lambda args: (stale if east.ops().count(Op.SLOT_MAP) == 1
                                               else cluster.map).to_wire()
    async with AsyncRunstate("holder", east.address) as rs:
        await rs.scope(WEST_RUN).status()
    assert scopes(west, Op.SCOPE_STATUS) == [WEST_RUN]
    assert east.hellos == 2  # home's, and the west connection's first try
    assert Op.SCOPE_STATUS not in east.ops()


async def test_a_shard_that_lost_its_primary_finds_the_new_one_through_the_map(
    cluster: Cluster,
) -> None:
    east, west = cluster.east, cluster.west
    successor = FakeNode("west-2")
    await successor.start()
    serve(successor, "west", cluster)
    try:
        async with AsyncRunstate("holder", east.address) as rs:
            lease = await rs.scope(WEST_RUN).claim("k").acquire()  # granted by west
            # West's primary dies; etcd elects its standby, which the map names now.
            cluster.map = SlotMap(SLOTS, 2, cluster.map.ranges,
                                  {"east": east.address, "west": successor.address})
            west.handlers[Op.LEASE_RENEW] = lambda args: DROP
            west.hello = Refusal(ErrorCode.UNAVAILABLE, "gone")
            await lease.renew()  # lost with west's connection: sent again, to the successor
            assert not lease.is_lost
            await lease.release()
    finally:
        await successor.close()
    renewed = [args["leases"] for op, args in successor.requests if op == Op.LEASE_RENEW]
    assert renewed[0] == [_handle("west")]
    assert [args["lease"] for op, args in successor.requests if op == Op.CLAIM_RELEASE] == [
        _handle("west")]


async def test_a_lease_bound_to_its_connection_ends_with_its_shards_connection_only(
    cluster: Cluster,
) -> None:
    east, west = cluster.east, cluster.west
    async with AsyncRunstate("holder", east.address) as rs:
        on_west = await rs.scope(WEST_RUN).claim("k", release_on_disconnect=True).acquire()
        on_east = await rs.scope(EAST_RUN).claim("k", release_on_disconnect=True).acquire()
        east.drop()  # home's connection ends: the east lease with it, not west's
        await eventually_true(lambda: on_east.is_lost)
        assert not on_west.is_lost
        west.drop()
        await eventually_true(lambda: on_west.is_lost)


@pytest.mark.parametrize("first", ["wait", "submit_and_wait", "receive"])
async def test_the_first_request_that_waited_for_the_map_goes_to_its_shard(
    cluster: Cluster, first: str,
) -> None:
    east = cluster.east
    rs = AsyncRunstate("holder", east.address)  # not connected: the first call connects
    try:
        run = rs.scope(WEST_RUN)
        if first == "wait":
            lease = await run.claim("k").acquire(wait=True, timeout_ms=1000)
            await lease.release()
        elif first == "submit_and_wait":
            assert (await run.mailbox("m").submit_and_wait(1, key="k"))["outcome"] == "west"
        else:
            assert await run.mailbox("m").receive() is not None
    finally:
        await rs.close()
    assert cluster.moved == []
    assert east.ops() == [Op.SLOT_MAP]  # only the map: every request went to west
    assert Op.SLOT_MAP not in cluster.west.ops()
