"""MAILBOX_PAUSE and QUEUE_PAUSE on the pure core (fake clock): a paused mailbox takes
submits and sends, and lets delayed items come due, but delivers nothing (a receive
gets nothing, a parked receive stays parked, a settlement's ``next`` takes nothing);
deliveries already running finish as usual; a resume serves the parked receives at
once. Paused for every run of the tenant or in one run alone; each a MAILBOX_PAUSED
record that a restart replays and a snapshot rebuilds; idempotent; NOT_FOUND for an
unknown mailbox; INVALID_ARGUMENT for bad input. A run moved to another shard keeps its
pause there and leaves nothing of it behind; a cancelled run's pauses end.
"""

from __future__ import annotations

from typing import Any

from support.core import ALICE, BOB, HOLDERS, CoreDriver, on_disk
from support.twoshards import move, placed, shard, slot

from rsd.core import Rec
from rsproto import ErrorCode, Op

BOX = {"scope": "s", "mailbox": "jobs"}
OTHER = {"scope": "t", "mailbox": "jobs"}


def a_core() -> CoreDriver:
    return CoreDriver(runs=("s", "t"))


def submit(core: CoreDriver, data: Any, where: dict[str, Any] = BOX, **more: Any) -> str:
    return str(core.call(Op.TASK_SUBMIT, {**where, "data": data, **more})["id"])


def receive(core: CoreDriver, where: dict[str, Any] = BOX) -> Any:
    return core.call(Op.RECEIVE, where)["delivery"]


def park(core: CoreDriver, where: dict[str, Any] = BOX) -> None:
    parked = core.call(Op.RECEIVE, {**where, "wait": True, "timeout_ms": 600_000})
    assert not isinstance(parked, dict)


def served(core: CoreDriver) -> list[Any]:
    """The data of the deliveries pushed to parked receives since the last drain."""
    return [body["delivery"]["data"] for _, (_, _, body) in core.drain()]


def restarted(core: CoreDriver, records: list[Any] | None = None) -> CoreDriver:
    rebuilt = core.fresh(HOLDERS)
    for rec in core.records if records is None else records:
        rebuilt.apply(on_disk(rec), core.now)
    rebuilt.recovered(core.now, clean=True)
    return rebuilt


def test_a_paused_mailbox_takes_work_but_delivers_none() -> None:
    core = a_core()
    submit(core, "running")
    running = receive(core)
    assert core.call(Op.MAILBOX_PAUSE, {"name": "jobs"})["paused"] is True
    submit(core, "a")
    submit(core, "later", delay_ms=1_000)
    core.call(Op.MESSAGE_SEND, {**BOX, "data": "m"})
    assert core.call(Op.RECEIVE, BOX) == {"delivery": None}
    park(core)
    core.advance(2.0)  # the delayed item comes due: still not delivered
    assert served(core) == []
    inspect = core.call(Op.QUEUE_INSPECT, BOX)
    assert (inspect["ready"], inspect["running"], inspect["paused"]) == (3, 1, True)
    # The running delivery finishes as usual; its settlement's ``next`` takes nothing.
    done = core.call(Op.DELIVERY_COMPLETE, {"lease": running["lease"], "result": 1,
                                            "next": {"max": 5}})
    assert done["next"] == []
    # Resumed: the parked receive is served at once, then the rest in order.
    assert core.call(Op.MAILBOX_PAUSE, {"name": "jobs", "paused": False})["paused"] is False
    assert served(core) == ["a"]
    assert [receive(core)["data"] for _ in range(2)] == ["m", "later"]  # "later" came due last


def test_a_running_delivery_retries_renews_and_rejects_while_paused() -> None:
    core = a_core()
    core.call(Op.MAILBOX_ENSURE, {"name": "jobs", "retry_backoff_ms": 0})
    submit(core, "x")
    first = receive(core)
    core.call(Op.MAILBOX_PAUSE, {"name": "jobs"})
    core.call(Op.LEASE_RENEW, {"leases": [first["lease"]]})
    core.call(Op.DELIVERY_RETRY, {"lease": first["lease"], "reason": "again"})
    assert core.call(Op.RECEIVE, BOX) == {"delivery": None}  # back in line, held
    core.call(Op.MAILBOX_PAUSE, {"name": "jobs", "paused": False})
    again = receive(core)
    assert again["attempt"] == 2
    core.call(Op.MAILBOX_PAUSE, {"name": "jobs"})
    core.call(Op.DELIVERY_REJECT, {"lease": again["lease"], "reason": "bad"})
    assert core.call(Op.QUEUE_INSPECT, BOX)["dead_letters"] == 1


def test_a_pause_in_one_run_holds_that_run_alone() -> None:
    core = a_core()
    assert core.call(Op.QUEUE_PAUSE, BOX)["paused"] is True
    submit(core, "held")
    submit(core, "free", OTHER)
    assert core.call(Op.RECEIVE, BOX) == {"delivery": None}
    assert receive(core, OTHER)["data"] == "free"
    park(core)
    # Tenant-wide and per-run pauses add up: each resume lifts its own.
    core.call(Op.MAILBOX_PAUSE, {"name": "jobs"})
    core.call(Op.QUEUE_PAUSE, {**BOX, "paused": False})
    assert served(core) == []
    assert core.call(Op.QUEUE_INSPECT, BOX)["paused"] is True
    core.call(Op.MAILBOX_PAUSE, {"name": "jobs", "paused": False})
    assert served(core) == ["held"]
    assert core.call(Op.QUEUE_INSPECT, BOX)["paused"] is False


def test_pausing_twice_writes_one_record_and_resuming_twice_one() -> None:
    core = a_core()
    for op, where in ((Op.MAILBOX_PAUSE, {"name": "jobs"}), (Op.QUEUE_PAUSE, BOX)):
        for paused in (True, True, False, False):
            core.call(op, {**where, "paused": paused})
        core.drain()
        assert [r[0] for r in core.records].count(Rec.MAILBOX_PAUSED) in (2, 4)
    paused = [tuple(r[1:]) for r in core.records if r[0] == Rec.MAILBOX_PAUSED]
    assert paused == [("jobs", "default", None, True), ("jobs", "default", None, False),
                      ("jobs", "default", "s", True), ("jobs", "default", "s", False)]


def test_a_restart_and_a_snapshot_rebuild_both_pauses() -> None:
    core = a_core()
    core.call(Op.MAILBOX_ENSURE, {"name": "other"})
    core.call(Op.MAILBOX_PAUSE, {"name": "other"})
    core.call(Op.QUEUE_PAUSE, BOX)  # an empty queue, kept by its pause alone
    submit(core, "held")
    core.drain()
    for rebuilt in (restarted(core), restarted(core, list(core.snapshot()))):
        assert rebuilt.call(Op.RECEIVE, BOX) == {"delivery": None}
        other = {"scope": "t", "mailbox": "other"}
        assert rebuilt.call(Op.QUEUE_INSPECT, other)["paused"] is True
        assert rebuilt.call(Op.QUEUE_INSPECT, OTHER)["paused"] is False
        rebuilt.call(Op.QUEUE_PAUSE, {**BOX, "paused": False})
        assert receive(rebuilt)["data"] == "held"
    # A queue paused with nothing in it is still one: a snapshot keeps it.
    core.call(Op.QUEUE_PAUSE, OTHER)
    core.drain()
    rebuilt = restarted(core, list(core.snapshot()))
    assert rebuilt.call(Op.QUEUE_INSPECT, OTHER)["paused"] is True


def test_an_unknown_mailbox_or_bad_input_is_refused_and_writes_nothing() -> None:
    core = a_core()
    core.drain()
    before = len(core.records)
    assert core.refused(Op.MAILBOX_PAUSE, {"name": "nope"}).code == ErrorCode.NOT_FOUND
    assert core.refused(Op.QUEUE_PAUSE, {**BOX, "mailbox": "nope"}).code == ErrorCode.NOT_FOUND
    assert core.refused(Op.QUEUE_PAUSE, {**BOX, "scope": "nope"}).code == ErrorCode.NOT_FOUND
    for bad in ({"name": 7}, {}, {"name": "jobs", "paused": "yes"}, {"name": "x" * 129}):
        assert core.refused(Op.MAILBOX_PAUSE, bad).code == ErrorCode.INVALID_ARGUMENT
    for bad in ({**BOX, "paused": 1}, {"scope": "s"}, {"mailbox": "jobs"}):
        assert core.refused(Op.QUEUE_PAUSE, bad).code == ErrorCode.INVALID_ARGUMENT
    core.drain()
    assert len(core.records) == before


def test_another_tenants_mailbox_is_not_paused_by_mine() -> None:
    tenants = {ALICE: ("acme", True), BOB: ("globex", True)}
    core = CoreDriver(holders={ALICE: "alice", BOB: "bob"}, tenants=tenants)
    core.call(Op.MAILBOX_PAUSE, {"name": "jobs"}, ALICE)
    submit_bob = core.call(Op.TASK_SUBMIT, {**BOX, "data": "b"}, BOB)
    assert submit_bob["id"]
    assert core.call(Op.RECEIVE, BOX, BOB)["delivery"]["data"] == "b"
    listed = core.call(Op.ADMIN_MAILBOXES, {}, ALICE)["mailboxes"]
    assert [box["paused"] for box in listed] == [True]


def test_a_cancelled_run_ends_its_pauses_and_is_freed_as_any_other() -> None:
    core = a_core()
    core.call(Op.QUEUE_PAUSE, BOX)  # an empty queue, kept by its pause alone
    core.call(Op.SCOPE_CANCEL, {"scope": "s", "reason": "done"})
    core.drain()
    assert core.records[-1][0] == Rec.MAILBOX_PAUSED and core.records[-1][4] is False
    assert core.call(Op.QUEUE_INSPECT, BOX)["paused"] is False
    assert core.refused(Op.QUEUE_PAUSE, BOX).code == ErrorCode.SCOPE_CANCELLED
    assert restarted(core).call(Op.QUEUE_INSPECT, BOX)["paused"] is False


def test_receives_that_come_and_go_on_a_paused_mailbox_leave_nothing_behind() -> None:
    core = a_core()
    core.call(Op.MAILBOX_PAUSE, {"name": "jobs"})
    depth = core.work.mailboxes[("default", "jobs")].depth
    for _ in range(100):  # each parks, times out, and its empty queue is freed
        core.call(Op.RECEIVE, {**BOX, "wait": True, "timeout_ms": 1_000})
        core.advance(2.0)
    assert len(depth.parked) == 0
    park(core)
    assert len(depth.parked) == 1


def test_a_run_paused_in_one_mailbox_moves_to_another_shard_paused() -> None:
    a, b = shard("a", 1), shard("b", 2)
    run = placed("p")
    where = {"scope": run, "mailbox": "jobs"}
    a.create_runs(run)
    a.call(Op.QUEUE_PAUSE, where)
    a.call(Op.TASK_SUBMIT, {**where, "data": "held"})
    a.drain()
    a.advance(1.0)
    b.advance(1.0)
    assert move(a, b, slot(run))["runs"] == 1
    assert b.call(Op.QUEUE_INSPECT, where)["paused"] is True
    assert b.call(Op.RECEIVE, where) == {"delivery": None}
    b.call(Op.QUEUE_PAUSE, {**where, "paused": False})
    assert b.call(Op.RECEIVE, where)["delivery"]["data"] == "held"
    assert a.drop_slots(a.now, slot(run), slot(run)) == 1  # the source lets it go whole
    assert ("default", run) not in a.scopes
