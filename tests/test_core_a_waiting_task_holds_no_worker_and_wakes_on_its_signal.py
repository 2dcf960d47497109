"""DELIVERY_SUSPEND and TASK_SIGNAL on the pure core (fake clock): a suspended task is
WAITING, holds no lease and spends no attempt; a signal of the name it waits for makes
it ready again and its next deliveries carry the signal; a signal sent before the
suspend is kept and wakes it at once; a timeout makes it ready with no signal; cancel,
a deadline and its run's cancellation end it; a restart (journal or snapshot) rebuilds
the same state, and a record applied twice changes nothing; bad input and every bound
are refused with a clear code.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, HOLDERS, CoreDriver, on_disk
from support.twoshards import move, placed, shard, slot

from rsd.core import Rec
from rsd.core.ground.tenants import TenantLimits
from rsd.core.ground.timerwheel import Timer
from rsproto import ErrorCode, Limits, Op

BOX = {"scope": "s", "mailbox": "jobs"}


def submit(core: CoreDriver, data: Any = "job", **more: Any) -> str:
    return str(core.call(Op.TASK_SUBMIT, {**BOX, "data": data, **more})["id"])


def receive(core: CoreDriver) -> Any:
    return core.call(Op.RECEIVE, BOX)["delivery"]


def suspend(core: CoreDriver, delivery: Any, name: str = "approval", **more: Any) -> Any:
    return core.call(Op.DELIVERY_SUSPEND, {"lease": delivery["lease"], "name": name, **more})


def signal(core: CoreDriver, task: str, name: str = "approval", data: Any = None,
           conn: int = BOB) -> Any:
    return core.call(Op.TASK_SIGNAL, {**BOX, "task": task, "name": name, "data": data}, conn)


def status(core: CoreDriver, task: str) -> dict[str, Any]:
    return dict(core.call(Op.TASK_STATUS, {**BOX, "task": task}))


def state_of(core: CoreDriver) -> list[str]:
    """The whole state but the id ceilings (a restart reserves a block of its own)."""
    return sorted(repr(on_disk(rec)) for rec in core.snapshot() if rec[0] != Rec.SNAP_COUNTERS)


def restarted(core: CoreDriver, records: list[Any] | None = None) -> CoreDriver:
    """A core rebuilt from ``records`` (by default the whole journal so far)."""
    core.drain()
    rebuilt = core.fresh(HOLDERS)
    for rec in core.records if records is None else records:
        rebuilt.apply(on_disk(rec), core.now)
    rebuilt.recovered(core.now, clean=True)
    rebuilt.now = core.now
    rebuilt.drain()
    return rebuilt


def wait_timer_on_wheel(core: CoreDriver, task: str, timeout_at: float) -> bool:
    """Whether ``task``'s wait timeout (at the wall instant ``timeout_at``) is on the
    wheel: taken off and put back, as ``at_wall`` put it there."""
    timer = Timer(core.deliveries.visible_due, task)
    deadline = timeout_at - core.tables.clock.offset
    if not core.wheel.cancel(deadline, timer):
        return False
    core.wheel.schedule(deadline, timer)
    return True


def a_waiting_task(core: CoreDriver, **more: Any) -> str:
    task = submit(core)
    assert suspend(core, receive(core), **more) == {"id": task, "state": "WAITING"}
    return task


def test_a_suspend_frees_the_worker_and_spends_no_attempt() -> None:
    core = CoreDriver()
    task = submit(core)
    first = receive(core)
    assert first["attempt"] == 1 and "signal" not in first
    assert suspend(core, first, timeout_seconds=600) == {"id": task, "state": "WAITING"}
    # Its lease ended: renewing or settling it is STALE_CLAIM; nothing to receive.
    renewed = core.call(Op.LEASE_RENEW, {"leases": [first["lease"]]})
    assert renewed["results"] == [ErrorCode.STALE_CLAIM.value]
    assert core.refused(Op.DELIVERY_COMPLETE, {"lease": first["lease"]}).code \
        is ErrorCode.STALE_CLAIM
    assert receive(core) is None
    view = status(core, task)
    assert view["state"] == "WAITING"
    assert view["signals"] == {"waiting_for": "approval", "timeout_at": core.wall(600),
                               "kept": [], "woken_by": None}
    assert core.call(Op.SCOPE_STATUS, {"scope": "s"})["tasks"] == {"WAITING": 1}
    assert core.call(Op.QUEUE_INSPECT, BOX)["waiting"] == 1
    # The signal makes it ready: the next delivery carries it, with the same attempt.
    assert signal(core, task, data={"ok": True}) == {"id": task, "state": "PENDING",
                                                      "woken": True}
    again = receive(core)
    assert again["attempt"] == 1
    assert again["signal"] == {"name": "approval", "data": {"ok": True}}
    # Carried by every delivery of it until it suspends again (a lost lease too).
    core.advance(31.0)
    third = receive(core)
    assert third["signal"] == {"name": "approval", "data": {"ok": True}}
    assert third["attempt"] == 2
    core.call(Op.DELIVERY_COMPLETE, {"lease": third["lease"], "outcome": "done"})
    assert status(core, task)["state"] == "SUCCEEDED"
    assert "signals" not in status(core, task)  # gone with its ending


def test_a_signal_sent_before_the_suspend_wakes_it_at_once() -> None:
    core = CoreDriver()
    task = submit(core)
    delivery = receive(core)
    # Sent while it runs (and one of another name): kept, nothing woken.
    assert signal(core, task, data=1) == {"id": task, "state": "RUNNING", "woken": False}
    assert signal(core, task, "payment", data=2)["woken"] is False
    assert signal(core, task, data=3)["woken"] is False
    assert status(core, task)["signals"]["kept"] == ["approval", "payment", "approval"]
    # The suspend takes the oldest kept signal of its name: ready at once.
    assert suspend(core, delivery) == {"id": task, "state": "PENDING"}
    second = receive(core)
    assert second["signal"] == {"name": "approval", "data": 1}
    assert suspend(core, second, "payment")["state"] == "PENDING"
    third = receive(core)
    assert third["signal"] == {"name": "payment", "data": 2}
    assert suspend(core, third)["state"] == "PENDING"
    assert receive(core)["signal"] == {"name": "approval", "data": 3}
    assert status(core, task)["signals"]["kept"] == []


def test_a_woken_task_is_handed_to_a_parked_receive_at_once() -> None:
    core = CoreDriver()
    task = a_waiting_task(core)
    parked = core.call(Op.RECEIVE, {**BOX, "wait": True, "timeout_ms": 60_000}, ALICE)
    assert not isinstance(parked, dict)
    signal(core, task, data="yes")
    [(_, (_, _, body))] = core.drain()
    assert body["delivery"]["signal"] == {"name": "approval", "data": "yes"}


def test_a_timeout_makes_it_ready_with_no_signal() -> None:
    core = CoreDriver()
    task = a_waiting_task(core, timeout_seconds=60)
    assert wait_timer_on_wheel(core, task, core.wall(60.0))  # its timeout: one entry
    core.advance(59.0)
    assert status(core, task)["state"] == "WAITING"
    core.advance(1.0)
    assert status(core, task)["state"] == "PENDING"
    delivery = receive(core)
    assert "signal" not in delivery and delivery["attempt"] == 1
    # A signal that was carried is not carried past a later wait that timed out.
    assert suspend(core, delivery, timeout_seconds=5)["state"] == "WAITING"
    signal(core, task)
    again = receive(core)
    assert again["signal"] == {"name": "approval", "data": None}
    suspend(core, again, timeout_seconds=5)
    timeout_at = core.wall(core.now + 5.0)
    core.advance(5.0)
    assert "signal" not in receive(core)
    assert not wait_timer_on_wheel(core, task, timeout_at)


def test_a_signal_takes_the_waits_timeout_off_the_wheel() -> None:
    core = CoreDriver()
    task = a_waiting_task(core, timeout_seconds=60)
    signal(core, task)
    assert not wait_timer_on_wheel(core, task, core.wall(60.0))


def test_the_default_and_the_longest_timeout_is_max_suspend_seconds() -> None:
    core = CoreDriver()
    task = a_waiting_task(core)
    assert status(core, task)["signals"]["timeout_at"] == core.wall(Limits.MAX_SUSPEND_SECONDS)


@pytest.mark.parametrize("ending", ["cancel", "deadline", "run cancelled"])
def test_cancel_a_deadline_and_its_runs_cancellation_end_a_waiting_task(ending: str) -> None:
    core = CoreDriver(runs=("s", "t"))
    where = {"scope": "t", "mailbox": "jobs"}
    deadline = {"deadline": core.wall(10.0)} if ending == "deadline" else {}
    task = core.call(Op.TASK_SUBMIT, {**where, "data": 1, **deadline})["id"]
    delivery = core.call(Op.RECEIVE, where)["delivery"]
    core.call(Op.TASK_SIGNAL, {**where, "task": task, "name": "other", "data": "x" * 100})
    core.call(Op.DELIVERY_SUSPEND, {"lease": delivery["lease"], "name": "approval",
                                    "timeout_seconds": 3600})
    usage = core.tenant_usage("default")["payload_bytes"]
    if ending == "cancel":
        core.call(Op.TASK_CANCEL, {**where, "task": task})
        expected = "CANCELLED"
    elif ending == "deadline":
        core.advance(10.0)
        expected = "EXPIRED"
    else:
        core.call(Op.SCOPE_CANCEL, {"scope": "t"})
        core.advance(0.1)
        expected = "CANCELLED"
    view = core.call(Op.TASK_STATUS, {**where, "task": task})
    assert view["state"] == expected and "signals" not in view
    # Its timeout left the wheel, its kept signal's bytes went back to its tenant, its
    # queue no longer counts it.
    assert not wait_timer_on_wheel(core, task, core.wall(3600.0))
    assert core.tenant_usage("default")["payload_bytes"] < usage
    if ending != "run cancelled":
        assert core.call(Op.QUEUE_INSPECT, where)["waiting"] == 0
    refusal = core.refused(Op.TASK_SIGNAL, {**where, "task": task, "name": "approval"})
    assert refusal.code is (
        ErrorCode.SCOPE_CANCELLED if ending == "run cancelled" else ErrorCode.INVALID_ARGUMENT
    )


def test_groups_and_result_waits_count_a_waiting_task_as_unfinished() -> None:
    core = CoreDriver()
    task = submit(core, group="g")
    suspend(core, receive(core))
    group = core.call(Op.GROUP_STATUS, {"scope": "s", "group": "g"})
    assert group["unfinished"] == 1 and group["counts"] == {"WAITING": 1}
    assert core.call(Op.TASK_RESULT, {**BOX, "task": task, "timeout_ms": 1000}) is not None
    core.refused(Op.TASK_RESULT, {**BOX, "task": task, "timeout_ms": 0})


def test_a_repeated_suspend_is_answered_as_the_first() -> None:
    core = CoreDriver()
    task = submit(core)
    delivery = receive(core)
    first = suspend(core, delivery)
    assert suspend(core, delivery) == first  # its reply was lost: the same answer
    # Another kind of settlement with that lease is STALE_CLAIM, and so is another tenant.
    assert core.refused(Op.DELIVERY_RELEASE, {"lease": delivery["lease"]}).code \
        is ErrorCode.STALE_CLAIM
    assert status(core, task)["state"] == "WAITING"
    # Remembered across a restart too.
    rebuilt = restarted(core)
    assert rebuilt.call(Op.DELIVERY_SUSPEND, {"lease": delivery["lease"], "name": "approval"}) \
        == first


def test_a_restart_from_the_journal_or_a_snapshot_holds_what_the_live_core_held() -> None:
    core = CoreDriver()
    waiting = a_waiting_task(core, timeout_seconds=100)
    woken = a_waiting_task(core)
    signal(core, woken, data=[1, 2])
    kept = submit(core, "kept")
    signal(core, kept, "later", {"n": 1})
    core.drain()
    snapshot = list(core.snapshot())
    for rebuilt in (restarted(core), restarted(core, snapshot)):
        assert state_of(rebuilt) == state_of(core)
        assert rebuilt.tenant_usage("default") == core.tenant_usage("default")
        assert rebuilt.call(Op.QUEUE_INSPECT, BOX) == core.call(Op.QUEUE_INSPECT, BOX)
        # It goes on as the live one would: the woken task carries its signal, the kept
        # signal wakes its suspend, the waiting one times out.
        deliveries = {d["id"]: d for d in rebuilt.call(Op.RECEIVE, {**BOX, "max": 10})
                      ["deliveries"]}
        assert deliveries[woken]["signal"] == {"name": "approval", "data": [1, 2]}
        assert rebuilt.call(Op.DELIVERY_SUSPEND, {"lease": deliveries[kept]["lease"],
                                                  "name": "later"})["state"] == "PENDING"
        rebuilt.advance(100.0)
        assert rebuilt.call(Op.TASK_STATUS, {**BOX, "task": waiting})["state"] == "PENDING"


def test_every_record_applied_twice_or_over_a_snapshot_changes_nothing() -> None:
    core = CoreDriver()
    a_waiting_task(core, timeout_seconds=10)
    woken = a_waiting_task(core)
    signal(core, woken)
    kept = submit(core)
    signal(core, kept, "x", 1)
    delivery = receive(core)
    suspend(core, delivery, timeout_seconds=5)  # the woken one waits again
    core.advance(10.0)  # both waits time out
    core.drain()
    twice = [rec for rec in core.records for _ in range(2)]
    assert state_of(restarted(core, twice)) == state_of(core)
    snapshot = list(core.snapshot())
    assert state_of(restarted(core, snapshot + core.records)) == state_of(core)
    kinds = {rec[0] for rec in core.records}
    assert {Rec.SUSPENDED, Rec.SIGNALLED, Rec.WAIT_TIMED_OUT} <= kinds


def test_bad_signals_are_refused_with_a_clear_code_and_change_nothing() -> None:
    core = CoreDriver(tenants={ALICE: ("default", True), BOB: ("default", True),
                               3: ("other", True)})
    task = a_waiting_task(core)
    core.create_runs("s", conn=3)
    core.drain()
    records = len(core.records)
    bad: list[tuple[dict[str, Any], ErrorCode, str]] = [
        ({"name": ""}, ErrorCode.INVALID_ARGUMENT, "name"),
        ({"name": 7}, ErrorCode.INVALID_ARGUMENT, "name must be a string"),
        ({"name": "n" * (Limits.MAX_SIGNAL_NAME_BYTES + 1)}, ErrorCode.INVALID_ARGUMENT, "name"),
        ({"name": "approval", "data": "x" * Limits.MAX_SIGNAL_DATA_BYTES},
         ErrorCode.INVALID_ARGUMENT, "max_signal_data_bytes"),
        ({"name": "payment"}, ErrorCode.INVALID_ARGUMENT, "waits for the signal 'approval'"),
        ({"name": "approval", "task": "t-nope"}, ErrorCode.NOT_FOUND, "no task"),
    ]
    for args, code, message in bad:
        refusal = core.refused(Op.TASK_SIGNAL, {**BOX, "task": task, **args})
        assert refusal.code is code and message in str(refusal), (args, refusal)
    # Another tenant's task is one that does not exist.
    other = core.refused(Op.TASK_SIGNAL, {**BOX, "task": task, "name": "approval"}, 3)
    assert other.code is ErrorCode.NOT_FOUND
    # A message is no task.
    message = core.call(Op.MESSAGE_SEND, {**BOX, "data": 1})["id"]
    assert core.refused(Op.TASK_SIGNAL, {**BOX, "task": message, "name": "a"}).code \
        is ErrorCode.NOT_FOUND
    core.drain()
    assert len(core.records) == records + 1  # the message's, nothing of the refusals
    assert status(core, task)["signals"]["kept"] == []


def test_a_signal_to_a_finished_task_is_refused_naming_its_state() -> None:
    core = CoreDriver()
    task = submit(core)
    core.call(Op.DELIVERY_COMPLETE, {"lease": receive(core)["lease"], "outcome": 1})
    refusal = core.refused(Op.TASK_SIGNAL, {**BOX, "task": task, "name": "approval"})
    assert refusal.code is ErrorCode.INVALID_ARGUMENT
    assert "has ended (SUCCEEDED)" in str(refusal) and refusal.details == {"state": "SUCCEEDED"}


def test_bad_suspends_are_refused_and_change_nothing() -> None:
    core = CoreDriver()
    submit(core)
    delivery = receive(core)
    for args, message in [
        ({}, "name is required"),
        ({"name": ""}, "name"),
        ({"name": "a", "timeout_seconds": -1}, "timeout_seconds"),
        ({"name": "a", "timeout_seconds": Limits.MAX_SUSPEND_SECONDS + 1}, "timeout_seconds"),
        ({"name": "a", "timeout_seconds": "soon"}, "timeout_seconds"),
    ]:
        refusal = core.refused(Op.DELIVERY_SUSPEND, {"lease": delivery["lease"], **args})
        assert refusal.code is ErrorCode.INVALID_ARGUMENT and message in str(refusal)
    # Another tenant's connection, a made-up handle: STALE_CLAIM.
    assert core.refused(Op.DELIVERY_SUSPEND, {"lease": b"\x00" * 16, "name": "a"}).code \
        is ErrorCode.STALE_CLAIM
    # A message cannot suspend.
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})
    core.call(Op.MESSAGE_SEND, {**BOX, "data": 1})
    message = receive(core)
    refusal = core.refused(Op.DELIVERY_SUSPEND, {"lease": message["lease"], "name": "a"})
    assert refusal.code is ErrorCode.INVALID_ARGUMENT and "only a task" in str(refusal)
    assert core.call(Op.QUEUE_INSPECT, BOX)["running"] == 1  # still its worker's


def test_a_task_keeps_at_most_max_signals_kept() -> None:
    core = CoreDriver()
    task = submit(core)
    for n in range(Limits.MAX_SIGNALS_KEPT):
        signal(core, task, f"s{n}")
    refusal = core.refused(Op.TASK_SIGNAL, {**BOX, "task": task, "name": "one more"})
    assert refusal.code is ErrorCode.RESOURCE_EXHAUSTED
    assert refusal.details == {"limit": Limits.MAX_SIGNALS_KEPT}
    # A suspend takes one: room for one more.
    assert suspend(core, receive(core), "s3")["state"] == "PENDING"
    signal(core, task, "one more")


def test_signal_data_counts_in_its_tenants_stored_bytes() -> None:
    limits = TenantLimits(payload_bytes=100_000)
    core = CoreDriver(tenant_limits=limits)
    task = submit(core)
    before = core.tenant_usage("default")["payload_bytes"]
    chunk = "x" * 40_000
    signal(core, task, "a", chunk)
    signal(core, task, "b", chunk)
    refusal = core.refused(Op.TASK_SIGNAL, {**BOX, "task": task, "name": "c", "data": chunk})
    assert refusal.code is ErrorCode.RESOURCE_EXHAUSTED and "payload bytes" in str(refusal)
    delivery = receive(core)
    suspend(core, delivery, "a")  # woken by "a": carried, still held
    again = receive(core)
    suspend(core, again, "b")  # "a" no longer carried: its bytes go back
    assert core.tenant_usage("default")["payload_bytes"] - before < 2 * 40_000
    core.call(Op.DELIVERY_COMPLETE, {"lease": receive(core)["lease"]})
    assert core.tenant_usage("default")["payload_bytes"] == before


def test_a_waiting_task_and_a_kept_signal_move_with_their_run_to_another_shard() -> None:
    a, b = shard("a", 1), shard("b", 2)
    run = placed("w")
    a.create_runs(run)
    where = {"scope": run, "mailbox": "jobs"}
    waiting = a.call(Op.TASK_SUBMIT, {**where, "data": 1})["id"]
    delivery = a.call(Op.RECEIVE, where)["delivery"]
    a.call(Op.DELIVERY_SUSPEND, {"lease": delivery["lease"], "name": "approval",
                                 "timeout_seconds": 60})
    kept = a.call(Op.TASK_SUBMIT, {**where, "data": 2})["id"]
    a.call(Op.TASK_SIGNAL, {**where, "task": kept, "name": "payment", "data": 10})
    a.drain()
    assert move(a, b, slot(run))["runs"] == 1
    assert a.drop_slots(a.now, slot(run), slot(run)) == 1  # the source lets it go whole
    assert ("default", run) not in a.scopes
    assert not wait_timer_on_wheel(a, waiting, a.wall(60.0))  # nothing of it left there
    assert b.call(Op.TASK_STATUS, {**where, "task": waiting})["state"] == "WAITING"
    assert b.call(Op.QUEUE_INSPECT, where)["waiting"] == 1
    assert wait_timer_on_wheel(b, waiting, a.wall(60.0))  # its timeout runs on b
    other = b.call(Op.RECEIVE, where)["delivery"]
    assert other["id"] == kept
    assert b.call(Op.DELIVERY_SUSPEND, {"lease": other["lease"], "name": "payment"}) == {
        "id": kept, "state": "PENDING"}
    assert b.call(Op.RECEIVE, where)["delivery"]["signal"] == {"name": "payment", "data": 10}
    b.call(Op.TASK_SIGNAL, {**where, "task": waiting, "name": "approval", "data": "ok"})
    assert b.call(Op.RECEIVE, where)["delivery"]["signal"] == {"name": "approval", "data": "ok"}
