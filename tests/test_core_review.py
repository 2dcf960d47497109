"""Review findings on the pure core, each pinned by a test of the right behaviour.

Every test here drives ``rsd.core.Core`` with a fake clock (``now`` is a float we pass
in; the core's wall clock is ``now + WALL``) and asserts what protocol.md, the guide or
the core's own docstrings promise. A test marked ``xfail(strict=True)`` documents a bug
that is still there: it fails today (with an AssertionError, nothing else counts) and
starts passing the day the bug is fixed, when the marker must go.

The unmarked tests at the end are checks that held: kept as regression guards.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgpack
import pytest

from rsclient import wire
from rsd.core import DEFERRED, Core, CoreError
from rsd.logfile import encode_batch
from rsproto import ErrorCode, Kind, Op

ALICE, BOB = 1, 2
WALL = 1_700_000_000.0
_rids = itertools.count(1)


def make_core(**options: Any) -> Core:
    counter = itertools.count(1)
    core = Core(lambda: f"scope-{next(counter)}", wall_offset=WALL, **options)
    core.recovered(0.0, clean=True)
    core.connected(ALICE, "alice")
    core.connected(BOB, "bob")
    call(core, 0.0, Op.MAILBOX_ENSURE, {"name": "jobs"})
    drain(core)
    return core


def drain(core: Core) -> list[Any]:
    core.effects.take_records()
    core.effects.take_sync()
    return core.effects.take_messages()


def call(core: Core, now: float, op: int, args: dict[str, Any], conn: int = ALICE) -> Any:
    return core.handle(now, conn, next(_rids), op, args)


def outcome(core: Core, now: float, op: int, args: dict[str, Any]) -> tuple[str, Any]:
    """("ok", result) or ("refused", code); any other exception is a server bug (the
    server would answer INTERNAL and log a traceback), reported as an assertion."""
    try:
        return "ok", call(core, now, op, args)
    except CoreError as exc:
        return "refused", exc.code
    except Exception as exc:  # that is the finding: the server would answer INTERNAL
        raise AssertionError(
            f"op {op} raised {type(exc).__name__} inside the core: {exc}"
        ) from None


def nested(depth: int) -> Any:
    """``depth`` arrays, one inside the other, around a nil: a small, valid payload."""
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


# ---- 1. payload nesting depth is not bounded at the boundary -------------------------------
#
# msgpack decodes up to 1024 nested containers, so a request can carry ``data`` 1022
# levels deep (the frame adds two: the request array and the args map). The core accepts
# any depth; everything downstream has less room: the digest of TASK_SUBMIT and keyed
# MESSAGE_SEND recurses in Python (RecursionError near 1000), a RECEIVE reply wraps the
# data in three containers and a DEAD_LETTERS reply or a snapshot record in three or four,
# over msgpack's packing limit of 1024. Suggested fix: refuse payloads nested deeper than
# a documented limit (say 512) with INVALID_ARGUMENT in validate.py, and make
# tasks._canonical iterative or depth-bounded.


@pytest.mark.parametrize("op", [Op.TASK_SUBMIT, Op.MESSAGE_SEND], ids=["submit", "send"])
def test_deeply_nested_data_is_refused_cleanly_not_an_internal_error(op: int) -> None:
    core = make_core()
    args: dict[str, Any] = {"scope": "s", "mailbox": "jobs", "data": nested(1000)}
    if op == Op.MESSAGE_SEND:
        args["work_key"] = "w"  # only a keyed send takes the digest
    else:
        args["key"] = "k"
    kind, result = outcome(core, 0.0, op, args)
    assert kind == "ok" or result == ErrorCode.INVALID_ARGUMENT


def test_an_accepted_payload_can_be_delivered_back_on_the_wire() -> None:
    core = make_core()
    data = nested(1022)
    frame = wire.encode([Kind.REQUEST, 7, Op.MESSAGE_SEND,
                         {"scope": "s", "mailbox": "jobs", "data": data}])
    assert wire.Decoder().feed(frame), "the request itself is a valid frame"
    kind, _ = outcome(core, 0.0, Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs",
                                                    "data": data})
    if kind == "refused":
        return  # refusing it at the boundary is a fine answer
    delivery = call(core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})
    try:
        wire.reply_frame(8, delivery)
    except wire.FrameError as exc:
        raise AssertionError(f"accepted data cannot be delivered: {exc.message}") from None


def test_a_snapshot_can_always_be_written() -> None:
    core = make_core()
    kind, _ = outcome(core, 0.0, Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs",
                                                    "data": nested(1022)})
    if kind == "refused":
        return
    delivery = call(core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})["delivery"]
    call(core, 0.0, Op.DELIVERY_REJECT, {"lease": delivery["lease"]})
    drain(core)
    try:
        encode_batch(list(core.snapshot()))
    except ValueError as exc:
        raise AssertionError(f"the snapshot cannot be encoded: {exc}") from None


# ---- 2. reads that create state ------------------------------------------------------------


@pytest.mark.parametrize("op", [Op.QUEUE_INSPECT, Op.DEAD_LETTERS],
                         ids=["queue_inspect", "dead_letters"])
def test_queue_reads_do_not_create_scopes(op: int) -> None:
    """protocol.md: QUEUE_INSPECT "Changes nothing"; CLAIM_INSPECT and TASK_STATUS already
    only look (ClaimBook.find_scope). Suggested fix: look the scope and queue up without
    creating them and answer an empty queue's counts / no items."""
    core = make_core()
    before = core.stats()["scopes"]
    for n in range(100):
        call(core, 0.0, op, {"scope": f"nobody-{n}", "mailbox": "jobs"})
    assert core.stats()["scopes"] == before
    assert drain(core) == []


# ---- 3. finished items stay referenced after they are gone -------------------------------
#
# Items are taken off the ready line lazily: a finished item keeps its slot in
# ``queue.ready`` (with ``queued`` False) until a RECEIVE on that queue pops past it, and
# a task's deadline timer stays in the wheel until the deadline, which may be up to
# 10^11 (year 5138). So "forgotten" tasks and "forgotten" messages stay in memory.


def _referrers_outside(core: Core, obj: Any) -> list[str]:
    """Where the core still holds ``obj`` (ready lines and wheel buckets)."""
    where = []
    for scope in core.scopes.values():
        for name, queue in scope.queues.items():
            if any(item is obj for item in queue.ready):
                where.append(f"ready line of {scope.id}/{name}")
    for bucket in core.wheel._buckets.values():
        for entry in bucket:
            if getattr(entry, "arg", None) is obj:
                where.append(f"wheel timer {entry.fn.__name__}")
    return where


def test_messages_of_a_cancelled_scope_are_let_go() -> None:
    core = make_core()
    call(core, 0.0, Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": b"x" * 1000})
    item = next(iter(core.work.items.values()))
    call(core, 0.0, Op.SCOPE_CANCEL, {"scope": "s"})
    drain(core)
    assert core.stats()["items"] == 0
    assert _referrers_outside(core, item) == []


def test_a_forgotten_task_is_no_longer_held_anywhere() -> None:
    """Suggested fix: drop the item from its ready line when it finishes (or compact the
    deque when stale entries dominate), and let _deadline_due timers go when the task
    finishes (e.g. skip scheduling deadlines beyond the forget horizon, re-arming them in
    steps, or keep a per-item timer handle that finishing clears)."""
    core = make_core(retention_seconds=10, tombstone_seconds=10)
    # a queue nobody receives from any more: nothing pops the stale slot
    pending = call(core, 0.0, Op.TASK_SUBMIT, {"scope": "idle", "mailbox": "jobs", "data": 1})
    call(core, 0.0, Op.TASK_CANCEL, {"scope": "idle", "task": pending["id"]})
    far = call(core, 0.0, Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 2,
                                            "deadline": 1e11})
    lease = call(core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})["delivery"]["lease"]
    call(core, 0.0, Op.DELIVERY_COMPLETE, {"lease": lease})
    held = {pending["id"]: core.work.items[pending["id"]], far["id"]: core.work.items[far["id"]]}
    for now in (5.0, 11.0, 25.0):
        core.tick(now)
    drain(core)
    assert core.stats()["items"] == 0, "both tasks are forgotten"
    where = {task_id: _referrers_outside(core, item) for task_id, item in held.items()}
    assert where == {pending["id"]: [], far["id"]: []}
    # Timers hold ids, not items: the far deadline's entry stays in the wheel (the wheel
    # has no cancel, by design) until its time, but it keeps no task alive.


# ---- 4. argument checks out of order --------------------------------------------------------


def test_mailbox_ensure_reports_the_first_invalid_field() -> None:
    """Suggested fix: check each field's integer-ness right after its range."""
    core = make_core()
    with pytest.raises(CoreError) as info:
        call(core, 0.0, Op.MAILBOX_ENSURE,
             {"name": "m", "max_attempts": 2.5, "retry_backoff_ms": -1})
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert "max_attempts" in info.value.message


# ---- checks that held (regression guards) -----------------------------------------------------


def _rebuilt(core: Core, records: list[Any], now: float) -> Core:
    fresh = Core(lambda: "unused", wall_offset=WALL,
                 retention_seconds=core.work.retention_seconds,
                 dedupe_seconds=core.work.dedupe_seconds,
                 tombstone_seconds=core.work.tombstone_seconds)
    for rec in records:
        fresh.apply(msgpack.unpackb(msgpack.packb(rec), raw=False, strict_map_key=False), now)
    return fresh


def _state(core: Core) -> list[str]:
    return sorted(repr(msgpack.unpackb(msgpack.packb(rec), raw=False, strict_map_key=False))
                  for rec in core.snapshot())


def test_replay_and_snapshot_agree_after_expiry_on_the_last_attempt_and_forgetting() -> None:
    """Last-attempt expiry (dead letter), keyed message dedupe, a resized delivery lease,
    a scope cancel with a parked consumer and a task result wait, then retention and
    forgetting: the journal and snapshot+journal rebuild what the live core holds."""
    core = make_core(retention_seconds=10, tombstone_seconds=10, dedupe_seconds=5)
    log: list[Any] = []

    def step(now: float, op: int, args: dict[str, Any], conn: int = ALICE) -> Any:
        result = call(core, now, op, args, conn)
        log.extend(core.effects.take_records())
        core.effects.take_messages()
        return result

    def tick(now: float) -> None:
        core.tick(now)
        log.extend(core.effects.take_records())
        core.effects.take_messages()

    step(0.0, Op.MAILBOX_ENSURE, {"name": "jobs", "max_attempts": 1})
    task = step(0.0, Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "key": "k", "data": 1})
    step(0.0, Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": 2, "work_key": "w"})
    first = step(0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "lease_seconds": 5})
    step(0.0, Op.LEASE_RENEW, {"leases": [[first["delivery"]["lease"], 7]]})
    step(0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "lease_seconds": 5})
    assert step(0.0, Op.TASK_RESULT, {"scope": "s", "task": task["id"]}, BOB) is DEFERRED
    assert step(0.0, Op.RECEIVE, {"scope": "c", "mailbox": "jobs", "wait": True}) is DEFERRED
    step(0.0, Op.SCOPE_CANCEL, {"scope": "c"})
    snapshot = list(core.snapshot())
    mark = len(log)
    tick(8.0)  # both deliveries expire on their last attempt: dead letters; dedupe ends
    tick(19.0)  # retention: tombstone
    mid = list(core.snapshot())
    tick(30.0)  # forgotten
    assert core.work.items == {}
    for rebuilt in (_rebuilt(core, log, 30.0), _rebuilt(core, snapshot + log[mark:], 30.0)):
        rebuilt.tick(30.0)
        assert _state(rebuilt) == _state(core)
    assert _state(_rebuilt(core, mid, 19.0)) != _state(core)  # sanity: state did move


def test_a_lease_resized_shorter_then_longer_expires_neither_early_nor_late() -> None:
    core = make_core()
    grant = call(core, 0.0, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": 600})
    lease = grant["lease"]
    call(core, 1.0, Op.LEASE_RENEW, {"leases": [[lease, 5]]})  # due at 6
    call(core, 2.0, Op.LEASE_RENEW, {"leases": [[lease, 600]]})  # due at 602
    for now in (6.0, 600.0, 601.9):
        core.tick(now)
        assert core.leases.get(lease) is not None, f"expired early at {now}"
    core.tick(602.01)
    assert core.leases.get(lease) is None, "expiry lost"
    pushes = [m for _, m in drain(core) if m[0] == Kind.PUSH]
    assert pushes == [[Kind.PUSH, 1, {"lease": lease, "reason": "expired"}]]


def test_every_wait_is_answered_once_whatever_ends_it() -> None:
    """Served, timed out, cancelled, scope-cancelled: one answer each, none twice."""
    core = make_core()
    held = call(core, 0.0, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    task = call(core, 0.0, Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 1})
    call(core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})  # takes the task
    rids = {}
    for name, op, args in [
        ("acquire", Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "wait": True,
                                       "timeout_ms": 2000}),
        ("acquire2", Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "wait": True}),
        ("receive", Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True,
                                 "timeout_ms": 1000}),
        ("receive2", Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True}),
        ("result", Op.TASK_RESULT, {"scope": "s", "task": task["id"]}),
    ]:
        rid = next(_rids)
        assert core.handle(0.0, BOB, rid, op, args) is DEFERRED
        rids[rid] = name
    core.tick(1.5)  # receive times out
    call(core, 1.5, Op.CANCEL, {"request": next(r for r, n in rids.items() if n == "acquire")},
         BOB)
    call(core, 1.5, Op.CLAIM_RELEASE, {"lease": held["lease"]})  # acquire2 is granted
    call(core, 1.5, Op.SCOPE_CANCEL, {"scope": "s"})  # receive2 refused, result answered
    core.tick(4000.0)
    answers = [m[1] for conn, m in drain(core) if conn == BOB and m[0] != Kind.PUSH]
    assert sorted(answers) == sorted(rids)
