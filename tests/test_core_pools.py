"""Concurrency pools in the pure core, on a fake clock (support/core.py's CoreDriver).

Each test is named after the rule it protects: slot accounting under expiry and resize,
FIFO waiters, fencing of releases, generations, withdrawn waits, recovery and bounds.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from support.core import ALICE, BOB, CAROL, DAVE, CoreDriver, next_rid

from rsd.core import DEFERRED, Rec
from rsd.policy import Policy
from rsproto import ErrorCode, Kind, Limits, Op, Push

# The runs these tests name, created by the driver at setup (SCOPE_CREATE, chosen ids).
RUNS = ("s", "r", "run-1", "run-a", "run-b", "run-x")


@pytest.fixture
def core() -> CoreDriver:
    core = CoreDriver(mailbox=None, runs=RUNS)
    ensure(core, "gpu", 2)
    core.drain()
    return core


def ensure(core: CoreDriver, name: str, size: int, conn: int = ALICE) -> dict[str, Any]:
    return core.call(Op.POOL_ENSURE, {"name": name, "size": size}, conn)


def acquire(
    core: CoreDriver, conn: int = ALICE, pool: str = "gpu", scope: str = "run-1",
    rid: int | None = None, **extra: Any,
) -> Any:
    args = {"scope": scope, "pool": pool, **extra}
    return core.call(Op.POOL_ACQUIRE, args, conn, rid=rid)


def release(core: CoreDriver, lease: Any, conn: int = ALICE) -> Any:
    return core.call(Op.POOL_RELEASE, {"lease": lease}, conn)


def inspect(core: CoreDriver, name: str = "gpu", **extra: Any) -> dict[str, Any]:
    return core.call(Op.POOL_INSPECT, {"name": name, **extra})


def grants(messages: list[Any]) -> dict[int, dict[str, Any]]:
    """Deferred grant replies by request id."""
    return {
        body[1]: body[2] for _, body in messages if body[0] == Kind.REPLY and "lease" in body[2]
    }


def renew(core: CoreDriver, lease: Any, conn: int = ALICE) -> Any:
    return core.call(Op.LEASE_RENEW, {"leases": [lease]}, conn)["results"][0]


# ---- slot accounting ---------------------------------------------------------------------


def test_a_pool_grants_up_to_its_size_then_refuses_with_pool_full(core: CoreDriver) -> None:
    first = acquire(core, ALICE)
    second = acquire(core, BOB)
    assert first["generation"] < second["generation"]
    assert set(first) == {"lease", "generation", "lease_seconds", "waited_ms"}
    err = core.refused(Op.POOL_ACQUIRE, {"scope": "run-1", "pool": "gpu"}, CAROL)
    assert err.code == ErrorCode.POOL_FULL
    assert err.details == {"size": 2, "held": 2, "waiters": 0}
    assert inspect(core)["held"] == 2


def test_a_released_slot_goes_to_the_first_waiter_in_arrival_order(core: CoreDriver) -> None:
    held = [acquire(core, ALICE), acquire(core, BOB)]
    rids = [next_rid() for _ in range(3)]
    for conn, rid in zip((CAROL, DAVE, CAROL), rids, strict=True):
        assert acquire(core, conn, rid=rid, wait=True) is DEFERRED
    core.drain()
    core.now = 1.5
    assert release(core, held[0]["lease"]) == {}
    got = grants(core.drain())
    assert list(got) == [rids[0]]
    assert got[rids[0]]["waited_ms"] == 1500
    release(core, held[1]["lease"], BOB)
    assert list(grants(core.drain())) == [rids[1]]
    assert inspect(core)["waiters"] == 1


def test_a_non_waiting_acquire_never_passes_waiters(core: CoreDriver) -> None:
    held = acquire(core, ALICE)
    acquire(core, BOB)
    rid = next_rid()
    acquire(core, CAROL, rid=rid, wait=True)
    release(core, held["lease"])
    assert list(grants(core.drain())) == [rid]
    err = core.refused(Op.POOL_ACQUIRE, {"scope": "run-1", "pool": "gpu"}, DAVE)
    assert err.code == ErrorCode.POOL_FULL


def test_an_expired_holder_loses_its_slot_with_lease_lost_and_the_waiter_gets_it(
    core: CoreDriver,
) -> None:
    doomed = acquire(core, ALICE, lease_seconds=5)
    acquire(core, BOB, lease_seconds=60)
    rid = next_rid()
    acquire(core, CAROL, rid=rid, wait=True)
    core.drain()
    core.advance(4.9)
    assert core.drain() == []
    core.advance(0.2)
    messages = core.drain()
    assert (ALICE, [Kind.PUSH, Push.LEASE_LOST, {"lease": doomed["lease"], "reason": "expired"}]) \
        in messages
    assert list(grants(messages)) == [rid]
    assert inspect(core)["held"] == 2
    assert renew(core, doomed["lease"]) == ErrorCode.STALE_CLAIM


def test_a_renewed_slot_outlives_its_first_lease(core: CoreDriver) -> None:
    lease = acquire(core, ALICE, lease_seconds=5)["lease"]
    for _ in range(4):
        core.advance(4.0)
        assert renew(core, lease) is None
    assert core.drain() == []
    assert inspect(core)["held"] == 1


def test_shrinking_a_pool_revokes_no_slot_and_grants_only_below_the_new_size(
    core: CoreDriver,
) -> None:
    ensure(core, "gpu", 3)
    held = [acquire(core, conn) for conn in (ALICE, BOB, CAROL)]
    view = ensure(core, "gpu", 1)
    assert (view["size"], view["held"], view["created"]) == (1, 3, False)
    for lease in held:
        assert renew(core, lease["lease"]) is None  # nothing revoked
    rid = next_rid()
    acquire(core, DAVE, rid=rid, wait=True)
    release(core, held[0]["lease"])
    release(core, held[1]["lease"], BOB)
    assert grants(core.drain()) == {}  # still 1 held: the size
    release(core, held[2]["lease"], CAROL)
    assert list(grants(core.drain())) == [rid]
    assert inspect(core)["held"] == 1


def test_growing_a_pool_grants_waiters_at_once(core: CoreDriver) -> None:
    acquire(core, ALICE)
    acquire(core, BOB)
    rids = [next_rid() for _ in range(3)]
    for rid in rids:
        acquire(core, CAROL, rid=rid, wait=True)
    core.drain()
    ensure(core, "gpu", 4)
    assert list(grants(core.drain())) == rids[:2]
    assert inspect(core)["waiters"] == 1


def test_ensure_with_the_same_size_writes_no_record(core: CoreDriver) -> None:
    view = ensure(core, "gpu", 2)
    assert view == {"name": "gpu", "size": 2, "held": 0, "waiters": 0, "created": False}
    core.drain()
    assert [rec for rec in core.records if rec[0] == Rec.POOL_ENSURED] == [
        (Rec.POOL_ENSURED, "default", "gpu", 2)
    ]


# ---- fencing and generations -------------------------------------------------------------


def test_release_needs_the_live_slot_lease_else_stale_claim(core: CoreDriver) -> None:
    lease = acquire(core, ALICE)["lease"]
    release(core, lease)
    assert core.refused(Op.POOL_RELEASE, {"lease": lease}).code == ErrorCode.STALE_CLAIM
    made_up = (999_999).to_bytes(8, "big") + bytes(8)
    assert core.refused(Op.POOL_RELEASE, {"lease": made_up}).code == ErrorCode.STALE_CLAIM
    claim = core.call(Op.CLAIM_ACQUIRE, {"scope": "run-1", "key": "k"})["lease"]
    assert core.refused(Op.POOL_RELEASE, {"lease": claim}).code == ErrorCode.STALE_CLAIM
    slot = acquire(core, ALICE)["lease"]
    assert core.refused(Op.CLAIM_RELEASE, {"lease": slot}).code == ErrorCode.STALE_CLAIM


def test_slot_generations_grow_with_every_grant_across_restarts_and_crashes(
    core: CoreDriver,
) -> None:
    seen = []
    for _ in range(3):
        got = acquire(core, ALICE)
        seen.append(got["generation"])
        release(core, got["lease"])
    core.drain()
    clean = core.replay()
    clean.recovered(core.now, clean=True)
    seen.append(acquire(clean, ALICE)["generation"])
    clean.drain()
    lost = acquire(core, ALICE)["generation"]  # a grant whose record a crash lost
    core.effects.take_records()
    crashed = core.replay()
    crashed.recovered(core.now, clean=False)
    seen.append(acquire(crashed, ALICE)["generation"])
    assert seen[:4] == sorted(set(seen[:4]))  # strictly growing, across a clean restart
    assert seen[4] > lost > max(seen[:3])  # after a crash: above the grant it lost


# ---- waits -------------------------------------------------------------------------------


def test_a_cancelled_wait_is_withdrawn_and_never_granted(core: CoreDriver) -> None:
    held = acquire(core, ALICE)
    acquire(core, BOB)
    rid = next_rid()
    acquire(core, CAROL, rid=rid, wait=True)
    assert core.call(Op.CANCEL, {"request": rid}, CAROL) == {"cancelled": True}
    messages = core.drain()
    assert (CAROL, [Kind.ERROR, rid, "CANCELLED", "the wait was cancelled by the client",
                    None]) in messages
    assert inspect(core)["waiters"] == 0
    release(core, held["lease"])
    assert grants(core.drain()) == {}
    assert inspect(core)["held"] == 1


def test_a_wait_times_out_and_a_closed_connection_drops_its_waits(core: CoreDriver) -> None:
    acquire(core, ALICE)
    held = acquire(core, BOB)
    rid = next_rid()
    acquire(core, CAROL, rid=rid, wait=True, timeout_ms=1000)
    acquire(core, DAVE, wait=True)
    core.drain()
    core.advance(1.01)
    messages = core.drain()
    assert next(m for m in messages if m[1][0] == Kind.ERROR)[1][2] == "WAIT_TIMEOUT"
    core.disconnected(DAVE)
    assert inspect(core)["waiters"] == 0
    assert core.waits.total() == 0
    release(core, held["lease"], BOB)
    assert grants(core.drain()) == {}


# ---- inspect -----------------------------------------------------------------------------


def test_inspect_lists_holders_with_run_generation_and_expiry_up_to_its_limit(
    core: CoreDriver,
) -> None:
    first = acquire(core, ALICE, scope="run-a", lease_seconds=10)
    acquire(core, BOB, scope="run-b")
    acquire(core, CAROL, wait=True)
    view = inspect(core)
    assert (view["size"], view["held"], view["waiters"]) == (2, 2, 1)
    assert view["holders"][0] == {
        "holder": "alice", "run": "run-a", "generation": first["generation"],
        "expires_at": core.wall(core.now + 10), "release_on_disconnect": False,
    }
    assert [h["run"] for h in view["holders"]] == ["run-a", "run-b"]
    assert len(inspect(core, limit=1)["holders"]) == 1
    err = core.refused(Op.POOL_INSPECT, {"name": "gpu", "limit": Limits.MAX_POOL_INSPECT_HOLDERS
                                         + 1})
    assert err.code == ErrorCode.INVALID_ARGUMENT


def test_unknown_pools_are_not_found(core: CoreDriver) -> None:
    for op, args in (
        (Op.POOL_ACQUIRE, {"scope": "s", "pool": "tpu"}),
        (Op.POOL_INSPECT, {"name": "tpu"}),
    ):
        err = core.refused(op, args)
        assert err.code == ErrorCode.NOT_FOUND
        assert "tpu" in err.message


def test_a_cancelled_run_cannot_acquire(core: CoreDriver) -> None:
    core.call(Op.SCOPE_CANCEL, {"scope": "run-x"})
    err = core.refused(Op.POOL_ACQUIRE, {"scope": "run-x", "pool": "gpu"})
    assert err.code == ErrorCode.SCOPE_CANCELLED


# ---- recovery ----------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["journal", "snapshot"])
def test_holders_survive_recovery_and_expire_one_lease_after_it(
    core: CoreDriver, source: str
) -> None:
    ensure(core, "gpu", 3)
    held = [acquire(core, conn, lease_seconds=5) for conn in (ALICE, BOB)]
    release(core, held[0]["lease"])
    third = acquire(core, CAROL, lease_seconds=5)
    core.drain()
    core.now = 100.0  # the server was down meanwhile
    rebuilt = core.replay() if source == "journal" else core.replay(list(core.snapshot()))
    rebuilt.now = core.now
    rebuilt.recovered(core.now, clean=True)
    for conn, holder in ((ALICE, "alice"), (BOB, "bob"), (DAVE, "dave")):
        rebuilt.connected(conn, holder)
    view = inspect(rebuilt)
    assert (view["size"], view["held"]) == (3, 2)
    assert [h["holder"] for h in view["holders"]] == ["bob", "carol"]
    assert renew(rebuilt, held[1]["lease"], BOB) is None
    assert acquire(rebuilt, DAVE)["generation"] > third["generation"]
    rid = next_rid()
    acquire(rebuilt, ALICE, rid=rid, wait=True)
    rebuilt.drain()
    rebuilt.advance(5.01)  # carol never renewed after the restart: one lease, then gone
    assert list(grants(rebuilt.drain())) == [rid]


# ---- bounds ------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, -1, Limits.MAX_POOL_SIZE + 1, 1.5, True, None, "2"])
def test_pool_size_must_be_an_integer_in_range(core: CoreDriver, size: Any) -> None:
    err = core.refused(Op.POOL_ENSURE, {"name": "p", "size": size})
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert "size" in err.message


def test_a_tenant_has_at_most_max_pools_per_tenant(
    core: CoreDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Limits, "MAX_POOLS_PER_TENANT", 3)
    ensure(core, "b", 1)
    ensure(core, "c", 1)
    err = core.refused(Op.POOL_ENSURE, {"name": "d", "size": 1})
    assert err.code == ErrorCode.RESOURCE_EXHAUSTED
    assert "3 pools" in err.message
    assert ensure(core, "c", 5)["size"] == 5  # resizing an existing one is fine


def test_a_pool_has_at_most_max_waiters_per_pool(
    core: CoreDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Limits, "MAX_WAITERS_PER_POOL", 2)
    acquire(core, ALICE)
    acquire(core, ALICE)
    acquire(core, BOB, wait=True)
    acquire(core, BOB, wait=True)
    err = core.refused(Op.POOL_ACQUIRE, {"scope": "s", "pool": "gpu", "wait": True}, CAROL)
    assert err.code == ErrorCode.RESOURCE_EXHAUSTED
    assert "2 waiters" in err.message


def test_a_connection_has_at_most_max_waits_per_connection_for_pools_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Policy, "MAX_WAITS_PER_CONNECTION", 2)
    core = CoreDriver(mailbox=None, runs=RUNS)
    ensure(core, "gpu", 1)
    acquire(core, ALICE)
    acquire(core, BOB, wait=True)
    acquire(core, BOB, wait=True)
    err = core.refused(Op.POOL_ACQUIRE, {"scope": "s", "pool": "gpu", "wait": True}, BOB)
    assert err.code == ErrorCode.RESOURCE_EXHAUSTED
    assert inspect(core)["waiters"] == 2


def test_a_long_line_of_cancelled_waits_costs_no_walk(core: CoreDriver) -> None:
    """Cancelling waits one by one from the front leaves nothing behind, each in O(1)."""
    acquire(core, ALICE)
    held = acquire(core, ALICE)
    rids = [next_rid() for _ in range(2000)]
    for rid in rids:
        acquire(core, BOB, rid=rid, wait=True)
    for rid in rids[:-1]:
        core.call(Op.CANCEL, {"request": rid}, BOB)
    core.drain()
    assert inspect(core)["waiters"] == 1
    release(core, held["lease"])
    assert list(grants(core.drain())) == [rids[-1]]
    assert core.waits.total() == 0


# ---- taking capacity all at once (for work that needs it) --------------------------------


def test_try_take_all_takes_every_slot_and_amount_or_nothing(core: CoreDriver) -> None:
    from rsd.core.ground.leases import new_handle
    from rsd.core.holds.capacity import detach, try_take_all

    ensure(core, "tpu", 1)
    core.call(Op.QUOTA_ENSURE, {"name": "api", "limit": 5, "per_seconds": 5})
    owner = SimpleNamespace(tenant="default")  # another kind of lease's owner (a delivery)
    holder = core.leases.add(
        new_handle(core.leases.ids.top, bytes(8)), owner, "worker", ALICE, 30, core.now
    )
    assert not try_take_all(core.now, core.pools, core.quotas, "default", ["gpu", "tpu"],
                            {"api": 6}, holder)
    acquire(core, BOB, pool="tpu")
    assert not try_take_all(core.now, core.pools, core.quotas, "default", ["gpu", "tpu"],
                            {"api": 2}, holder)
    assert inspect(core)["held"] == 0  # nothing taken from gpu
    assert core.call(Op.QUOTA_INSPECT, {"name": "api"})["level"] == 5  # nor from api
    assert try_take_all(core.now, core.pools, core.quotas, "default", ["gpu", "gpu"],
                        {"api": 2}, holder)
    assert inspect(core)["held"] == 1
    assert core.call(Op.QUOTA_INSPECT, {"name": "api"})["level"] == 3
    detach(core.pools.pools[("default", "gpu")], holder.handle)
    assert inspect(core)["held"] == 0
