"""Schedules: tasks submitted into a run's mailbox at fire times (schedule.py says which).

What always holds:
- a schedule is named per run, ``(tenant, run, name)``: another tenant's run, and so its
  schedules, is NOT_FOUND; at most ``Policy.MAX_SCHEDULES_PER_RUN`` per run and
  ``Policy.MAX_SCHEDULES_PER_TENANT`` per tenant (RESOURCE_EXHAUSTED naming the limit);
  a run holds its schedules (it is not freed while it has one) and cancelling the run
  deletes them (SCHEDULE_DELETED, reason "scope cancelled");
- SCHEDULE_ENSURE is declarative: the same definition again records nothing; another
  one is recorded and its next fire time computed afresh from the core's clock;
- each fire time fires at most once: its task is keyed ``schedule:<name>:<fire time>``
  (schedule.py's ``fire_key``) with the schedule's data, so a repeat finds the task and
  is a join, never a second task; and the fire's ITEM_ENQUEUED records are followed,
  in the same call and so in the same journal batch, by one SCHEDULE_FIRED carrying the
  next fire time: replay after a crash neither skips a fire (the batch is whole or
  absent, and an absent one is due again at once) nor doubles one (the key);
- a live schedule not paused has exactly one wheel timer, at its next fire time (a
  wall-clock instant: ``Tables.at_wall``), moved in O(1) by each fire, change, pause and
  delete; a fire costs the task's submit plus O(fired): never a walk over schedules;
- a fire the tenant has no room for (items, payload bytes) is skipped with a note for
  the log (summed up per interval: logs.py), and the schedule goes on; nothing is
  fired while the core follows (a standby never ticks): a promoted standby fires what
  is due from its first tick;
- SCHEDULE_LIST is paged as every listing is (adminargs.py's ``page_of``: ``cursor``,
  ``limit``, ``newest_first``; in the order the schedules were ensured, a new
  definition counting as new), each page weighing its schedules' data so that it
  fits a frame: never a reply over the frame limit, whatever the data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from rsproto import ErrorCode, Limits, Op

from ...policy import Policy
from ..ground.errors import CoreError
from ..ground.pages import PagedIndex
from ..ground.payloads import measured_payload
from ..ground.validate import int_arg, invalid, opt_text, req_text
from ..records import Rec, ScheduleDeleted, ScheduleEnsured, ScheduleFired, SchedulePaused
from ..records.itemrecords import enqueued
from ..records.snaprecords import SnapSchedule
from ..run.schedule import CATCH_UPS, Schedule, Spec, due, fire_key
from ..run.scope import Scope, ScopeKey
from ..state.adminargs import page_of
from ..state.tables import Applier, Handler, Tables
from ..work.deliveries import Deliveries
from ..work.workbook import Work

__all__ = ["ScheduleBook", "run_schedules"]

_PER_RUN = Policy.MAX_SCHEDULES_PER_RUN
_PER_TENANT = Policy.MAX_SCHEDULES_PER_TENANT
# What a schedule's view takes in a reply besides its data, at the longest its fields
# may be (names, cron, time zone, and the keys and numbers around them): about 750.
_VIEW_BYTES: Final = 1024


def _weight(schedule: Schedule) -> int:
    """The bytes ``schedule``'s view adds to a SCHEDULE_LIST reply, at most."""
    return schedule.size + _VIEW_BYTES


class ScheduleBook:
    """The schedule rules. Owned by the Core, which hands it the shared tables."""

    def __init__(self, tables: Tables, work: Work, deliveries: Deliveries) -> None:
        self.tables = tables
        self.work = work
        self.deliveries = deliveries
        self.per_tenant: dict[str, int] = {}
        self.count = 0  # schedules held, over all tenants
        self.runs: dict[ScopeKey, Scope] = {}  # the runs holding a schedule (snapshot)
        self.ops: dict[int, Handler] = {
            Op.SCHEDULE_ENSURE: self.ensure,
            Op.SCHEDULE_LIST: self.list,
            Op.SCHEDULE_GET: self.get,
            Op.SCHEDULE_PAUSE: self.pause,
            Op.SCHEDULE_RESUME: self.resume,
            Op.SCHEDULE_DELETE: self.delete,
        }
        self.appliers: dict[int, Applier] = {
            Rec.SCHEDULE_ENSURED: self.apply_ensured,
            Rec.SCHEDULE_FIRED: self.apply_fired,
            Rec.SCHEDULE_PAUSED: self.apply_paused,
            Rec.SCHEDULE_DELETED: self.apply_deleted,
            Rec.SNAP_SCHEDULE: self.apply_snapshot,
        }

    # ---- ops -------------------------------------------------------------------------

    def ensure(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        tenant, scope_id, mailbox, scope, _ = self.work.to_change(conn, args)
        name = req_text(args, "name", Limits.MAX_SCHEDULE_NAME_BYTES)
        every = args.get("every_seconds")
        cron = args.get("cron")
        if (every is None) == (cron is None):
            raise invalid("give exactly one of every_seconds and cron")
        if every is not None:
            every = int_arg(args, "every_seconds", Limits.MIN_SCHEDULE_EVERY_SECONDS,
                            Limits.MAX_SCHEDULE_EVERY_SECONDS)
        else:
            cron = req_text(args, "cron", Limits.MAX_CRON_BYTES)
        timezone = opt_text(args, "timezone", Limits.MAX_TIMEZONE_BYTES) or "UTC"
        catch_up = opt_text(args, "catch_up", 16) or "latest"
        if catch_up not in CATCH_UPS:
            raise invalid(f"catch_up must be one of {', '.join(CATCH_UPS)}, got {catch_up!r}")
        spec = Spec(every, cron, timezone)
        wall = self.tables.wall(now)
        spec.check(wall)
        data = args.get("data")
        digest, size = measured_payload("data", data, salt=mailbox)
        existing = scope.schedules.get(name)
        if existing is not None and existing.spec.same(spec) and (
            existing.mailbox, existing.digest, existing.catch_up) == (mailbox, digest, catch_up):
            return {**existing.view(), "created": False}
        if existing is None:
            if len(scope.schedules) >= _PER_RUN:
                raise CoreError(ErrorCode.RESOURCE_EXHAUSTED,
                                f"this run already has {_PER_RUN} schedules, the limit")
            if self.per_tenant.get(tenant, 0) >= _PER_TENANT:
                raise CoreError(ErrorCode.RESOURCE_EXHAUSTED,
                                f"this tenant already has {_PER_TENANT} schedules, the limit")
        self.tables.tenants.room_for_bytes(tenant, size - (existing.size if existing else 0))
        first = spec.after(wall)
        assert first is not None  # spec.check
        created = wall if existing is None else existing.created
        schedule = self.tables.commit(ScheduleEnsured(
            Rec.SCHEDULE_ENSURED, tenant, scope_id, name, mailbox, every, cron, timezone,
            catch_up, data, size, first, created,
        ), now)
        return {**schedule.view(), "created": existing is None}

    def list(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        """A page of the run's schedules and the cursor to go on from (see the module
        docstring). O(the page)."""
        scope = self._run(conn, args)
        found, cursor = page_of(scope.schedule_pages, args, weight=_weight)
        return {"schedules": [schedule.view() for schedule in found], "next": cursor}

    def get(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        upcoming = int_arg(args, "next", 1, Limits.MAX_SCHEDULE_NEXT_FIRES, 5)
        return self._find(conn, args).view(upcoming)

    def pause(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        schedule = self._find(conn, args)
        if not schedule.paused:
            self._commit_paused(now, schedule, True, schedule.next_wall)
        return schedule.view()

    def resume(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        schedule = self._find(conn, args)
        if schedule.paused:
            first = schedule.spec.after(self.tables.wall(now))
            assert first is not None
            self._commit_paused(now, schedule, False, first)
        return schedule.view()

    def delete(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        schedule = self._find(conn, args)
        self._commit_deleted(now, schedule, "deleted")
        return {"deleted": True}

    def _run(self, conn: int, args: dict[str, Any]) -> Scope:
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        return self.tables.run(self.tables.tenant_of(conn), scope_id)

    def _find(self, conn: int, args: dict[str, Any]) -> Schedule:
        scope = self._run(conn, args)
        name = req_text(args, "name", Limits.MAX_SCHEDULE_NAME_BYTES)
        schedule = scope.schedules.get(name)
        if schedule is None:
            raise CoreError(ErrorCode.NOT_FOUND,
                            f"schedule {name!r} does not exist in run {scope.id!r}",
                            {"schedule": name})
        return schedule

    def _commit_paused(self, now: float, schedule: Schedule, paused: bool, at: float) -> None:
        scope = schedule.scope
        self.tables.commit(SchedulePaused(
            Rec.SCHEDULE_PAUSED, scope.tenant, scope.id, schedule.name, paused, at), now)

    def _commit_deleted(self, now: float, schedule: Schedule, reason: str) -> None:
        scope = schedule.scope
        self.tables.commit(ScheduleDeleted(
            Rec.SCHEDULE_DELETED, scope.tenant, scope.id, schedule.name, reason), now)

    # ---- events ----------------------------------------------------------------------

    def run_cancelled(self, now: float, scope: Scope) -> None:
        """``run_cancelled``: the run's schedules are deleted. O(its schedules)."""
        for schedule in list(scope.schedules.values()):
            self._commit_deleted(now, schedule, "scope cancelled")

    # ---- firing ----------------------------------------------------------------------

    def _due(self, now: float, schedule: Schedule) -> None:
        """The schedule's timer: fire what is due (schedule.py's ``due``), then one
        SCHEDULE_FIRED with the next fire time, which re-arms the timer."""
        scope = schedule.scope
        if scope.schedules.get(schedule.name) is not schedule or schedule.paused:
            return  # (its timer is taken back when it changes: defensive)
        wall = self.tables.wall(now)
        if self.tables.after(schedule.next_wall, now):
            return
        times = due(schedule.spec, schedule.next_wall, wall, schedule.catch_up)
        for t in times:
            self._submit(now, schedule, t)
        upcoming = schedule.spec.after(max(wall, schedule.next_wall))
        if upcoming is None:  # a cron expression's last fire within cronsim's horizon
            self._commit_deleted(now, schedule, "no fire time left")
            return
        self.tables.commit(ScheduleFired(
            Rec.SCHEDULE_FIRED, scope.tenant, scope.id, schedule.name, len(times),
            times[-1] if times else None, upcoming,
        ), now)

    def _submit(self, now: float, schedule: Schedule, t: float) -> None:
        """The task of the fire at ``t``, unless it exists (then the fire already
        happened: a join, nothing to record)."""
        scope = schedule.scope
        key = fire_key(schedule.name, t)
        if key in scope.tasks:
            return
        tenant = scope.tenant
        try:
            self.work.room_for_item(tenant, scope, schedule.size)
        except CoreError as exc:
            self.tables.effects.note(
                "schedule fire skipped", tenant=tenant, scope=scope.id,
                schedule=schedule.name, fire=t, reason=exc.message,
            )
            return
        self.tables.commit(enqueued(
            item_id=self.work.new_id("t", tenant), is_message=False, scope_id=scope.id,
            mailbox=schedule.mailbox, key=key, digest=schedule.digest, data=schedule.data,
            created_wall=self.tables.wall(now), deadline_wall=None, tenant=tenant,
            data_size=schedule.size,
        ), now)
        queue = scope.queues.get(schedule.mailbox)
        if queue is not None:
            self.deliveries.dispatch(now, queue)

    def _arm(self, schedule: Schedule) -> None:
        self.tables.at_wall(schedule.next_wall, self._due, schedule)

    def _disarm(self, schedule: Schedule) -> None:
        self.tables.cancel_at_wall(schedule.next_wall, self._due, schedule)

    # ---- records ---------------------------------------------------------------------

    def apply_ensured(self, rec: ScheduleEnsured, now: float) -> Schedule:
        (_, tenant, scope_id, name, mailbox, every, cron, timezone, catch_up, data, size,
         next_wall, created) = rec
        scope = self.tables.scope_for(tenant, scope_id)
        old = scope.schedules.get(name)
        schedule = Schedule(
            scope, name, mailbox, Spec(every, cron, timezone), data,
            measured_payload("data", data, salt=mailbox)[0], size, catch_up, next_wall,
            created,
        )
        if old is not None and old.same(schedule) and old.next_wall >= next_wall:
            return old  # replayed again, after its fires: it is as it was
        if old is not None:
            self._drop(old)
            schedule.paused, schedule.fired, schedule.last_fire = (
                old.paused, old.fired, old.last_fire)
        self._add(schedule)
        return schedule

    def apply_fired(self, rec: ScheduleFired, now: float) -> None:
        _, tenant, scope_id, name, fired, last_wall, next_wall = rec
        schedule = self._lookup(tenant, scope_id, name)
        if schedule is None or next_wall <= schedule.next_wall:
            return  # replayed again: already past it
        if not schedule.paused:
            self._disarm(schedule)
        schedule.next_wall = next_wall
        schedule.fired += fired
        if last_wall is not None:
            schedule.last_fire = last_wall
        if not schedule.paused:
            self._arm(schedule)

    def apply_paused(self, rec: SchedulePaused, now: float) -> None:
        _, tenant, scope_id, name, paused, next_wall = rec
        schedule = self._lookup(tenant, scope_id, name)
        if schedule is None or schedule.paused == paused:
            return
        if not schedule.paused:
            self._disarm(schedule)
        schedule.paused = paused
        schedule.next_wall = next_wall
        if not paused:
            self._arm(schedule)

    def apply_deleted(self, rec: ScheduleDeleted, now: float) -> None:
        _, tenant, scope_id, name, _reason = rec
        schedule = self._lookup(tenant, scope_id, name)
        if schedule is not None:
            self._drop(schedule)
            self.tables.release_scope(schedule.scope)

    def apply_snapshot(self, rec: SnapSchedule, now: float) -> None:
        (_, tenant, scope_id, name, mailbox, every, cron, timezone, catch_up, data, size,
         next_wall, created, paused, fired, last_wall) = rec
        scope = self.tables.scope_for(tenant, scope_id)
        old = scope.schedules.get(name)
        if old is not None:
            self._drop(old)
        schedule = Schedule(
            scope, name, mailbox, Spec(every, cron, timezone), data,
            measured_payload("data", data, salt=mailbox)[0], size, catch_up, next_wall,
            created,
        )
        schedule.paused, schedule.fired, schedule.last_fire = paused, fired, last_wall
        self._add(schedule)

    def _lookup(self, tenant: str, scope_id: str, name: str) -> Schedule | None:
        scope = self.tables.find_scope(tenant, scope_id)
        return None if scope is None else scope.schedules.get(name)

    def _add(self, schedule: Schedule) -> None:
        scope = schedule.scope
        scope.schedules[schedule.name] = schedule
        pages = scope.schedule_pages
        if pages is None:
            schedules = scope.schedules
            pages = scope.schedule_pages = PagedIndex(
                lambda s: schedules.get(s.name) is s)
        pages.add(schedule)
        self.runs[scope.key] = scope
        self.count += 1
        self.per_tenant[scope.tenant] = self.per_tenant.get(scope.tenant, 0) + 1
        self.tables.tenants.charge(scope.tenant, schedule.size)
        if not schedule.paused:
            self._arm(schedule)

    def _drop(self, schedule: Schedule) -> None:
        scope = schedule.scope
        del scope.schedules[schedule.name]
        if scope.schedule_pages is not None:
            scope.schedule_pages.removed()
        if not scope.schedules:
            del self.runs[scope.key]
        self.count -= 1
        left = self.per_tenant[scope.tenant] - 1
        if left:
            self.per_tenant[scope.tenant] = left
        else:
            del self.per_tenant[scope.tenant]
        self.tables.tenants.charge(scope.tenant, -schedule.size)
        if not schedule.paused:
            self._disarm(schedule)

    # ---- snapshot --------------------------------------------------------------------

    def snapshot(self) -> Iterator[SnapSchedule]:
        for scope in self.runs.values():
            yield from run_schedules(scope)


def run_schedules(scope: Scope) -> Iterator[SnapSchedule]:
    """The SNAP_SCHEDULE of each of ``scope``'s schedules (a snapshot's, a moved run's)."""
    for s in scope.schedules.values():
        spec = s.spec
        yield SnapSchedule(
            Rec.SNAP_SCHEDULE, scope.tenant, scope.id, s.name, s.mailbox,
            spec.every_seconds, spec.cron, spec.timezone, s.catch_up, s.data,
            s.size, s.next_wall, s.created, s.paused, s.fired, s.last_fire,
        )
