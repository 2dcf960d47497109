"""What becomes of a request when its primary dies or steps down (``failover.py``).

A request answered NOT_PRIMARY was not executed: the client reconnects to the primary
named and sends it again, whatever it is. A request lost with its connection may have
been executed: a client of a cluster sends it again only if a second execution cannot
differ from one (reads and admin listings, keyed submits, sends with a work key,
ensures, renewals), and raises UnavailableError for the rest (an unkeyed submit, a send
without work key, an acquire or receive that does not wait, a take, a dead letter's
delete); a lone rsd raises it for all of them,
as it always did. The lease keeper renews its leases on the new primary; waits are
made again there; settlements are sent again with the same handle. Fake nodes
(support/fake.py) stand in for rsd.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from support.aio import eventually_true
from support.fake import DROP, HOLD, FakeNode, not_primary

from rsclient import AsyncRunstate, ConnectionEvent, UnavailableError
from rsclient.failover import MAX_SENDS
from rsproto import ErrorCode, Op

HANDLE = bytes(range(16))
MakeNodes = Callable[[int], Awaitable[list[FakeNode]]]


@pytest.fixture
async def nodes() -> AsyncIterator[MakeNodes]:
    made: list[FakeNode] = []

    async def make(count: int) -> list[FakeNode]:
        for _ in range(count):
            node = FakeNode(f"n{len(made) + 1}")
            await node.start()
            node.handlers.update(REPLIES)
            made.append(node)
        return made[-count:]

    yield make
    for node in made:
        await node.close()


def _view(args: dict[str, Any]) -> dict[str, Any]:
    return {"id": "t-1", "state": "PENDING", "created": True, "key": args.get("key")}


def _delivery(args: dict[str, Any]) -> dict[str, Any]:
    return {"delivery": {
        "id": "t-1", "kind": "task", "task_id": "t-1", "key": None, "data": 1,
        "attempt": 1, "lease": HANDLE, "lease_seconds": 30,
    }}


REPLIES: dict[int, Callable[[dict[str, Any]], Any]] = {
    Op.CLAIM_ACQUIRE: lambda args: {"lease": HANDLE, "generation": 1, "lease_seconds": 3},
    Op.TASK_SUBMIT: _view,
    Op.TASK_STATUS: _view,
    Op.TASK_RESULT: lambda args: {**_view(args), "state": "SUCCEEDED", "outcome": 42},
    Op.MESSAGE_SEND: lambda args: {"id": "m-1", "replay": False},
    Op.MAILBOX_ENSURE: lambda args: {"name": args["name"], "created": True},
    Op.RECEIVE: _delivery,
    Op.DELIVERY_COMPLETE: lambda args: {"id": "t-1", "state": "SUCCEEDED"},
    Op.QUOTA_TAKE: lambda args: {"taken": 1, "level": 0.0, "waited_ms": 0},
    Op.ADMIN_QUOTAS: lambda args: {"quotas": [], "next": None},
    Op.ADMIN_MAILBOXES: lambda args: {"mailboxes": [], "next": None},
    Op.ADMIN_QUEUES: lambda args: {"mailboxes": [], "next": None},
    Op.ADMIN_GROUPS: lambda args: {"groups": [], "next": None},
    Op.DEAD_LETTER_DELETE: lambda args: {"deleted": args["id"], "left": 0},
}


async def walk(listing: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [obj async for obj in listing]


def dies_on(node: FakeNode, op: int, successor: FakeNode) -> None:
    """``node`` dies with ``op`` unanswered (executed or not: nobody can tell) and comes
    back as a standby naming ``successor``, the new primary."""
    def die(args: dict[str, Any]) -> Any:
        node.hello = not_primary(successor.address, epoch=2)
        return DROP
    node.handlers[op] = die


def steps_down_on(node: FakeNode, op: int, successor: FakeNode) -> None:
    """``node`` answers ``op`` NOT_PRIMARY naming ``successor`` (it just stepped down)."""
    def refuse(args: dict[str, Any]) -> Any:
        node.hello = not_primary(successor.address, epoch=2)
        return not_primary(successor.address, epoch=2)
    node.handlers[op] = refuse


def count(node: FakeNode, op: int) -> int:
    return node.ops().count(op)


async def test_a_request_answered_not_primary_reconnects_and_the_keeper_renews_on_the_new_primary(
    nodes: MakeNodes,
) -> None:
    old, new = await nodes(2)
    steps_down_on(old, Op.LEASE_RENEW, new)
    events: list[ConnectionEvent] = []
    async with AsyncRunstate("holder", f"{old.address},{new.address}") as rs:
        rs.on_connection_event(events.append)
        lease = await rs.scope("run").claim("k", lease_seconds=5).acquire()  # 3 s granted
        first_deadline = lease.lost_at
        await eventually_true(lambda: count(new, Op.LEASE_RENEW) >= 1, timeout=4)
        assert count(old, Op.LEASE_RENEW) == 1  # answered NOT_PRIMARY: not executed
        renewed = [args["leases"] for op, args in new.requests if op == Op.LEASE_RENEW]
        assert renewed[0] == [HANDLE]  # the same handle, renewed on the new primary
        await eventually_true(lambda: lease.lost_at > first_deadline)
        assert not lease.is_lost
        await asyncio.sleep(0)
        kinds = [(event.kind, event.address) for event in events]
        assert kinds[:3] == [
            ("disconnected", old.address), ("reconnecting", old.address),
            ("restored", new.address),
        ]
        assert "no longer the primary" in (events[0].cause or "")
        await lease.release()


async def test_a_request_answered_not_primary_is_sent_to_the_primary_even_unkeyed(
    nodes: MakeNodes,
) -> None:
    old, new = await nodes(2)
    steps_down_on(old, Op.TASK_SUBMIT, new)
    async with AsyncRunstate("me", f"{old.address},{new.address}") as rs:
        ticket = await rs.scope("run").mailbox("m").submit({"n": 1})  # no key
    assert ticket.id == "t-1"
    assert (count(old, Op.TASK_SUBMIT), count(new, Op.TASK_SUBMIT)) == (1, 1)


async def test_a_request_answered_not_primary_by_a_lone_address_is_followed_too(
    nodes: MakeNodes,
) -> None:
    old, new = await nodes(2)
    steps_down_on(old, Op.MESSAGE_SEND, new)
    async with AsyncRunstate("me", old.address) as rs:  # one address: a cluster behind it
        sent = await rs.scope("run").mailbox("m").send({"n": 1})
    assert sent["id"] == "m-1"
    assert (count(old, Op.MESSAGE_SEND), count(new, Op.MESSAGE_SEND)) == (1, 1)


async def test_requests_in_flight_at_a_step_down_are_unknown_and_sent_again_only_if_safe(
    nodes: MakeNodes,
) -> None:
    old, new = await nodes(2)
    old.handlers[Op.MESSAGE_SEND] = lambda args: HOLD  # in flight when it steps down
    async with AsyncRunstate("me", f"{old.address},{new.address}") as rs:
        mailbox = rs.scope("run").mailbox("m")
        keyed = asyncio.create_task(mailbox.send({"n": 1}, work_key="w"))
        unkeyed = asyncio.create_task(mailbox.send({"n": 2}))
        await eventually_true(lambda: count(old, Op.MESSAGE_SEND) == 2)
        old.step_down(new.address)  # a connection-level NOT_PRIMARY, then close
        assert (await keyed)["id"] == "m-1"  # deduplicated by its work key: sent again
        with pytest.raises(UnavailableError) as lost:
            await unkeyed  # it may have been executed: a second send could make two
        assert lost.value.code == ErrorCode.UNAVAILABLE  # unknown, not "not executed"
        assert "no longer the primary" in lost.value.message
    sent_again = [args for op, args in new.requests if op == Op.MESSAGE_SEND]
    assert sent_again == [{"scope": "run", "mailbox": "m", "data": {"n": 1},
                           "work_key": "w", "needs": None}]


SAFE: list[tuple[str, int, Callable[[AsyncRunstate], Awaitable[Any]]]] = [
    ("keyed submit", Op.TASK_SUBMIT,
     lambda rs: rs.scope("r").mailbox("m").submit(1, key="k")),
    ("send with a work key", Op.MESSAGE_SEND,
     lambda rs: rs.scope("r").mailbox("m").send(1, work_key="w")),
    ("read", Op.TASK_STATUS, lambda rs: rs.scope("r").task("t-1").status()),
    ("ensure", Op.MAILBOX_ENSURE, lambda rs: rs.mailboxes.ensure("m")),
    ("ping", Op.PING, lambda rs: rs.ping()),
    ("admin quotas", Op.ADMIN_QUOTAS, lambda rs: walk(rs.admin.iter_quotas())),
    ("admin mailboxes", Op.ADMIN_MAILBOXES, lambda rs: walk(rs.admin.iter_mailboxes())),
    ("admin queues", Op.ADMIN_QUEUES, lambda rs: walk(rs.admin.iter_queues("r"))),
    ("admin groups", Op.ADMIN_GROUPS, lambda rs: walk(rs.admin.iter_groups("r"))),
]
UNSAFE: list[tuple[str, int, Callable[[AsyncRunstate], Awaitable[Any]]]] = [
    ("unkeyed submit", Op.TASK_SUBMIT, lambda rs: rs.scope("r").mailbox("m").submit(1)),
    ("send without work key", Op.MESSAGE_SEND,
     lambda rs: rs.scope("r").mailbox("m").send(1)),
    ("acquire without waiting", Op.CLAIM_ACQUIRE,
     lambda rs: rs.scope("r").claim("k").acquire()),
    ("receive without waiting", Op.RECEIVE,
     lambda rs: rs.scope("r").mailbox("m").receive()),
    ("take without waiting", Op.QUOTA_TAKE,
     lambda rs: rs.scope("r").quota("q").take(1, wait=False)),
    ("dead letter delete", Op.DEAD_LETTER_DELETE,
     lambda rs: rs.admin.delete_dead_letter("r", "m", "t-1")),
]


@pytest.mark.parametrize(("what", "op", "call"), SAFE, ids=[case[0] for case in SAFE])
async def test_a_safe_request_lost_with_its_primary_is_sent_to_the_next(
    nodes: MakeNodes, what: str, op: int, call: Callable[[AsyncRunstate], Awaitable[Any]],
) -> None:
    old, new = await nodes(2)
    dies_on(old, op, new)
    async with AsyncRunstate("me", f"{old.address},{new.address}") as rs:
        await call(rs)
    assert (count(old, op), count(new, op)) == (1, 1)


@pytest.mark.parametrize(("what", "op", "call"), UNSAFE, ids=[case[0] for case in UNSAFE])
async def test_an_unsafe_request_lost_with_its_primary_raises_unavailable(
    nodes: MakeNodes, what: str, op: int, call: Callable[[AsyncRunstate], Awaitable[Any]],
) -> None:
    old, new = await nodes(2)
    dies_on(old, op, new)
    async with AsyncRunstate("me", f"{old.address},{new.address}") as rs:
        with pytest.raises(UnavailableError) as lost:
            await call(rs)
        assert lost.value.code == ErrorCode.UNAVAILABLE
        assert await rs.ping() == {"time": 0.0}  # the client itself follows
    assert (count(old, op), count(new, op)) == (1, 0)


@pytest.mark.parametrize(("what", "op", "call"), SAFE, ids=[case[0] for case in SAFE])
async def test_a_lone_rsd_never_sends_again_what_its_connection_lost(
    nodes: MakeNodes, what: str, op: int, call: Callable[[AsyncRunstate], Awaitable[Any]],
) -> None:
    (alone,) = await nodes(1)
    alone.handlers[op] = lambda args: DROP
    async with AsyncRunstate("me", alone.address) as rs:
        with pytest.raises(UnavailableError) as lost:
            await call(rs)
        assert lost.value.message == "the connection to rsd was lost"
    assert count(alone, op) == 1  # exactly as before clusters


async def test_a_request_that_takes_down_every_node_is_sent_at_most_three_times(
    nodes: MakeNodes,
) -> None:
    first, second = await nodes(2)
    first.handlers[Op.TASK_STATUS] = second.handlers[Op.TASK_STATUS] = lambda args: DROP
    async with AsyncRunstate("me", f"{first.address},{second.address}") as rs:
        with pytest.raises(UnavailableError):
            await rs.scope("r").task("t-1").status()
    assert count(first, Op.TASK_STATUS) + count(second, Op.TASK_STATUS) == MAX_SENDS == 3


async def test_a_settlement_lost_with_its_primary_is_sent_to_the_next_with_its_handle(
    nodes: MakeNodes,
) -> None:
    old, new = await nodes(2)
    dies_on(old, Op.DELIVERY_COMPLETE, new)
    async with AsyncRunstate("me", f"{old.address},{new.address}") as rs:
        delivery = await rs.scope("r").mailbox("m").receive()
        assert delivery is not None
        await delivery.complete(result={"payload": 7})
        assert delivery.state == "SUCCEEDED"
    settled = [args for op, args in new.requests if op == Op.DELIVERY_COMPLETE]
    assert settled == [{"outcome": 7, "lease": HANDLE}]


async def test_a_wait_parked_on_a_primary_that_steps_down_is_made_again_on_the_next(
    nodes: MakeNodes,
) -> None:
    old, new = await nodes(2)
    old.handlers[Op.TASK_RESULT] = lambda args: HOLD  # parked
    async with AsyncRunstate("me", f"{old.address},{new.address}") as rs:
        result = asyncio.create_task(rs.scope("r").task("t-1").result(timeout_ms=5000))
        await eventually_true(lambda: count(old, Op.TASK_RESULT) == 1)
        old.step_down(new.address)
        view = await result
    assert view["outcome"] == 42
    waited = [args for op, args in new.requests if op == Op.TASK_RESULT]
    assert len(waited) == 1 and waited[0]["timeout_ms"] <= 5000  # for the time left
