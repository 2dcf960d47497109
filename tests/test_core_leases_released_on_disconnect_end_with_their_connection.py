"""A lease granted with ``release_on_disconnect`` ends the moment the connection it was
granted on closes, and no lease survives a restart or a takeover with that flag; every
other lease outlives its connection as before. On the pure core, with a fake clock.

The rule lives in one place (``LeaseTable.drop_connection``, leases.py): each bound
lease is handed to the owner of its kind as at expiry, so claims, pool slots and
deliveries end exactly as they do when their lease runs out, with the reason
"connection closed".
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CAROL, CoreDriver, next_rid

from rsd.core import DEFERRED, Rec
from rsproto import ErrorCode, Kind, Op, Push

ROD = {"release_on_disconnect": True}


@pytest.fixture
def core() -> CoreDriver:
    c = CoreDriver()
    c.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    c.drain()
    return c


def claim(core: CoreDriver, conn: int, rid: int | None = None, **extra: Any) -> Any:
    return core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", **extra}, conn, rid=rid)


def slot(core: CoreDriver, conn: int, rid: int | None = None, **extra: Any) -> Any:
    return core.call(Op.POOL_ACQUIRE, {"scope": "s", "pool": "gpu", **extra}, conn, rid=rid)


def receive(core: CoreDriver, conn: int, rid: int | None = None, **extra: Any) -> Any:
    reply = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs", **extra}, conn, rid=rid)
    return reply if reply is DEFERRED else reply["delivery"]


def submit(core: CoreDriver, key: str) -> str:
    args = {"scope": "s", "mailbox": "jobs", "data": key, "key": key}
    task_id: str = core.call(Op.TASK_SUBMIT, args)["id"]
    return task_id


def status(core: CoreDriver, task: str) -> dict[str, Any]:
    view: dict[str, Any] = core.call(Op.TASK_STATUS, {"scope": "s", "task": task})
    return view


def replies(messages: list[Any]) -> dict[int, Any]:
    """The deferred replies among ``messages``, by request id."""
    return {msg[1]: msg[2] for _, msg in messages if msg[0] == Kind.REPLY}


def losses(messages: list[Any]) -> list[tuple[int, bytes, str]]:
    return [
        (conn, msg[2]["lease"], msg[2]["reason"]) for conn, msg in messages
        if msg[0] == Kind.PUSH and msg[1] == Push.LEASE_LOST
    ]


def ended(core: CoreDriver) -> list[tuple[Any, ...]]:
    return [
        tuple(rec) for rec in core.records
        if rec[0] in (Rec.LEASE_ENDED, Rec.POOL_ENDED, Rec.REQUEUED)
    ]


# ---- claims --------------------------------------------------------------------------------


def test_a_claim_bound_to_its_connection_goes_to_its_waiter_the_moment_it_closes(
    core: CoreDriver,
) -> None:
    lease = claim(core, ALICE, **ROD)["lease"]
    rid = next_rid()
    assert claim(core, BOB, rid, wait=True) is DEFERRED
    core.drain()
    core.disconnected(ALICE, 1.0)
    messages = core.drain()
    grant = replies(messages)[rid]
    assert grant["generation"] == 2 and grant["lease"] != lease
    assert losses(messages) == [(ALICE, lease, "connection closed")]
    assert (Rec.LEASE_ENDED, lease, "connection closed") in ended(core)
    view = core.call(Op.CLAIM_INSPECT, {"scope": "s", "key": "k"}, BOB)
    assert view["holder"] == "bob"


def test_a_claim_not_bound_outlives_its_connection(core: CoreDriver) -> None:
    lease = claim(core, ALICE)["lease"]
    core.disconnected(ALICE, 1.0)
    core.drain()
    assert ended(core) == []
    core.connected(ALICE, "alice")
    renewed = core.call(Op.LEASE_RENEW, {"leases": [lease]}, ALICE)
    assert renewed is not None
    assert core.call(Op.CLAIM_INSPECT, {"scope": "s", "key": "k"}, BOB)["holder"] == "alice"


def test_only_the_closing_connections_bound_leases_end(core: CoreDriver) -> None:
    mine = claim(core, ALICE, key="a", **ROD)["lease"]
    claim(core, ALICE, key="b")  # not bound: stays
    claim(core, BOB, key="c", **ROD)  # bound to another connection: stays
    core.drain()
    core.disconnected(ALICE, 1.0)
    core.drain()
    assert ended(core) == [(Rec.LEASE_ENDED, mine, "connection closed")]
    held = {
        key: core.call(Op.CLAIM_INSPECT, {"scope": "s", "key": key}, CAROL)["held"]
        for key in "abc"
    }
    assert held == {"a": False, "b": True, "c": True}


def test_a_bound_claims_fencing_token_is_refused_once_its_connection_closed(
    core: CoreDriver,
) -> None:
    lease = claim(core, ALICE, **ROD)["lease"]
    core.disconnected(ALICE, 1.0)
    core.connected(ALICE, "alice")
    fence = core.call(Op.FENCE_CHECK, {"scope": "s", "key": "k", "token": lease}, BOB)
    assert fence["current"] is False
    refusal = core.refused(Op.CLAIM_RELEASE, {"lease": lease}, ALICE)
    assert refusal.code == ErrorCode.STALE_CLAIM
    assert core.call(Op.LEASE_RENEW, {"leases": [lease]}, ALICE)["results"][0] is not None


def test_a_waiter_granted_with_the_flag_is_bound_to_its_own_connection(
    core: CoreDriver,
) -> None:
    first = claim(core, ALICE)["lease"]
    rid = next_rid()
    claim(core, BOB, rid, wait=True, **ROD)
    core.call(Op.CLAIM_RELEASE, {"lease": first}, ALICE)
    granted = replies(core.drain())[rid]["lease"]
    core.disconnected(ALICE, 1.0)  # not its connection: nothing ends
    core.drain()
    assert core.call(Op.CLAIM_INSPECT, {"scope": "s", "key": "k"}, CAROL)["holder"] == "bob"
    core.disconnected(BOB, 2.0)
    core.drain()
    assert (Rec.LEASE_ENDED, granted, "connection closed") in ended(core)


def test_a_closing_connections_own_waits_are_not_granted_what_it_frees(
    core: CoreDriver,
) -> None:
    claim(core, ALICE, key="a", **ROD)
    claim(core, BOB, key="b", **ROD)
    rid = next_rid()
    claim(core, ALICE, rid, key="b", wait=True)  # alice waits for bob's key
    core.drain()
    core.disconnected(ALICE, 1.0)
    core.disconnected(BOB, 1.0)
    assert rid not in replies(core.drain())
    assert core.call(Op.CLAIM_INSPECT, {"scope": "s", "key": "b"}, CAROL)["held"] is False


# ---- pool slots ----------------------------------------------------------------------------


def test_a_slot_bound_to_its_connection_goes_to_the_pools_waiter_when_it_closes(
    core: CoreDriver,
) -> None:
    lease = slot(core, ALICE, **ROD)["lease"]
    rid = next_rid()
    assert slot(core, BOB, rid, wait=True) is DEFERRED
    core.drain()
    core.disconnected(ALICE, 1.0)
    messages = core.drain()
    assert rid in replies(messages)
    assert (Rec.POOL_ENDED, lease, "connection closed") in ended(core)
    refusal = core.refused(Op.POOL_RELEASE, {"lease": lease}, CAROL)
    assert refusal.code == ErrorCode.STALE_CLAIM


def test_a_slot_not_bound_outlives_its_connection(core: CoreDriver) -> None:
    slot(core, ALICE)
    core.disconnected(ALICE, 1.0)
    core.drain()
    assert ended(core) == []
    assert core.call(Op.POOL_INSPECT, {"name": "gpu"}, BOB)["held"] == 1


# ---- deliveries ----------------------------------------------------------------------------


def test_a_bound_delivery_is_requeued_and_goes_to_a_parked_consumer_when_it_closes(
    core: CoreDriver,
) -> None:
    task = submit(core, "t")
    delivery = receive(core, ALICE, **ROD)
    rid = next_rid()
    assert receive(core, BOB, rid, wait=True) is DEFERRED
    core.drain()
    core.disconnected(ALICE, 1.0)
    again = replies(core.drain())[rid]["delivery"]
    assert again["id"] == task and again["attempt"] == 2
    requeued = [rec for rec in ended(core) if rec[0] == Rec.REQUEUED]
    assert [(rec[2], rec[3]) for rec in requeued] == [(delivery["lease"], "lease_expired")]
    assert requeued[0][5] == "lease ended with its connection"
    refusal = core.refused(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]}, CAROL)
    assert refusal.code == ErrorCode.STALE_CLAIM


def test_a_settlement_received_before_the_close_is_applied_and_stands(
    core: CoreDriver,
) -> None:
    done, running = submit(core, "done"), submit(core, "running")
    first = receive(core, ALICE, **ROD)
    receive(core, ALICE, **ROD)
    core.call(Op.DELIVERY_COMPLETE, {"lease": first["lease"], "outcome": 1}, ALICE)
    core.disconnected(ALICE, 1.0)
    core.drain()
    assert status(core, done)["state"] == "SUCCEEDED"
    assert status(core, running)["state"] == "PENDING"


def test_deliveries_taken_by_a_batched_receive_or_a_settlements_next_are_bound_too(
    core: CoreDriver,
) -> None:
    for key in "abc":
        submit(core, key)
    batch = core.call(
        Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "max": 2, **ROD}, ALICE
    )["deliveries"]
    reply = core.call(
        Op.DELIVERY_COMPLETE,
        {"lease": batch[0]["lease"], "next": {"lease_seconds": 30, "max": 1, **ROD}},
        ALICE,
    )
    [taken] = reply["next"]
    core.disconnected(ALICE, 1.0)
    core.drain()
    requeued = {rec[2] for rec in ended(core) if rec[0] == Rec.REQUEUED}
    assert requeued == {batch[1]["lease"], taken["lease"]}


def test_a_delivery_not_bound_outlives_its_connection(core: CoreDriver) -> None:
    task = submit(core, "t")
    receive(core, ALICE)
    core.disconnected(ALICE, 1.0)
    core.drain()
    assert status(core, task)["state"] == "RUNNING"


# ---- restarts and takeovers ----------------------------------------------------------------


def _hold_one_of_each(core: CoreDriver, bound: bool) -> dict[str, bytes]:
    extra = ROD if bound else {}
    submit(core, "t")
    held = {
        "claim": claim(core, ALICE, **extra)["lease"],
        "slot": slot(core, ALICE, **extra)["lease"],
        "delivery": receive(core, ALICE, **extra)["lease"],
    }
    core.drain()
    return held


@pytest.mark.parametrize("source", ["journal", "snapshot"])
@pytest.mark.parametrize("start", ["restart", "takeover"])
def test_a_bound_lease_does_not_survive_a_restart_or_takeover_and_a_plain_one_does(
    core: CoreDriver, source: str, start: str
) -> None:
    bound = _hold_one_of_each(core, bound=True)
    other = CoreDriver()  # the same three, not bound, in a core of their own
    other.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    plain = _hold_one_of_each(other, bound=False)
    for original, held, survives in ((core, bound, False), (other, plain, True)):
        rebuilt = (
            original.replay() if source == "journal"
            else original.replay(list(original.snapshot()))
        )
        if start == "restart":
            rebuilt.recovered(10.0, clean=True)
        else:
            rebuilt.promoted(10.0)
        rebuilt.connected(CAROL, "carol")
        rebuilt.drain()
        live = {kind: rebuilt.leases.get(handle) is not None for kind, handle in held.items()}
        assert live == dict.fromkeys(held, survives)
        if not survives:  # ended by records, as on the live server
            kinds = {rec[0] for rec in rebuilt.records}
            assert {Rec.LEASE_ENDED, Rec.POOL_ENDED, Rec.REQUEUED} <= kinds
            assert rebuilt.call(Op.CLAIM_INSPECT, {"scope": "s", "key": "k"}, CAROL)[
                "held"
            ] is False
            assert not rebuilt.leases.bound


def test_the_flag_is_recorded_in_the_grant_records(core: CoreDriver) -> None:
    _hold_one_of_each(core, bound=True)
    grants = [
        rec for rec in core.records
        if rec[0] in (Rec.CLAIM_GRANTED, Rec.POOL_GRANTED, Rec.DELIVERED)
    ]
    assert [rec.release_on_disconnect for rec in grants] == [True, True, True]


# ---- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["yes", 1, 0, [], {}])
@pytest.mark.parametrize("op", ["claim", "slot", "receive", "next"])
def test_release_on_disconnect_must_be_a_boolean(
    core: CoreDriver, op: str, value: Any
) -> None:
    args: dict[str, Any]
    if op == "claim":
        code, args = Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"}
    elif op == "slot":
        code, args = Op.POOL_ACQUIRE, {"scope": "s", "pool": "gpu"}
    elif op == "receive":
        code, args = Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}
    else:
        submit(core, "t")
        lease = receive(core, ALICE)["lease"]
        code, args = Op.DELIVERY_COMPLETE, {"lease": lease, "next": {"lease_seconds": 30}}
    target = args["next"] if op == "next" else args
    target["release_on_disconnect"] = value
    refusal = core.refused(code, args, ALICE)
    assert refusal.code == ErrorCode.INVALID_ARGUMENT
    assert "release_on_disconnect must be a boolean" in refusal.message


# ---- what the admin listings show ------------------------------------------------------------


def test_listings_show_which_leases_end_with_their_connection(core: CoreDriver) -> None:
    claim(core, ALICE, key="bound", **ROD)
    claim(core, ALICE, key="plain")
    slot(core, ALICE, **ROD)
    task = submit(core, "t")
    receive(core, ALICE, **ROD)
    listed = core.call(Op.ADMIN_CLAIMS, {"scope": "s"}, ALICE)["claims"]
    assert {row["key"]: row["release_on_disconnect"] for row in listed} == {
        "bound": True, "plain": False,
    }
    [row] = core.call(Op.POOL_INSPECT, {"name": "gpu"}, ALICE)["holders"]
    assert row["release_on_disconnect"] is True
    view = core.call(Op.ADMIN_TASK, {"scope": "s", "task": task}, ALICE)
    assert view["delivery"]["release_on_disconnect"] is True
