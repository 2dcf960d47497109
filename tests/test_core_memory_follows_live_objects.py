"""Memory follows live objects: what has ended leaves every table.

Attacks from issue 8: a receive on a made-up run id created a run and a queue that were
never freed (+326 MiB per 100,000); a cancelled wait kept its timer until its original
deadline (up to an hour); released claims were never freed. Here, on the pure core with
a fake clock: each attack is run at scale and the core's counters (checked against a
walk of every table) come back to where they started. A key's generation still never
goes back: after its claim was freed, after a snapshot, after an unclean stop.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from support.core import ALICE, BOB, CoreDriver, next_rid, on_disk

from rsd.core import DEFERRED, CoreError, Rec
from rsd.core.ground.timerwheel import TimerWheel
from rsd.core.upgrade import upgrade
from rsproto import ErrorCode, Limits, Op

KEYS = 100_000


def walked_stats(core: CoreDriver) -> dict[str, int]:
    """What ``stats()`` keeps as counters, recounted by walking every table."""
    scopes = core.scopes.values()
    return {
        "scopes": len(core.scopes),
        "claims": sum(len(scope.claims) for scope in scopes),
        "leases": len(core.leases.live),
        "items": len(core.work.items),
        "mailboxes": len(core.work.mailboxes),
        "queues": sum(len(scope.queues) for scope in scopes),
        "waits": sum(len(by_conn) for by_conn in core.waits._by_conn.values()),
        "timers": walked_timers(core) + walked_rows(core),
        "pools": len(core.pools.pools),
        "quotas": len(core.quotas.quotas),
        "schedules": sum(len(scope.schedules) for scope in scopes),
        "tenants": len(core.tenants.usage),
    }


def walked_rows(core: CoreDriver) -> int:
    """The wheel rows' wanted entries (leases'), recounted: fresh, each object once."""
    wheel = core.wheel
    wanted = 0
    for slot, row in wheel._rows.items():
        seen: set[int] = set()
        for item in row[wheel._starts.get(slot, 0):]:
            if id(item) not in seen and wheel.fresh(item, slot):
                seen.add(id(item))
                wanted += 1
    return wanted


def walked_timers(core: CoreDriver) -> int:
    """Timers pending, walked: the wheel's entries, but each line of dues sharing one
    (waits.py's deadline line, the retention, tombstone, quiet-run and settled lines)
    counted by its live entries instead."""
    buckets = core.wheel._buckets.values()
    on_wheel = sum(sum(bucket.values()) for bucket in buckets)
    deadlines = core.waits.deadlines
    lines = [
        (deadlines, sum(1 for wait in deadlines._line if wait.lined)),
        (core.endings.retained, len(core.endings.retained._line)),
        (core.endings.tombstones, len(core.endings.tombstones._line)),
        (core.run_ends.line, len(core.run_ends.line._line)),  # quiet runs (runends.py)
        # settlements remembered for a repeat (settled.py)
        (core.settled.line, len(core.settled.line._line)),
    ]
    for line, entries in lines:
        on_wheel += entries - sum(bucket.get(line, 0) for bucket in buckets)
    return on_wheel


def walked_usage(core: CoreDriver) -> dict[str, dict[str, int]]:
    """What each tenant's usage counters keep, recounted by walking every table."""
    usage: dict[str, dict[str, int]] = {}

    def count(tenant: str, kind: str, n: int = 1) -> None:
        row = usage.setdefault(
            tenant,
            {"runs": 0, "claims": 0, "items": 0, "waits": 0, "mailboxes": 0, "payload_bytes": 0},
        )
        row[kind] += n

    def encoded(value: Any) -> int:  # what a stored payload is charged: nil is nothing
        return 0 if value is None else len(msgpack.packb(value, use_bin_type=True))

    for scope in core.scopes.values():
        count(scope.tenant, "runs")
        count(scope.tenant, "claims", len(scope.claims))
        for queue in scope.queues.values():
            for entry in queue.dead_letters:
                count(scope.tenant, "payload_bytes", encoded(entry["data"]))
            for key in queue.dedupe:  # a work_key's entry: the key and what is kept with it
                count(scope.tenant, "payload_bytes", len(key.encode()) + 128)
    for item in core.work.items.values():
        count(item.tenant, "items")
        count(item.tenant, "payload_bytes", encoded(item.data) + encoded(item.outcome))
        for sub, sub_scope in item.subscribers.items():
            count(item.tenant, "payload_bytes", len(sub.encode()) + len((sub_scope or "").encode()))
    for tenant, _ in core.work.mailboxes:
        count(tenant, "mailboxes")
    for conn, by_conn in core.waits._by_conn.items():
        count(core.tenants.of(conn), "waits", len(by_conn))
    return usage


def stats(core: CoreDriver) -> dict[str, int]:
    """The counters, after checking that they are exact (the tenants' too)."""
    counted = core.stats()
    assert counted == walked_stats(core)
    walked = walked_usage(core)
    for tenant in core.tenants.usage:
        assert core.tenant_usage(tenant) == walked.get(tenant, core.tenant_usage("none")), tenant
    return counted


def grant(core: CoreDriver, key: str, now: float = 0.0, scope: str = "s") -> dict[str, Any]:
    return core.call(Op.CLAIM_ACQUIRE, {"scope": scope, "key": key}, now=now)


def release(core: CoreDriver, lease: bytes, now: float = 0.0) -> None:
    core.call(Op.CLAIM_RELEASE, {"lease": lease}, now=now)


# ---- the timer wheel ------------------------------------------------------------------------


def test_cancels_at_scale_leave_the_wheel_empty() -> None:
    """KEYS timers over an hour of 5 ms ticks (~93,000 occupied slots), cancelled in a
    random order: the heap, grown to one entry per slot, is rebuilt each time emptied
    slots outnumber the live ones twice over plus _SPARE_SLOTS (~10 rebuilds here, 13
    for a million: 5.7 s of CPU for the same rule), and ends with at most those spares.
    The bound does not depend on the count, only on there being far more slots than
    spares."""
    wheel = TimerWheel()
    rng = random.Random(8)
    items = [object() for _ in range(KEYS)]
    deadlines = [rng.uniform(0.0, 3600.0) for _ in items]
    for item, deadline in zip(items, deadlines, strict=True):
        wheel.schedule(deadline, item)
    assert len(wheel) == KEYS
    assert len(wheel._heap) > 1000 * 64  # far more slots than the spares left at the end
    order = list(range(len(items)))
    rng.shuffle(order)
    for n in order:
        assert wheel.cancel(deadlines[n], items[n])
    assert len(wheel) == 0 and wheel._buckets == {}
    assert len(wheel._heap) <= 64 + 1  # the leftovers of emptied slots were let go
    assert wheel.next_deadline() is None and wheel.pop_due(1e9) == []


def test_cancel_takes_one_entry_and_never_fires_early() -> None:
    wheel = TimerWheel(tick=0.005)
    wheel.schedule(1.0012, "a")
    wheel.schedule(1.0012, "a")
    wheel.schedule(1.0013, "b")
    assert wheel.cancel(1.0012, "a") and len(wheel) == 2
    assert not wheel.cancel(2.0, "b")  # not scheduled there
    assert wheel.pop_due(1.0012) == []  # still never early
    assert wheel.pop_due(1.0012 + 0.005) == ["a", "b"]
    assert not wheel.cancel(1.0013, "b")  # already came due
    assert len(wheel) == 0


def test_ended_waits_leave_the_wheel_whatever_ends_them() -> None:
    """Served, cancelled, dropped with the connection, timed out: no timer is left."""
    core = CoreDriver(recovered=True, runs=("s", "t", "u"))
    baseline = stats(core)
    held = grant(core, "k")["lease"]
    task = core.call(Op.TASK_SUBMIT, {"scope": "t", "mailbox": "jobs", "data": 1})["id"]
    core.call(Op.RECEIVE, {"scope": "t", "mailbox": "jobs"})
    parked = {}
    for name, op, args, conn in [
        ("cancelled", Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True}, ALICE),
        ("served", Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "wait": True}, ALICE),
        ("dropped", Op.TASK_RESULT, {"scope": "t", "task": task}, BOB),
        ("timed out", Op.RECEIVE, {"scope": "u", "mailbox": "jobs", "wait": True,
                                   "timeout_ms": 100}, ALICE),
    ]:
        parked[name] = next_rid()
        assert core.handle(0.0, conn, parked[name], op, args) is DEFERRED
    assert stats(core)["waits"] == 4
    core.call(Op.CANCEL, {"request": parked["cancelled"]})
    release(core, held)  # the waiter is served
    core.disconnected(BOB)
    core.advance(1.0)  # the last one times out
    after = stats(core)
    assert after["waits"] == 0
    # left: the served waiter's lease and the running delivery, one timer each
    assert after["timers"] == baseline["timers"] + 2 == after["leases"] + baseline["timers"]


def test_ended_leases_and_finished_tasks_leave_the_wheel() -> None:
    core = CoreDriver(recovered=True, retention_seconds=3600, tombstone_seconds=3600)
    baseline = stats(core)
    for n in range(1000):
        release(core, grant(core, f"k{n}")["lease"])
    far = core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 1,
                                     "deadline": 1e11})["id"]
    delivery = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})["delivery"]
    core.call(Op.DELIVERY_RETRY, {"lease": delivery["lease"], "delay_ms": 3_000_000})
    core.call(Op.TASK_CANCEL, {"scope": "s", "task": far})
    # only the finished task's retention timer is left, and the retry remembered for one
    # lease length (settled.py): no lease, deadline or backoff
    assert stats(core)["timers"] == baseline["timers"] + 2
    core.advance(Limits.DEFAULT_LEASE_SECONDS)
    assert stats(core)["timers"] == baseline["timers"] + 1


# ---- reads never create ---------------------------------------------------------------------


@pytest.mark.at_scale
def test_receives_on_100000_made_up_runs_are_not_found_and_leave_no_run_or_queue() -> None:
    core = CoreDriver(recovered=True)
    baseline = stats(core)
    for n in range(KEYS):
        args = {"scope": f"made-up-{n}", "mailbox": "jobs", "wait": n % 2 == 0}
        assert core.refused(Op.RECEIVE, args).code == ErrorCode.NOT_FOUND
    assert stats(core) == baseline
    # Parked ones keep their queue only while they wait, however they end; their runs,
    # created, are kept (each counts against its tenant's runs limit).
    for n in range(3000):
        core.create_runs(f"parked-{n}", conn=BOB if n % 3 == 2 else ALICE)
    baseline = stats(core)
    rids = []
    for n in range(3000):
        rid = next_rid()
        args = {"scope": f"parked-{n}", "mailbox": "jobs", "wait": True, "timeout_ms": 500}
        assert core.handle(0.0, BOB if n % 3 == 2 else ALICE, rid, Op.RECEIVE, args) is DEFERRED
        rids.append(rid)
    assert stats(core)["queues"] == 3000
    for rid in rids[::3]:
        core.call(Op.CANCEL, {"request": rid})
    core.disconnected(BOB)
    core.advance(1.0)  # the rest time out
    core.drain()
    assert stats(core) == baseline


def test_refused_changes_and_other_reads_on_made_up_runs_leave_nothing() -> None:
    core = CoreDriver(recovered=True)
    baseline = stats(core)
    for n in range(1000):
        scope = f"made-up-{n}"
        core.refused(Op.TASK_SUBMIT, {"scope": scope, "mailbox": "jobs"})  # no data
        core.refused(Op.MESSAGE_SEND, {"scope": scope, "mailbox": "jobs", "data": 1,
                                       "work_key": 7})
        core.refused(Op.RECEIVE, {"scope": scope, "mailbox": "jobs", "lease_seconds": -1})
        core.refused(Op.TASK_STATUS, {"scope": scope, "task": f"t-{n}"})
        for op, args in [
            (Op.QUEUE_INSPECT, {"scope": scope, "mailbox": "jobs"}),
            (Op.DEAD_LETTERS, {"scope": scope, "mailbox": "jobs"}),
            (Op.CLAIM_INSPECT, {"scope": scope, "key": "k"}),
        ]:
            assert core.refused(op, args).code == ErrorCode.NOT_FOUND
    assert stats(core) == baseline


def test_queues_and_runs_are_freed_once_their_work_is_done() -> None:
    """Messages consumed and completed, keyless tasks finished: nothing is left of the
    runs but the runs themselves (created) and the finished tasks (kept for retention)."""
    core = CoreDriver(recovered=True)
    baseline = stats(core)
    for n in range(500):
        scope = f"run-{n}"
        core.create_runs(scope)
        core.call(Op.MESSAGE_SEND, {"scope": scope, "mailbox": "jobs", "data": n})
        core.call(Op.TASK_SUBMIT, {"scope": scope, "mailbox": "jobs", "data": n})
        for _ in range(2):
            lease = core.call(Op.RECEIVE, {"scope": scope, "mailbox": "jobs"})["delivery"]
            core.call(Op.DELIVERY_COMPLETE, {"lease": lease["lease"]})
    after = stats(core)
    assert after["items"] == baseline["items"] + 500  # the tasks, kept for retention
    assert after["scopes"] == baseline["scopes"] + 500
    assert (after["queues"], after["leases"]) == (0, 0)


def test_a_queue_with_a_dead_letter_or_a_dedupe_entry_is_kept() -> None:
    core = CoreDriver(recovered=True, dedupe_seconds=10, runs=("a", "b"))
    core.call(Op.MESSAGE_SEND, {"scope": "a", "mailbox": "jobs", "data": 1, "work_key": "w"})
    lease = core.call(Op.RECEIVE, {"scope": "a", "mailbox": "jobs"})["delivery"]["lease"]
    core.call(Op.DELIVERY_COMPLETE, {"lease": lease})
    core.call(Op.MESSAGE_SEND, {"scope": "b", "mailbox": "jobs", "data": 1})
    lease = core.call(Op.RECEIVE, {"scope": "b", "mailbox": "jobs"})["delivery"]["lease"]
    core.call(Op.DELIVERY_REJECT, {"lease": lease})
    def queues(core: CoreDriver) -> list[tuple[str, str]]:
        return sorted((s.id, name) for s in core.scopes.values() for name in s.queues)

    assert queues(core) == [("a", "jobs"), ("b", "jobs")]
    assert stats(core)["queues"] == 2
    assert core.call(Op.DEAD_LETTERS, {"scope": "b", "mailbox": "jobs"})["items"]
    core.advance(11.0)  # the dedupe window passes: run "a"'s queue holds nothing any more
    assert queues(core) == [("b", "jobs")]
    core.drain()
    replayed = core.replay()
    assert queues(replayed) == [("b", "jobs")]
    assert sorted(replayed.scopes) == [("default", "a"), ("default", "b")]  # created


# ---- released claims are freed; generations never go back -----------------------------------


@pytest.mark.at_scale
def test_100000_distinct_keys_acquired_and_released_leave_no_claim() -> None:
    core = CoreDriver(recovered=True)
    baseline = stats(core)
    told: dict[str, int] = {}
    for n in range(KEYS):
        reply = grant(core, f"k{n}")
        told[f"k{n}"] = reply["generation"]
        release(core, reply["lease"])
    assert stats(core) == baseline  # no claim, lease, timer or scope left
    for key in ("k0", f"k{KEYS // 2}", f"k{KEYS - 1}"):
        assert grant(core, key)["generation"] > told[key]


def test_a_key_granted_again_after_its_claim_was_freed_gets_a_larger_generation() -> None:
    """Also when other keys came and went in between, and through waiters, expiry and
    scope cancellation."""
    core = CoreDriver(recovered=True)
    last: dict[str, int] = {}
    rng = random.Random(3)
    held: dict[str, int] = {}
    for step in range(3000):
        key = f"k{rng.randrange(20)}"
        if key in held:
            release(core, held.pop(key), now=float(step))
        else:
            reply = grant(core, key, now=float(step))
            assert reply["generation"] > last.get(key, 0)
            last[key] = reply["generation"]
            held[key] = reply["lease"]
        assert core.call(Op.CLAIM_INSPECT, {"scope": "s", "key": key})["generation"] >= last[key]
    assert stats(core)["claims"] == len(held)


def _history() -> tuple[CoreDriver, dict[str, int]]:
    """Keys acquired and released (freed), and some still held: what clients were told."""
    core = CoreDriver(recovered=True)
    told: dict[str, int] = {}
    for n in range(200):
        key = f"k{n % 50}"
        reply = grant(core, key)
        told[key] = reply["generation"]
        if n < 190:
            release(core, reply["lease"])
    core.drain()
    return core, told


def _every_key_goes_up(core: CoreDriver, told: dict[str, int]) -> None:
    for key, generation in told.items():
        scope = core.scopes.get(("default", "s"))
        claim = scope.claims.get(key) if scope is not None else None
        if claim is not None and claim.lease is not None:
            release(core, claim.lease.handle)
        assert grant(core, key)["generation"] > generation, key


def test_generations_go_up_after_a_snapshot_and_its_replay() -> None:
    core, told = _history()
    snapshot = list(core.snapshot())
    assert sum(rec[0] == Rec.SNAP_CLAIM for rec in snapshot) == 10  # only the held keys
    rebuilt = core.fresh(holders={ALICE: "alice"})
    for rec in snapshot:
        rebuilt.apply(on_disk(rec), 0.0)
    assert stats(rebuilt)["claims"] == 10
    _every_key_goes_up(rebuilt, told)


def test_generations_go_up_after_a_journal_replay() -> None:
    core, told = _history()
    rebuilt = core.replay()
    rebuilt.connected(ALICE, "alice")
    assert list(rebuilt.snapshot()) == list(core.snapshot())
    _every_key_goes_up(rebuilt, told)


@pytest.mark.parametrize("lost", [0, 1, 7, 40])
def test_generations_go_up_after_an_unclean_stop_that_lost_grants(lost: int) -> None:
    """The journal's tail is lost; every generation a client may have been told (all of
    them: the ids were reserved) must still be exceeded by the next grant of its key."""
    core, told = _history()
    records = core.records[: len(core.records) - lost]
    rebuilt = core.fresh(holders={ALICE: "alice"})
    for rec in records:
        rebuilt.apply(on_disk(rec), 0.0)
    rebuilt.recovered(0.0, clean=False)
    _every_key_goes_up(rebuilt, told)


def test_a_journal_of_the_old_layout_still_recovers_its_generations() -> None:
    """Records written before claims were freed: a snapshot that kept free keys and a
    journal of grants and ends. Nothing about them changed; a key goes on upwards."""
    old = [
        (Rec.IDS_RESERVED, 4097, 4097),
        (Rec.SNAP_COUNTERS, 12, 1, 4097, 4097, 0),
        (Rec.SNAP_CLAIM, "s", "free", 7, None, None, 0),
        (Rec.SNAP_CLAIM, "s", "held", 3, 11, "bob", 30),
        (Rec.CLAIM_GRANTED, "s", "other", 12, 1, "bob", 30),
        (Rec.LEASE_ENDED, 12, "released"),
        (Rec.LEASE_ENDED, 11, "released"),
    ]
    core = CoreDriver(recovered=False, mailbox=None, holders={})
    for rec in old:
        core.apply(upgrade(on_disk(rec)), 0.0)  # as recovery reads an old file
    core.connected(ALICE, "alice")
    assert stats(core)["claims"] == 0
    core.create_runs("s")  # its run, made by first use and emptied, is gone with it
    generations = [grant(core, key)["generation"] for key in ("free", "held", "other")]
    assert min(generations) > 7


def test_stats_stay_exact_through_a_random_workload() -> None:
    core = CoreDriver(recovered=True, retention_seconds=5, tombstone_seconds=5,
                      dedupe_seconds=5)
    rng = random.Random(11)
    leases: list[int] = []
    parked: list[int] = []
    now = 0.0

    def attempt(op: int, args: dict[str, Any], conn: int = ALICE, rid: int | None = None) -> Any:
        try:
            return core.call(op, args, conn, now=now, rid=rid)
        except CoreError:
            return None  # e.g. SCOPE_CANCELLED once the run was cancelled

    for _ in range(4000):
        scope = f"s{rng.randrange(8)}"
        box = {"scope": scope, "mailbox": "jobs"}
        what = rng.randrange(9)
        if what == 0:
            reply = attempt(Op.CLAIM_ACQUIRE, {"scope": scope, "key": f"k{rng.randrange(8)}",
                                               "wait": True, "timeout_ms": 300,
                                               "lease_seconds": 5})
            if reply is not None and reply is not DEFERRED:
                leases.append(reply["lease"])
        elif what == 1 and leases:
            attempt(Op.CLAIM_RELEASE, {"lease": leases.pop(rng.randrange(len(leases)))})
        elif what == 2:
            attempt(Op.MESSAGE_SEND, {**box, "data": 1, "work_key": f"w{rng.randrange(4)}"})
        elif what == 3:
            attempt(Op.TASK_SUBMIT, {**box, "data": 1, "key": f"t{rng.randrange(4)}"})
        elif what == 4:
            rid = next_rid()
            if attempt(Op.RECEIVE, {**box, "wait": True, "timeout_ms": 200}, BOB, rid) is DEFERRED:
                parked.append(rid)
        elif what == 5 and parked:
            attempt(Op.CANCEL, {"request": parked.pop()}, BOB)
        elif what == 6:
            got = attempt(Op.RECEIVE, box)
            if got is not None and got["delivery"] is not None:
                op = rng.choice([Op.DELIVERY_COMPLETE, Op.DELIVERY_RETRY, Op.DELIVERY_REJECT])
                attempt(op, {"lease": got["delivery"]["lease"]})
        elif what == 7 and rng.random() < 0.05:
            attempt(Op.SCOPE_CANCEL, {"scope": scope})
        else:
            now += rng.uniform(0.0, 2.0)
            core.tick(now)
        core.drain()
        stats(core)
    core.disconnected(BOB)
    for _ in range(40):
        now += 10.0
        core.tick(now)
    core.drain()
    end = stats(core)
    assert end["waits"] == 0 and end["leases"] == 0 and end["claims"] == 0
    # what is left: cancelled runs, and queues that keep dead letters
    assert end["queues"] <= 8 and end["scopes"] <= 8
