"""A pool or quota lives on the shard of its name and serves runs of every shard
(rsd/core/holds/poolbook.py, "Runs of any shard"), in the pure core on a fake clock.

The shell tells the core which runs are its shard's (``Tables.homes_run``, SlotOwner's
``owns_key``); here runs named ``far-...`` are another shard's.

- a slot is granted to a run of another shard (which this shard cannot see) and counted
  in the pool's one limit with every other holder: never more holders than the size;
  the slot is tied to its lease alone: no run is made here for it (live, replayed from
  the journal or a snapshot, as a standby replays without the map), it ends by release
  or expiry, and its end lets the pool's waiters in, the far run's waiter too;
- a run of this shard must still exist (NOT_FOUND), and a cancelled one is refused;
  cancelling a run of this shard ends its own slots and leaves the far run's;
- a quota take for a run of another shard spends the one bucket: never below zero;
- a copy of a run that a move left on the pool's shard (dropped soon) is another
  shard's run too, and its drop, live or on a standby, leaves the slot held, tied to
  its lease.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CoreDriver
from support.twoshards import move, placed, shard, slot

from rsd.core import DEFERRED
from rsproto import ErrorCode, Kind, Op

RUNS = ("here-1", "here-2")


def far(run: str) -> bool:
    """Whether ``run`` is another shard's: the predicate the shell gives."""
    return run.startswith("far-")


@pytest.fixture
def core() -> CoreDriver:
    core = CoreDriver(mailbox=None, runs=RUNS)
    core.tables.homes_run = lambda run: not far(run)
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 2})
    core.call(Op.QUOTA_ENSURE, {"name": "calls", "limit": 3, "per_seconds": 3600})
    core.drain()
    return core


def acquire(core: CoreDriver, scope: str, conn: int = ALICE, **extra: Any) -> Any:
    return core.call(Op.POOL_ACQUIRE, {"scope": scope, "pool": "gpu", "lease_seconds": 10,
                                       **extra}, conn)


def held(core: CoreDriver) -> list[str]:
    """The runs holding a slot of gpu, in grant order."""
    rows = core.call(Op.POOL_INSPECT, {"name": "gpu"})["holders"]
    return [row["run"] for row in rows]


def test_a_run_of_another_shard_gets_a_slot_within_the_pools_one_limit(
    core: CoreDriver,
) -> None:
    first = acquire(core, "far-1")
    acquire(core, "here-1")
    assert held(core) == ["far-1", "here-1"]
    error = core.refused(Op.POOL_ACQUIRE, {"scope": "far-2", "pool": "gpu"})
    assert error.code == ErrorCode.POOL_FULL
    assert core.tables.find_scope("default", "far-1") is None  # no run made here
    assert core.call(Op.LEASE_RENEW, {"leases": [first["lease"]]})["results"] == [None]  # renewed
    core.call(Op.POOL_RELEASE, {"lease": first["lease"]})
    assert held(core) == ["here-1"]


def test_a_far_runs_slot_ends_with_its_lease_and_its_waiter_is_served(
    core: CoreDriver,
) -> None:
    acquire(core, "far-1", BOB)
    acquire(core, "here-1")
    assert acquire(core, "far-2", wait=True, timeout_ms=60_000) is DEFERRED
    core.drain()
    core.advance(11)  # nobody renews: both slots lapse, the far waiter gets one
    granted = [body for _, body in core.drain() if body[0] == Kind.REPLY]
    assert len(granted) == 1 and "lease" in granted[0][2]
    assert held(core) == ["far-2"]
    assert core.tables.find_scope("default", "far-2") is None


def test_a_far_runs_slot_comes_back_from_the_journal_and_a_snapshot_without_a_run(
    core: CoreDriver,
) -> None:
    acquire(core, "far-1")
    acquire(core, "here-1")
    core.drain()
    for rebuilt in (core.replay(), core.replay(list(core.snapshot()))):
        assert held(rebuilt) == ["far-1", "here-1"]
        assert rebuilt.tables.find_scope("default", "far-1") is None
        assert len(rebuilt.tables.run("default", "here-1").slots) == 1


def test_a_run_of_this_shard_must_exist_and_its_cancellation_ends_only_its_slots(
    core: CoreDriver,
) -> None:
    error = core.refused(Op.POOL_ACQUIRE, {"scope": "never-made", "pool": "gpu"})
    assert error.code == ErrorCode.NOT_FOUND
    acquire(core, "far-1")
    acquire(core, "here-1")
    core.call(Op.SCOPE_CANCEL, {"scope": "here-1"})
    assert held(core) == ["far-1"]
    error = core.refused(Op.POOL_ACQUIRE, {"scope": "here-1", "pool": "gpu"})
    assert error.code == ErrorCode.SCOPE_CANCELLED
    error = core.refused(Op.QUOTA_TAKE, {"scope": "here-1", "quota": "calls"})
    assert error.code == ErrorCode.SCOPE_CANCELLED


def test_a_quota_serves_runs_of_every_shard_from_its_one_bucket(core: CoreDriver) -> None:
    for run in ("far-1", "here-2", "far-2"):
        core.call(Op.QUOTA_TAKE, {"scope": run, "quota": "calls"})
    error = core.refused(Op.QUOTA_TAKE, {"scope": "far-3", "quota": "calls"})
    assert error.code == ErrorCode.QUOTA_EXHAUSTED
    assert core.call(Op.QUOTA_INSPECT, {"name": "calls"})["level"] < 1
    assert core.tables.find_scope("default", "far-1") is None


def test_a_copy_of_a_run_left_by_a_move_is_another_shards_and_its_drop_keeps_the_slot() -> None:
    a, b = shard("a", 1), shard("b", 2)
    run = placed("moving")
    a.create_runs(run)
    a.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    move(a, b, slot(run))  # b has the run; a still has its copy until it drops it
    a.tables.homes_run = lambda scope_id: slot(scope_id) != slot(run)
    granted = a.call(Op.POOL_ACQUIRE, {"scope": run, "pool": "gpu", "lease_seconds": 10})
    assert a.drop_slots(a.now, slot(run), slot(run)) == 1
    a.drain()
    standby = a.replay()  # every record, the drop's too, as a standby applies them
    for core in (a, standby):
        assert core.tables.find_scope("default", run) is None
        assert [row["run"] for row in core.call(
            Op.POOL_INSPECT, {"name": "gpu"})["holders"]] == [run]
    assert a.call(Op.LEASE_RENEW, {"leases": [granted["lease"]]})["results"] == [None]
