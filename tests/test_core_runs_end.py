"""Runs end: a run that has held nothing for --run-retention-seconds is freed.

The hole this closes: runs were never freed, so the runs limit was a lifetime cap (a
fleet making one run per job hit RESOURCE_EXHAUSTED after 100,000 jobs for good) and
memory grew by every run ever made. Each rule of runends.py on the pure core with the
fake clock: freed after the window and not before, never while it holds anything or a
wait parks on it, a cancelled run kept for the window then freed, its id free to create
again, the tenant's count back so the limit admits new runs, bounded work per tick, the
journal cost of a run that fills and empties without end, and the same window after
replaying the journal or a snapshot.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CoreDriver, on_disk

from rsd.core import CoreError, Rec
from rsd.core.ground.tenants import TenantLimits
from rsd.core.runs.runends import SLACK_PARTS
from rsd.policy import Policy
from rsproto import ErrorCode, Op

WINDOW = 64.0
SLACK = WINDOW / SLACK_PARTS  # 1 s
LASTS = WINDOW + SLACK  # from the run's last RUN_QUIET to its end


def driver(**options: Any) -> CoreDriver:
    options.setdefault("run_retention_seconds", WINDOW)
    return CoreDriver(recovered=True, **options)


def exists(core: CoreDriver, run: str, conn: int = ALICE) -> bool:
    try:
        core.call(Op.SCOPE_STATUS, {"scope": run}, conn)
    except CoreError as exc:
        assert exc.code == ErrorCode.NOT_FOUND, exc
        return False
    return True


def freed(core: CoreDriver) -> list[str]:
    core.drain()
    return [rec[1] for rec in core.records if rec[0] == Rec.RUN_FREED]


def test_a_run_that_holds_nothing_is_freed_after_the_window_and_not_before() -> None:
    core = driver(runs=())
    core.create_runs("r")
    assert core.tenant_usage("default")["runs"] == 1
    core.advance(LASTS - 0.01)
    assert exists(core, "r") and freed(core) == []
    core.advance(0.02)
    assert freed(core) == ["r"] and not exists(core, "r")
    assert core.tenant_usage("default")["runs"] == 0
    error = core.refused(Op.CLAIM_ACQUIRE, {"scope": "r", "key": "k"})
    assert error.code == ErrorCode.NOT_FOUND and "does not exist" in error.message
    assert core.stats()["scopes"] == 0


def test_a_run_is_freed_a_window_after_it_last_held_something() -> None:
    core = driver(runs=())
    core.create_runs("r")
    core.advance(30.0)
    lease = core.call(Op.CLAIM_ACQUIRE, {"scope": "r", "key": "k", "lease_seconds": 60})
    core.advance(50.0)  # past the first window: it holds the claim
    assert exists(core, "r")
    core.call(Op.CLAIM_RELEASE, {"lease": lease["lease"]})  # empty again at 80
    core.advance(WINDOW - 0.01)
    assert exists(core, "r")
    core.advance(SLACK + 0.02)
    assert freed(core) == ["r"]


def _task(core: CoreDriver) -> None:
    core.call(Op.TASK_SUBMIT, {"scope": "r", "mailbox": "jobs", "key": "t", "data": 1})


def _message(core: CoreDriver) -> None:
    core.call(Op.MESSAGE_SEND, {"scope": "r", "mailbox": "jobs", "data": 1})


def _running(core: CoreDriver) -> None:
    _task(core)
    core.call(Op.RECEIVE, {"scope": "r", "mailbox": "jobs", "lease_seconds": 600})


def _claim(core: CoreDriver) -> None:
    core.call(Op.CLAIM_ACQUIRE, {"scope": "r", "key": "k", "lease_seconds": 600})


def _slot(core: CoreDriver) -> None:
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    core.call(Op.POOL_ACQUIRE, {"scope": "r", "pool": "gpu", "lease_seconds": 600})


def _pool_wait(core: CoreDriver) -> None:
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    core.call(Op.POOL_ACQUIRE, {"scope": "s", "pool": "gpu", "lease_seconds": 600})
    core.call(Op.POOL_ACQUIRE, {"scope": "r", "pool": "gpu", "wait": True,
                                "timeout_ms": 600_000}, BOB)


def _consumer(core: CoreDriver) -> None:
    core.call(Op.RECEIVE, {"scope": "r", "mailbox": "jobs", "wait": True,
                           "timeout_ms": 600_000})


def _claim_waiter(core: CoreDriver) -> None:
    core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": 600})
    core.call(Op.CLAIM_ACQUIRE, {"scope": "r", "key": "k", "lease_seconds": 600})
    core.call(Op.CLAIM_ACQUIRE, {"scope": "r", "key": "k", "wait": True,
                                 "timeout_ms": 600_000}, BOB)


def _quota_wait(core: CoreDriver) -> None:
    core.call(Op.QUOTA_ENSURE, {"name": "api", "limit": 1, "per_seconds": 86400})
    core.call(Op.QUOTA_TAKE, {"scope": "s", "quota": "api"})
    core.call(Op.QUOTA_TAKE, {"scope": "r", "quota": "api", "wait": True,
                              "timeout_ms": 600_000}, BOB)


@pytest.mark.parametrize("hold", [
    _task, _message, _running, _claim, _slot, _pool_wait, _quota_wait, _consumer,
    _claim_waiter,
])
def test_a_run_is_never_freed_while_it_holds_anything_or_a_wait_parks_on_it(
    hold: Any,
) -> None:
    core = driver(runs=("s", "r"))
    hold(core)
    core.advance(5 * LASTS)  # within every lease and wait above
    assert exists(core, "r"), hold.__name__


def test_a_run_emptied_by_a_connection_closing_gets_its_window_at_the_next_tick() -> None:
    core = driver(runs=("r",))
    _consumer(core)
    core.advance(2 * LASTS)
    core.disconnected(ALICE)  # its parked receive dies with it: the run holds nothing
    assert core.next_deadline() is not None and core.next_deadline() <= core.now
    core.advance(0.0)
    core.drain()
    assert core.records[-1] == (Rec.RUN_QUIET, "r", core.wall(core.now), "default")
    core.advance(LASTS - 0.01)
    assert exists(core, "r", BOB)
    core.advance(0.02)
    assert freed(core) == ["r"]


def test_a_finished_task_keeps_its_run_until_it_is_forgotten() -> None:
    """Keyed or not: a finished task is read by its run and id for the retention and
    tombstone windows, so its run stays as long."""
    core = driver(runs=("r",), retention_seconds=100.0, tombstone_seconds=100.0)
    task = core.call(Op.TASK_SUBMIT, {"scope": "r", "mailbox": "jobs", "data": 1})
    got = core.call(Op.RECEIVE, {"scope": "r", "mailbox": "jobs", "lease_seconds": 600})
    core.call(Op.DELIVERY_COMPLETE, {"lease": got["delivery"]["lease"], "outcome": 7})
    core.advance(150.0)  # tombstoned: still known by its run and id
    assert core.call(Op.TASK_STATUS, {"scope": "r", "task": task["id"]})["tombstoned"]
    core.advance(60.0)  # forgotten at 200: the run holds nothing from then
    assert exists(core, "r")
    core.advance(LASTS)
    assert freed(core) == ["r"]


def test_a_cancelled_run_answers_scope_cancelled_for_the_window_then_is_freed() -> None:
    core = driver(runs=("r",))
    core.advance(40.0)
    _claim(core)
    core.call(Op.SCOPE_CANCEL, {"scope": "r", "reason": "stop"})
    core.advance(WINDOW - 0.01)  # the cancellation ended the claim: empty since 40
    assert core.call(Op.SCOPE_STATUS, {"scope": "r"})["state"] == "cancelled"
    error = core.refused(Op.CLAIM_ACQUIRE, {"scope": "r", "key": "k"})
    assert error.code == ErrorCode.SCOPE_CANCELLED
    core.advance(SLACK + 0.02)
    assert freed(core) == ["r"]
    assert core.refused(Op.CLAIM_ACQUIRE, {"scope": "r", "key": "k"}).code == (
        ErrorCode.NOT_FOUND
    )


def test_a_freed_id_created_again_is_a_new_empty_open_run() -> None:
    core = driver(runs=("r",))
    core.call(Op.SCOPE_CANCEL, {"scope": "r"})
    core.advance(LASTS + 0.01)
    assert freed(core) == ["r"]
    assert core.call(Op.SCOPE_CREATE, {"scope": "r"}) == {"scope": "r", "created": True}
    status = core.call(Op.SCOPE_STATUS, {"scope": "r"})
    assert (status["state"], status["tasks"], status["claims"]) == ("open", {}, 0)
    assert status["created_at"] == core.wall(core.now)
    _claim(core)  # usable, and what it holds keeps it
    core.advance(5 * LASTS)
    assert exists(core, "r") and freed(core) == ["r"]


def test_creating_a_quiet_run_again_gives_it_a_fresh_window_and_reads_do_not() -> None:
    core = driver(runs=("r", "q"))
    core.advance(WINDOW - 4.0)
    assert core.call(Op.SCOPE_CREATE, {"scope": "r"})["created"] is False
    core.call(Op.SCOPE_STATUS, {"scope": "q"})  # a read: keeps nothing
    core.call(Op.RECEIVE, {"scope": "q", "mailbox": "jobs"})
    core.advance(4.0 + SLACK + 0.01)
    assert freed(core) == ["q"]
    core.advance(WINDOW - 4.0 - SLACK - 0.02)
    assert exists(core, "r")
    core.advance(SLACK + 0.02)
    assert freed(core) == ["q", "r"]


def test_freed_runs_give_their_tenant_room_under_the_runs_limit() -> None:
    core = driver(runs=(), tenant_limits=TenantLimits(runs=3))
    for _ in range(3):
        core.call(Op.SCOPE_CREATE, {})
        core.advance(1.0)
    error = core.refused(Op.SCOPE_CREATE, {})
    assert error.code == ErrorCode.RESOURCE_EXHAUSTED and "max_runs_per_tenant" in error.message
    core.advance(LASTS)
    assert core.tenant_usage("default")["runs"] == 0
    for n in range(3):
        assert core.call(Op.SCOPE_CREATE, {"scope": f"again-{n}"})["created"] is True


def test_a_mass_of_runs_ending_at_one_instant_is_freed_a_slice_per_tick() -> None:
    core = driver(runs=())
    runs = 3 * Policy.MAX_FIRED_PER_TICK + 5
    for n in range(runs):
        core.call(Op.SCOPE_CREATE, {"scope": f"r{n}"})
    core.drain()
    core.now += LASTS + 0.01
    core.tick(core.now)
    assert len(freed(core)) == Policy.MAX_FIRED_PER_TICK
    core.advance(0.0)
    assert len(freed(core)) == runs and core.stats()["scopes"] == 0


def test_a_run_filled_and_emptied_without_end_writes_one_run_quiet_per_slack() -> None:
    core = driver(runs=("r",))
    core.drain()
    core.records.clear()
    for n in range(2000):  # acquire and release every 10 ms for 20 s
        lease = core.call(Op.CLAIM_ACQUIRE, {"scope": "r", "key": "k"}, now=n * 0.01)
        core.call(Op.CLAIM_RELEASE, {"lease": lease["lease"]}, now=n * 0.01 + 0.005)
    core.drain()
    quiet = [rec for rec in core.records if rec[0] == Rec.RUN_QUIET]
    assert 20 / SLACK - 1 <= len(quiet) <= 20 / SLACK + 1
    assert len(core.run_ends.line) <= 1  # one entry per run, however often it empties


def _scripted() -> CoreDriver:
    """Runs in every state: quiet, freed, emptied again within the slack, holding
    something after a window began, cancelled, made again after being freed."""
    core = driver(runs=("s", "gone", "again", "busy", "off", "back"))
    lease = core.call(Op.CLAIM_ACQUIRE, {"scope": "again", "key": "k"}, now=0.5)
    core.call(Op.CLAIM_RELEASE, {"lease": lease["lease"]}, now=0.6)  # within the slack
    _task_in = {"scope": "busy", "mailbox": "jobs", "data": 1}
    core.call(Op.TASK_SUBMIT, _task_in, now=0.7)
    core.call(Op.SCOPE_CANCEL, {"scope": "off"}, now=10.0)
    core.advance(20.0)
    lease = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    core.call(Op.CLAIM_RELEASE, {"lease": lease["lease"]})  # a fresh window from 20
    core.call(Op.CLAIM_ACQUIRE, {"scope": "again", "key": "k", "lease_seconds": 600})
    core.advance(LASTS - 20.0 + 0.01)  # "gone" and "back" are freed
    core.call(Op.SCOPE_CREATE, {"scope": "back"})
    core.drain()
    return core


def _runs(core: CoreDriver) -> dict[str, Any]:
    return {
        scope.id: (scope.cancelled, scope.quiet_since, scope.holds_nothing())
        for scope in core.scopes.values()
    }


def without_counters(core: CoreDriver) -> list[str]:
    """The snapshot but for the id counters (a restart reserves a new block)."""
    return sorted(repr(rec) for rec in core.snapshot() if rec[0] != Rec.SNAP_COUNTERS)


def test_replaying_the_journal_or_a_snapshot_gives_the_same_runs_and_windows() -> None:
    core = _scripted()
    assert "gone" not in _runs(core) and "back" in _runs(core)
    from_log = core.replay()
    snapshot = [on_disk(rec) for rec in core.snapshot()]
    from_snapshot = core.replay(snapshot)
    for rebuilt in (from_log, from_snapshot):
        rebuilt.now = core.now
        rebuilt.recovered(core.now, clean=True)
        rebuilt.drain()
        assert _runs(rebuilt) == _runs(core)
        assert without_counters(rebuilt) == without_counters(core)
        assert rebuilt.tenant_usage("default") == core.tenant_usage("default")
    # ... and they free the same runs at the same instants as the live core
    for step in (5.0, 20.0, 40.0, 100.0):
        ends = []
        for each in (core, from_log, from_snapshot):
            each.advance(step)
            ends.append(sorted(_runs(each)))
        assert ends[0] == ends[1] == ends[2], step
    assert sorted(_runs(core)) == ["again", "busy"]


def test_a_snapshot_of_an_older_version_without_the_window_gives_a_full_one() -> None:
    core = driver(runs=("r",))
    old = [
        rec[:5] if rec[0] == Rec.SNAP_SCOPE else rec
        for rec in (on_disk(rec) for rec in core.snapshot())
    ]
    rebuilt = core.replay(old, now=30.0)
    rebuilt.recovered(30.0, clean=True)
    rebuilt.now = 30.0
    rebuilt.advance(LASTS - 0.01)
    assert exists(rebuilt, "r")  # its window began at recovery, not before
    rebuilt.advance(0.02)
    assert not exists(rebuilt, "r")
