"""Schedules in the pure core, on a fake clock (support/core.py's CoreDriver).

Each test is named after the rule it protects: one task per fire time, keyed by it;
neither skipped nor doubled across replay, a lost batch and a snapshot; the catch-up
policies after downtime (latest, all up to its bound, none); pause, resume and delete;
cron in a time zone on daylight-saving change days; bounds and bad inputs refused with
clear codes; another tenant's schedules do not exist.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from support.core import ALICE, BOB, CoreDriver, on_disk

import rsd.core.runs.schedulebook as schedulebook
from rsd.core import Rec
from rsproto import ErrorCode, Limits, Op

WALL = 1_700_000_000.0  # the driver's: a multiple of 10, 2023-11-14T22:13:20Z


def ensure(core: CoreDriver, name: str = "tick", conn: int = ALICE, **args: Any) -> Any:
    args.setdefault("mailbox", "jobs")
    if "cron" not in args:
        args.setdefault("every_seconds", 10)
    return core.call(Op.SCHEDULE_ENSURE, {"scope": "s", "name": name, **args}, conn)


def op(core: CoreDriver, code: Op, name: str = "tick", conn: int = ALICE, **args: Any) -> Any:
    return core.call(code, {"scope": "s", "name": name, **args}, conn)


def fired(core: CoreDriver, name: str = "tick", tenant: str = "default") -> list[str]:
    """The keys of the tasks a schedule's fires made in run "s", in order."""
    scope = core.scopes[(tenant, "s")]
    return sorted(k for k in scope.tasks if k.startswith(f"schedule:{name}:"))


def key(name: str, wall: float) -> str:
    return f"schedule:{name}:{datetime.fromtimestamp(wall, UTC):%Y-%m-%dT%H:%M:%SZ}"


def again(core: CoreDriver, records: list[Any] | None = None) -> CoreDriver:
    """A core rebuilt from ``records`` (by default all so far) at the same instant."""
    core.drain()
    rebuilt = core.replay(records)
    rebuilt.now = core.now
    return rebuilt


def step(core: CoreDriver, seconds: float, by: float = 1.0) -> None:
    """Move the clock on in steps of ``by``, ticking each time, as the shell does."""
    end = core.now + seconds
    while core.now + by <= end:
        core.advance(by)
    if core.now < end:
        core.advance(end - core.now)


@pytest.fixture
def core() -> CoreDriver:
    return CoreDriver()


# ---- firing ----------------------------------------------------------------------------


def test_each_fire_time_submits_one_task_keyed_by_it(core: CoreDriver) -> None:
    view = ensure(core)
    assert view["created"] is True and view["next_fire"] == WALL + 10
    step(core, 35)
    assert fired(core) == [key("tick", WALL + t) for t in (10, 20, 30)]
    task = core.scopes[("default", "s")].tasks[key("tick", WALL + 10)]
    assert task.mailbox == "jobs" and task.data is None
    assert op(core, Op.SCHEDULE_GET)["fires"] == 3


def test_every_seconds_fire_times_are_multiples_of_the_period_since_the_epoch(
    core: CoreDriver,
) -> None:
    core.advance(3.5)
    assert ensure(core, every_seconds=7)["next_fire"] == ((WALL + 3.5) // 7 + 1) * 7 == WALL + 8


def test_ensuring_the_same_schedule_again_records_nothing(core: CoreDriver) -> None:
    ensure(core, data={"a": 1})
    core.drain()
    again = ensure(core, data={"a": 1})
    assert again["created"] is False
    assert not core.effects.records


def test_a_fire_is_not_doubled_when_its_task_key_already_exists(core: CoreDriver) -> None:
    """A repeat of a fire is a join: the key names the task already there."""
    ensure(core)
    core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "key": key("tick", WALL + 10),
                               "data": None})
    step(core, 15)
    assert fired(core) == [key("tick", WALL + 10)]
    assert op(core, Op.SCHEDULE_GET)["next_fire"] == WALL + 20


# ---- replay, snapshot, recovery --------------------------------------------------------


def test_replay_neither_skips_nor_doubles_a_fire(core: CoreDriver) -> None:
    ensure(core)
    step(core, 25)
    rebuilt = again(core)
    assert fired(rebuilt) == fired(core)
    step(rebuilt, 10)
    assert fired(rebuilt) == [key("tick", WALL + t) for t in (10, 20, 30)]


def test_a_fire_whose_batch_was_lost_fires_again_once(core: CoreDriver) -> None:
    """The crash lost the last fire's batch (its task and its SCHEDULE_FIRED): that fire
    is due again at once after recovery, and fires once."""
    ensure(core)
    step(core, 25)
    core.drain()
    last_fire = max(i for i, rec in enumerate(core.records) if rec[0] == Rec.SCHEDULE_FIRED)
    batch_start = max(i for i, rec in enumerate(core.records[:last_fire])
                      if rec[0] != Rec.ITEM_ENQUEUED) + 1
    rebuilt = again(core, core.records[:batch_start])
    assert fired(rebuilt) == [key("tick", WALL + 10)]
    rebuilt.advance(0)
    assert fired(rebuilt) == [key("tick", WALL + 10), key("tick", WALL + 20)]
    step(rebuilt, 10)
    assert fired(rebuilt) == [key("tick", WALL + t) for t in (10, 20, 30)]


def test_a_task_recorded_without_its_fire_record_is_joined_not_doubled(
    core: CoreDriver,
) -> None:
    """Were the task's record kept and the SCHEDULE_FIRED after it lost, the fire due
    again finds its key: one task still."""
    ensure(core)
    step(core, 15)
    core.drain()
    assert core.records[-1][0] == Rec.SCHEDULE_FIRED
    rebuilt = again(core, core.records[:-1])
    rebuilt.advance(0)
    assert fired(rebuilt) == [key("tick", WALL + 10)]
    assert len(rebuilt.scopes[("default", "s")].tasks) == 1
    assert op(rebuilt, Op.SCHEDULE_GET)["next_fire"] == WALL + 20


def test_a_snapshot_keeps_each_schedule_with_its_next_fire_and_pause(
    core: CoreDriver,
) -> None:
    ensure(core, data=[1, 2])
    ensure(core, "paused", cron="0 * * * *", timezone="Europe/Berlin", catch_up="all")
    op(core, Op.SCHEDULE_PAUSE, "paused")
    step(core, 15)
    core.drain()
    snap = [on_disk(rec) for rec in core.snapshot()]
    rebuilt = again(core, snap)
    assert op(rebuilt, Op.SCHEDULE_LIST) == op(core, Op.SCHEDULE_LIST)
    assert sorted(repr(on_disk(r)) for r in rebuilt.snapshot()) == sorted(map(repr, snap))
    step(rebuilt, 10)
    assert fired(rebuilt) == [key("tick", WALL + 10), key("tick", WALL + 20)]
    assert fired(rebuilt, "paused") == []


def test_a_replayed_record_applied_twice_is_harmless(core: CoreDriver) -> None:
    ensure(core)
    step(core, 15)
    op(core, Op.SCHEDULE_PAUSE)
    core.drain()
    rebuilt = again(core, core.records + core.records)
    assert op(rebuilt, Op.SCHEDULE_GET) == op(core, Op.SCHEDULE_GET)


# ---- catch-up after downtime -----------------------------------------------------------


def _down_for(core: CoreDriver, seconds: float) -> CoreDriver:
    """rsd stopped now and starts again ``seconds`` later, recovering its journal."""
    core.drain()
    rebuilt = core.replay(now=core.now + seconds)
    rebuilt.now = core.now + seconds
    rebuilt.recovered(rebuilt.now, clean=True)
    rebuilt.advance(0)
    return rebuilt


def test_catch_up_latest_fires_once_for_the_most_recent_missed_fire(core: CoreDriver) -> None:
    ensure(core, catch_up="latest")
    rebuilt = _down_for(core, 107)  # fire times 10..100 missed
    assert fired(rebuilt) == [key("tick", WALL + 100)]
    step(rebuilt, 5)
    assert fired(rebuilt)[-1] == key("tick", WALL + 110)


def test_catch_up_all_fires_every_missed_fire_time(core: CoreDriver) -> None:
    ensure(core, catch_up="all")
    rebuilt = _down_for(core, 107)
    assert fired(rebuilt) == [key("tick", WALL + t) for t in range(10, 101, 10)]


def test_catch_up_all_is_bounded_to_the_most_recent_fires(core: CoreDriver) -> None:
    ensure(core, every_seconds=1, catch_up="all")
    rebuilt = _down_for(core, 1000)
    keys = fired(rebuilt)
    late = Limits.MAX_SCHEDULE_CATCH_UP
    on_time = 6  # fire times within SCHEDULE_LATE_SECONDS (5) of the restart
    assert len(keys) == late + on_time
    assert keys[0] == key("tick", WALL + 1000 - on_time - late + 1)
    assert keys[-1] == key("tick", WALL + 1000)


def test_catch_up_none_fires_nothing_missed(core: CoreDriver) -> None:
    ensure(core, catch_up="none")
    rebuilt = _down_for(core, 107)
    assert fired(rebuilt) == []
    assert op(rebuilt, Op.SCHEDULE_GET)["next_fire"] == WALL + 110
    step(rebuilt, 5)
    assert fired(rebuilt) == [key("tick", WALL + 110)]


def test_a_promoted_standby_fires_what_is_due_once(core: CoreDriver) -> None:
    """A standby applies the records and never ticks; promoted, it fires from there."""
    ensure(core)
    step(core, 12)
    core.drain()
    standby = again(core)
    standby.now = core.now + 10
    standby.promoted(standby.now)
    standby.advance(0)
    assert fired(standby) == [key("tick", WALL + 10), key("tick", WALL + 20)]


# ---- pause, resume, delete -------------------------------------------------------------


def test_a_paused_schedule_does_not_fire_and_resumes_without_catching_up(
    core: CoreDriver,
) -> None:
    ensure(core)
    assert op(core, Op.SCHEDULE_PAUSE)["paused"] is True
    step(core, 45)
    assert fired(core) == []
    view = op(core, Op.SCHEDULE_RESUME)
    assert view["paused"] is False and view["next_fire"] == WALL + 50
    step(core, 10)
    assert fired(core) == [key("tick", WALL + 50)]


def test_a_deleted_schedule_fires_no_more_and_is_not_found(core: CoreDriver) -> None:
    ensure(core)
    step(core, 12)
    assert op(core, Op.SCHEDULE_DELETE) == {"deleted": True}
    step(core, 30)
    assert fired(core) == [key("tick", WALL + 10)]
    assert core.refused(Op.SCHEDULE_GET, {"scope": "s", "name": "tick"}).code is \
        ErrorCode.NOT_FOUND
    assert core.stats()["schedules"] == 0


def test_a_cancelled_run_deletes_its_schedules(core: CoreDriver) -> None:
    ensure(core)
    core.call(Op.SCOPE_CANCEL, {"scope": "s", "reason": "done"})
    step(core, 30)
    assert core.stats()["schedules"] == 0
    assert core.call(Op.SCHEDULE_LIST, {"scope": "s"}) == {"schedules": [], "next": None}


def test_get_shows_the_next_fire_times(core: CoreDriver) -> None:
    ensure(core)
    view = op(core, Op.SCHEDULE_GET, next=3)
    assert view["next_fires"] == [WALL + 10, WALL + 20, WALL + 30]


# ---- cron in a time zone ---------------------------------------------------------------


def _local_days(offset: float, days: int, expr: str) -> list[str]:
    core = CoreDriver(wall_offset=offset)
    ensure(core, "nightly", cron=expr, timezone="Europe/Berlin")
    step(core, days * 86400, by=60)
    return [_berlin(k) for k in fired(core, "nightly")]


def _berlin(task_key: str) -> str:
    utc = datetime.strptime(task_key.split(":", 2)[2], "%Y-%m-%dT%H:%M:%SZ")
    return utc.replace(tzinfo=UTC).astimezone(ZoneInfo("Europe/Berlin")).strftime("%H:%M%z")


def test_cron_in_a_time_zone_fires_once_on_the_spring_forward_day() -> None:
    """Berlin, 2024-03-31: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day
    and fires once, right after the gap (Debian cron's rule)."""
    start = datetime(2024, 3, 30, 12, tzinfo=UTC).timestamp()
    fires = _local_days(start, 3, "30 2 * * *")
    assert fires == ["03:00+0200", "02:30+0200", "02:30+0200"]


def test_cron_in_a_time_zone_fires_once_on_the_fall_back_day() -> None:
    """Berlin, 2024-10-27: 03:00 CEST becomes 02:00 CET; 02:30 happens twice and fires
    once, at its first occurrence."""
    start = datetime(2024, 10, 26, 12, tzinfo=UTC).timestamp()
    fires = _local_days(start, 3, "30 2 * * *")
    assert fires == ["02:30+0200", "02:30+0100", "02:30+0100"]


def test_cron_every_five_minutes_fires_on_the_fives(core: CoreDriver) -> None:
    ensure(core, cron="*/5 * * * *")
    step(core, 13 * 60, by=30)
    minutes = [k.split(":")[-2] for k in fired(core)]
    assert minutes == ["15", "20", "25"]  # the driver's clock starts at 22:13:20Z


# ---- bounds and bad inputs -------------------------------------------------------------


@pytest.mark.parametrize(("args", "says"), [
    ({"every_seconds": 10, "cron": "* * * * *"}, "exactly one of every_seconds and cron"),
    ({"every_seconds": None}, "exactly one of every_seconds and cron"),
    ({"every_seconds": 0}, "every_seconds"),
    ({"every_seconds": 1.5}, "every_seconds"),
    ({"cron": "61 * * * *"}, "is not a cron expression"),
    ({"cron": "every day"}, "is not a cron expression"),
    ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "not a known IANA time zone"),
    ({"catch_up": "some"}, "catch_up must be one of latest, all, none"),
    ({"name": "n" * (Limits.MAX_SCHEDULE_NAME_BYTES + 1)}, "name"),
    # a value no msgpack integer holds (a client's decoder never makes one; an in-process
    # caller could): what the wire cannot carry is refused
    ({"data": {"x": 2**70}}, "data"),
])
def test_bad_schedule_arguments_are_refused_naming_what_is_wrong(
    core: CoreDriver, args: dict[str, Any], says: str
) -> None:
    full = {"scope": "s", "name": "tick", "mailbox": "jobs", "every_seconds": 10, **args}
    if ("cron" in args and "every_seconds" not in args) or args.get("every_seconds", 1) is None:
        full.pop("every_seconds")
    error = core.refused(Op.SCHEDULE_ENSURE, full)
    assert error.code is ErrorCode.INVALID_ARGUMENT
    assert says in error.message
    assert core.stats()["schedules"] == 0


def test_a_schedule_into_a_mailbox_never_ensured_is_not_found(core: CoreDriver) -> None:
    error = core.refused(Op.SCHEDULE_ENSURE, {"scope": "s", "name": "t", "mailbox": "nope",
                                              "every_seconds": 5})
    assert error.code is ErrorCode.NOT_FOUND


def test_schedules_per_run_and_per_tenant_are_bounded(
    core: CoreDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedulebook, "_PER_RUN", 2)
    monkeypatch.setattr(schedulebook, "_PER_TENANT", 3)
    core.create_runs("r")
    ensure(core, "a")
    ensure(core, "b")
    error = core.refused(Op.SCHEDULE_ENSURE, {"scope": "s", "name": "c", "mailbox": "jobs",
                                              "every_seconds": 5})
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED and "this run" in error.message
    ensure(core, "b", every_seconds=20)  # a change of one it has is no new one
    core.call(Op.SCHEDULE_ENSURE, {"scope": "r", "name": "c", "mailbox": "jobs",
                                   "every_seconds": 5})
    error = core.refused(Op.SCHEDULE_ENSURE, {"scope": "r", "name": "d", "mailbox": "jobs",
                                              "every_seconds": 5})
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED and "this tenant" in error.message


def test_a_tenant_cannot_touch_another_tenants_schedules() -> None:
    core = CoreDriver(tenants={BOB: ("other", False)})
    ensure(core)
    assert core.call(Op.SCHEDULE_LIST, {"scope": "s"}, BOB) == {"schedules": [], "next": None}
    for code in (Op.SCHEDULE_GET, Op.SCHEDULE_PAUSE, Op.SCHEDULE_RESUME, Op.SCHEDULE_DELETE):
        error = core.refused(code, {"scope": "s", "name": "tick"}, BOB)
        assert error.code is ErrorCode.NOT_FOUND
    step(core, 12)
    assert fired(core) == [key("tick", WALL + 10)]
    assert fired(core, tenant="other") == []


def test_a_run_with_a_schedule_is_not_freed_while_it_holds_one(core: CoreDriver) -> None:
    ensure(core)
    scope = core.scopes[("default", "s")]
    assert not scope.holds_nothing()
    op(core, Op.SCHEDULE_DELETE)
    assert not scope.schedules
    assert scope.holds_nothing()
