"""A task whose needs are homed on another shard runs only under a grant of that shard
(rsd/core/work/grants.py), in the pure core on a fake clock: the ask is made once, with
the next grant number; the grant is journaled before the delivery; the grant ends with
the delivery, however it ends; a lapsed grant ends the delivery as a lost lease does; a
replay (a restart, a standby taking over) holds the same grants and asks with the same
keys; needs of this shard and another are refused together.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import BOB, CoreDriver, next_rid

from rsd.core import DEFERRED
from rsd.core.records import Rec
from rsproto import ErrorCode, Kind, Op, Push

GRANT = b"G" * 16  # a lease handle of the pool's shard
NEEDS = {"pools": ["gpu@b"], "quotas": {"tokens@b": 3}}


def homed_here(name: str) -> bool:
    """This shard's slots hold every name but those ending ``@b`` (the other shard's)."""
    return not name.endswith("@b")


def sharded(core: CoreDriver) -> CoreDriver:
    core.tables.homes_run = homed_here
    return core


@pytest.fixture
def core() -> CoreDriver:
    core = sharded(CoreDriver())
    core.call(Op.POOL_ENSURE, {"name": "cpu", "size": 1})
    core.drain()
    return core


def submit(core: CoreDriver, needs: Any = NEEDS, **extra: Any) -> dict[str, Any]:
    return core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "needs": needs,
                                      "data": None, **extra})


def receive(core: CoreDriver, conn: int = BOB, **extra: Any) -> Any:
    reply = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs", **extra}, conn)
    return reply if reply is DEFERRED else reply["delivery"]


def asks(core: CoreDriver) -> list[tuple[str, int, tuple[str, ...], tuple[Any, ...]]]:
    return [(a.item_id, a.seq, a.pools, a.quotas) for a in core.blocked.grants.take_asks()]


def kinds(core: CoreDriver) -> list[int]:
    core.drain()
    return [rec[0] for rec in core.records]


def test_a_task_needing_another_shards_capacity_is_asked_for_once_and_not_delivered() -> None:
    core = sharded(CoreDriver())
    task = submit(core)
    assert receive(core) is None
    assert receive(core) is None  # asked already: not asked again
    assert asks(core) == [(task["id"], 1, ("gpu@b",), (("tokens@b", 3),))]
    status = core.call(Op.TASK_STATUS, {"scope": "s", "task": task["id"]})
    assert status["state"] == "PENDING"
    assert status["waiting_for"] == {"pools": ["gpu@b"], "quotas": {"tokens@b": 3}}


def test_the_grant_is_journaled_before_the_delivery_it_allows(core: CoreDriver) -> None:
    task = submit(core)
    rid = next_rid()
    assert core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True,
                                  "timeout_ms": 60_000}, BOB, rid=rid) is DEFERRED
    assert asks(core)[0][:2] == (task["id"], 1)
    assert core.grant_held(core.now, task["id"], 1, GRANT, 10.0)
    messages = core.drain()
    delivery = next(body[2]["delivery"] for _, body in messages if body[0] == Kind.REPLY
                and body[1] == rid)
    assert delivery["id"] == task["id"]
    order = [rec[0] for rec in core.records]
    assert order.index(Rec.GRANT_HELD) < order.index(Rec.DELIVERED)
    assert core.blocked.grants.held[task["id"]].handle == GRANT


def test_a_stale_or_repeated_answer_is_refused_so_the_shell_releases_it(core: CoreDriver) -> None:
    task = submit(core)
    receive(core)
    assert not core.grant_held(core.now, task["id"], 2, GRANT, 10.0)  # not the ask's number
    assert core.grant_held(core.now, task["id"], 1, GRANT, 10.0)
    assert not core.grant_held(core.now, task["id"], 1, b"H" * 16, 10.0)  # answered already
    assert not core.grant_held(core.now, "t-404", 1, GRANT, 10.0)
    assert kinds(core).count(Rec.GRANT_HELD) == 1


def test_the_grant_ends_with_its_delivery_and_the_next_delivery_asks_a_new_one(
    core: CoreDriver,
) -> None:
    task = submit(core)
    receive(core)
    asks(core)
    core.grant_held(core.now, task["id"], 1, GRANT, 10.0)
    delivery = receive(core)
    assert delivery["id"] == task["id"]
    changes = core.blocked.grants.changes
    core.call(Op.DELIVERY_RETRY, {"lease": delivery["lease"], "delay_ms": 0}, BOB)
    assert task["id"] not in core.blocked.grants.held
    assert core.blocked.grants.changes > changes  # the shell sees it and releases it
    core.advance(1.0)
    assert receive(core) is None
    assert asks(core) == [(task["id"], 2, ("gpu@b",), (("tokens@b", 3),))]
    core.grant_held(core.now, task["id"], 2, b"H" * 16, 10.0)
    second = receive(core)
    core.call(Op.DELIVERY_COMPLETE, {"lease": second["lease"], "outcome": 1}, BOB)
    grants = core.blocked.grants
    assert not grants.held and not grants.seqs and not grants.asking


def test_a_lapsed_grant_ends_its_delivery_as_a_lost_lease_does(core: CoreDriver) -> None:
    task = submit(core)
    receive(core)
    asks(core)
    core.grant_held(core.now, task["id"], 1, GRANT, 10.0)
    delivery = receive(core)
    core.drain()
    core.grant_lapsed(core.now, GRANT)
    pushes = [body for _, body in core.drain() if body[0] == Kind.PUSH]
    assert pushes == [[Kind.PUSH, Push.LEASE_LOST,
                       {"lease": delivery["lease"], "reason": "grant lapsed"}]]
    status = core.call(Op.TASK_STATUS, {"scope": "s", "task": task["id"]})
    assert status["state"] == "PENDING" and status["attempt"] == 1
    assert "grant from another shard lapsed" in status["reason"]
    error = core.refused(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": 1}, BOB)
    assert error.code is ErrorCode.STALE_CLAIM
    assert receive(core) is None
    assert asks(core) == [(task["id"], 2, ("gpu@b",), (("tokens@b", 3),))]


def test_a_grant_that_lapses_before_its_delivery_is_asked_for_again(core: CoreDriver) -> None:
    task = submit(core)
    receive(core)
    asks(core)
    core.grant_held(core.now, task["id"], 1, GRANT, 10.0)
    core.grant_lapsed(core.now, GRANT)
    assert Rec.GRANT_ENDED in kinds(core)
    assert receive(core) is None
    assert asks(core) == [(task["id"], 2, ("gpu@b",), (("tokens@b", 3),))]
    core.grant_lapsed(core.now, b"X" * 16)  # no item holds it: nothing happens


def test_a_cancelled_task_gives_up_its_grant_and_its_ask(core: CoreDriver) -> None:
    held, asking = submit(core), submit(core)
    receive(core)
    receive(core)
    asks(core)
    core.grant_held(core.now, held["id"], 1, GRANT, 10.0)
    changes = core.blocked.grants.changes
    assert asking["id"] in core.blocked.grants.asking
    core.call(Op.SCOPE_CANCEL, {"scope": "s"})
    core.advance(1.0)
    grants = core.blocked.grants
    assert not grants.held and not grants.seqs and not grants.asking
    assert grants.changes >= changes + 2  # the shell releases one, cancels the other's ask


def test_a_replay_holds_the_same_grants_and_asks_with_the_same_numbers(core: CoreDriver) -> None:
    held, waiting = submit(core), submit(core)
    receive(core)
    receive(core)
    asks(core)
    core.grant_held(core.now, held["id"], 1, GRANT, 10.0)
    core.drain()
    for rebuilt in (core.replay(), core.replay(list(core.snapshot()))):
        sharded(rebuilt)
        grants = rebuilt.blocked.grants
        assert grants.held[held["id"]].handle == GRANT and grants.seqs == {held["id"]: 1}
        rebuilt.promoted(rebuilt.now)
        delivery = receive(rebuilt)
        assert delivery["id"] == held["id"]  # its grant replayed: delivered at once
        assert receive(rebuilt) is None
        assert asks(rebuilt) == [(waiting["id"], 1, ("gpu@b",), (("tokens@b", 3),))]


def test_needs_of_this_shard_and_another_together_are_refused(core: CoreDriver) -> None:
    error = core.refused(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": None, "needs": {
        "pools": ["cpu", "gpu@b"]}})
    assert error.code is ErrorCode.INVALID_ARGUMENT and "{tag}" in error.message


def test_a_pool_of_another_shard_that_this_shard_still_holds_is_refused() -> None:
    core = CoreDriver()
    core.call(Op.POOL_ENSURE, {"name": "gpu@b", "size": 1})
    sharded(core)
    error = core.refused(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": None, "needs": {
        "pools": ["gpu@b"]}})
    assert error.code is ErrorCode.INVALID_ARGUMENT and "still holds" in error.message


def test_needs_of_this_shard_are_taken_here_as_before(core: CoreDriver) -> None:
    task = submit(core, {"pools": ["cpu"]})
    delivery = receive(core)
    assert delivery["id"] == task["id"] and asks(core) == []
    assert core.call(Op.POOL_INSPECT, {"name": "cpu"})["held"] == 1


def test_a_new_primary_takes_a_grant_its_old_primary_asked_for_before_it_asks(
    core: CoreDriver,
) -> None:
    task = submit(core)
    receive(core)
    asks(core)
    core.drain()
    rebuilt = sharded(core.replay())  # the ask was not journaled: nobody asks here yet
    rebuilt.promoted(rebuilt.now)
    assert rebuilt.grant_held(rebuilt.now, task["id"], 1, GRANT, 10.0)
    delivery = receive(rebuilt)
    assert delivery["id"] == task["id"] and asks(rebuilt) == []


def test_an_ask_its_shard_had_already_and_never_grants_is_abandoned_for_the_next(
    core: CoreDriver,
) -> None:
    task = submit(core)
    receive(core)
    asks(core)
    assert not core.grant_abandoned(core.now, task["id"], 2)  # not the ask
    assert core.grant_abandoned(core.now, task["id"], 1)
    assert asks(core) == [(task["id"], 2, ("gpu@b",), (("tokens@b", 3),))]
    assert not core.grant_held(core.now, task["id"], 1, GRANT, 10.0)  # never taken now
    core.drain()
    rebuilt = sharded(core.replay())
    assert rebuilt.blocked.grants.seqs == {task["id"]: 1}  # replayed: asks for 2 next
