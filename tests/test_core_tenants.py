"""Tenants on the pure core: another tenant's objects do not exist for you.

Connections: ALICE (tenant "acme", admin), CAROL (tenant "acme", client), BOB (tenant
"globex", client). For every kind of object, BOB's request naming ACME's object gets
exactly the answer (same code, same message, or the same reply) that the same request
gets from a core where that object does not exist, and ACME's object is untouched.
Beside: admin-only ops, the per-tenant limits, and recovery keeping tenants, also from
files written before tenants existed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.core import ALICE, BOB, CAROL, HOLDERS, CoreDriver, on_disk

from rsd.core import Rec
from rsd.core.ground.tenants import TenantLimits
from rsd.core.upgrade import downgrade
from rsd.disk.datadir import segment_name
from rsd.disk.logfile import JOURNAL_MAGIC, encode_batch, file_header, new_salt
from rsd.startup import recover
from rsproto import ErrorCode, Kind, Op, Push

TENANTS = {ALICE: ("acme", True), CAROL: ("acme", False), BOB: ("globex", False)}
ACQ = {"scope": "s", "key": "k"}
BOX = {"scope": "s", "mailbox": "jobs"}


def tenants_core(**options: Any) -> CoreDriver:
    return CoreDriver(holders={c: HOLDERS[c] for c in TENANTS}, tenants=TENANTS, **options)


def answer(core: CoreDriver, op: int, args: dict[str, Any], conn: int) -> Any:
    """What ``conn`` is told: the reply, or (code, message) of the refusal."""
    try:
        return core.call(op, args, conn)
    except Exception as exc:  # CoreError: compared by code and message
        return (exc.code, exc.message)  # type: ignore[attr-defined]


def as_if_missing(op: int, args: dict[str, Any]) -> Any:
    """What BOB would be told if ACME had made nothing at all."""
    return answer(tenants_core(), op, args, BOB)


def assert_hidden(core: CoreDriver, op: int, args: dict[str, Any]) -> None:
    got = answer(core, op, args, BOB)
    assert got == as_if_missing(op, args), (op, args, got)


@pytest.fixture
def core() -> CoreDriver:
    return tenants_core()


# ---- isolation, object by object -----------------------------------------------------------


def test_another_tenants_run_of_the_same_id_is_a_run_not_created_yet(core: CoreDriver) -> None:
    run = core.call(Op.SCOPE_CREATE, {})["scope"]
    core.call(Op.CLAIM_ACQUIRE, {"scope": run, "key": "k"})
    args = {"scope": run, "key": "k"}
    assert_hidden(core, Op.CLAIM_INSPECT, args)
    assert_hidden(core, Op.CLAIM_ACQUIRE, args)
    assert_hidden(core, Op.SCOPE_CANCEL, {"scope": run})
    assert core.refused(Op.CLAIM_ACQUIRE, args, BOB).code == ErrorCode.NOT_FOUND
    # BOB may create a run of that very id: his own, beside ACME's.
    assert core.call(Op.SCOPE_CREATE, {"scope": run}, BOB) == {"scope": run, "created": True}
    assert core.call(Op.CLAIM_ACQUIRE, args, BOB)["generation"] >= 1  # BOB's own run
    # BOB cancelling "his" run of that id cancels nothing of ACME's.
    core.call(Op.SCOPE_CANCEL, {"scope": run}, BOB)
    assert core.call(Op.CLAIM_INSPECT, args)["held"] is True
    assert core.call(Op.CLAIM_ACQUIRE, {"scope": run, "key": "other"})["generation"] >= 1
    assert sorted(core.scopes) == sorted(
        [("acme", run), ("acme", "s"), ("globex", run), ("globex", "s")]
    )


def test_another_tenants_claim_is_free_for_you_and_stays_held_for_its_owner(
    core: CoreDriver,
) -> None:
    mine = core.call(Op.CLAIM_ACQUIRE, ACQ)
    assert_hidden(core, Op.CLAIM_INSPECT, ACQ)
    theirs = core.call(Op.CLAIM_ACQUIRE, ACQ, BOB)  # not CLAIM_HELD: another key
    assert theirs["lease"] != mine["lease"]
    assert core.refused(Op.CLAIM_ACQUIRE, ACQ, CAROL).code == ErrorCode.CLAIM_HELD


@pytest.mark.parametrize(
    ("op", "extra"),
    [
        (Op.TASK_STATUS, {}),
        (Op.TASK_RESULT, {"timeout_ms": 0}),
        (Op.TASK_JOIN, {"subscriber_id": "spy"}),
        (Op.TASK_DETACH, {"subscriber_id": "planner"}),
        (Op.TASK_CANCEL, {}),
    ],
)
def test_another_tenants_task_is_not_found_like_a_missing_one(
    core: CoreDriver, op: int, extra: dict[str, Any]
) -> None:
    task = core.call(Op.TASK_SUBMIT, {**BOX, "data": 1, "key": "t", "subscriber_id": "planner"})
    args = {"scope": "s", "task": task["id"], **extra}
    assert answer(core, op, args, BOB)[0] == ErrorCode.NOT_FOUND
    assert_hidden(core, op, args)
    view = core.call(Op.TASK_STATUS, {"scope": "s", "task": task["id"]}, CAROL)
    assert view["state"] == "PENDING" and view["subscribers"] == ["planner"]


def test_another_tenants_queue_gives_you_nothing_to_receive(core: CoreDriver) -> None:
    core.call(Op.TASK_SUBMIT, {**BOX, "data": "secret"})
    assert_hidden(core, Op.RECEIVE, BOX)
    assert_hidden(core, Op.QUEUE_INSPECT, BOX)
    assert core.call(Op.RECEIVE, BOX, CAROL)["delivery"]["data"] == "secret"


def test_a_parked_receive_is_never_handed_another_tenants_item(core: CoreDriver) -> None:
    core.call(Op.RECEIVE, {**BOX, "wait": True, "timeout_ms": 10_000}, BOB)
    core.call(Op.TASK_SUBMIT, {**BOX, "data": "secret"})
    assert core.drain() == []  # nothing handed to BOB
    assert core.call(Op.RECEIVE, BOX, CAROL)["delivery"]["data"] == "secret"


@pytest.mark.parametrize(
    ("op", "extra"),
    [
        (Op.DELIVERY_COMPLETE, {"outcome": "forged"}),
        (Op.DELIVERY_RETRY, {}),
        (Op.DELIVERY_RELEASE, {}),
        (Op.DELIVERY_REJECT, {}),
    ],
)
def test_another_tenants_delivery_cannot_be_settled_and_is_stale_like_a_missing_one(
    core: CoreDriver, op: int, extra: dict[str, Any]
) -> None:
    task = core.call(Op.TASK_SUBMIT, {**BOX, "data": 1, "key": "t"})
    lease = core.call(Op.RECEIVE, BOX)["delivery"]["lease"]
    args = {"lease": lease, **extra}
    assert answer(core, op, args, BOB)[0] == ErrorCode.STALE_CLAIM
    assert_hidden(core, op, args)
    assert core.call(Op.TASK_STATUS, {"scope": "s", "task": task["id"]})["state"] == "RUNNING"
    core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": "real"}, CAROL)
    view = core.call(Op.TASK_STATUS, {"scope": "s", "task": task["id"]})
    assert view["outcome"] == "real"


def test_mailbox_definitions_are_per_tenant(core: CoreDriver) -> None:
    core.call(Op.MAILBOX_ENSURE, {"name": "private", "max_attempts": 2})
    box = {"scope": "s", "mailbox": "private"}
    assert_hidden(core, Op.TASK_SUBMIT, {**box, "data": 1})  # NOT_FOUND, same message
    assert_hidden(core, Op.QUEUE_INSPECT, box)
    # BOB's mailbox of the same name is his own, with his own settings.
    theirs = core.call(Op.MAILBOX_ENSURE, {"name": "private", "max_attempts": 9}, BOB)
    assert theirs["created"] is True and theirs["max_attempts"] == 9
    mine = core.call(Op.MAILBOX_ENSURE, {"name": "private", "max_attempts": 2})
    assert mine["created"] is False and mine["max_attempts"] == 2


def test_another_tenants_dead_letters_are_not_listed(core: CoreDriver) -> None:
    core.call(Op.TASK_SUBMIT, {**BOX, "data": "secret"})
    core.call(Op.DELIVERY_REJECT, {"lease": core.call(Op.RECEIVE, BOX)["delivery"]["lease"]})
    assert core.call(Op.DEAD_LETTERS, BOX, CAROL)["items"]
    assert_hidden(core, Op.DEAD_LETTERS, BOX)


def test_another_tenants_lease_cannot_be_renewed_or_released_and_is_untouched(
    core: CoreDriver,
) -> None:
    lease = core.call(Op.CLAIM_ACQUIRE, {**ACQ, "lease_seconds": 10})["lease"]
    live = core.leases.get(lease)
    assert live is not None
    before = (live.expires_at, live.length, live.conn)
    core.now = 5.0
    assert_hidden(core, Op.LEASE_RENEW, {"leases": [lease, [lease, 600]]})
    assert core.call(Op.LEASE_RENEW, {"leases": [lease]}, BOB)["results"] == ["STALE_CLAIM"]
    assert answer(core, Op.CLAIM_RELEASE, {"lease": lease}, BOB)[0] == ErrorCode.STALE_CLAIM
    assert_hidden(core, Op.CLAIM_RELEASE, {"lease": lease})
    assert (live.expires_at, live.length, live.conn) == before
    assert core.drain() == [] and not [r for r in core.records if r[0] == Rec.LEASE_RESIZED]
    core.advance(5.01)  # it expires when its owner's renewals said, and ALICE is told
    pushes = [(conn, msg) for conn, msg in core.drain() if msg[0] == Kind.PUSH]
    assert pushes == [(ALICE, [Kind.PUSH, Push.LEASE_LOST, {"lease": lease,
                                                             "reason": "expired"}])]


def test_a_waiter_of_another_tenant_is_never_granted_your_key(core: CoreDriver) -> None:
    lease = core.call(Op.CLAIM_ACQUIRE, ACQ)["lease"]
    core.call(Op.CLAIM_ACQUIRE, {**ACQ, "wait": True, "timeout_ms": 60_000}, CAROL)
    core.call(Op.CLAIM_RELEASE, {"lease": lease})
    granted = [conn for conn, msg in core.drain() if msg[0] == Kind.REPLY]
    assert granted == [CAROL]


# ---- admin-only ops ------------------------------------------------------------------------


def test_admin_rights_are_per_connection(core: CoreDriver) -> None:
    assert core.is_admin(ALICE) and not core.is_admin(CAROL) and not core.is_admin(BOB)
    plain = CoreDriver()  # without tenants, every connection is "default" and admin
    assert plain.is_admin(ALICE) and plain.tenants.of(ALICE) == "default"
    core.disconnected(ALICE)
    core.connected(ALICE, "alice", tenant="acme", admin=False)
    assert not core.is_admin(ALICE)


def test_cancelling_another_tenants_run_is_admin_only(core: CoreDriver) -> None:
    core.call(Op.CLAIM_ACQUIRE, ACQ, BOB)
    refused = core.refused(Op.SCOPE_CANCEL, {"scope": "s", "tenant": "acme"}, BOB)
    assert refused.code == ErrorCode.PERMISSION_DENIED
    refused = core.refused(Op.SCOPE_CANCEL, {"scope": "s", "tenant": "globex"}, CAROL)
    assert refused.code == ErrorCode.PERMISSION_DENIED
    assert core.drain() == [] and core.call(Op.CLAIM_INSPECT, ACQ, BOB)["held"] is True
    done = core.call(Op.SCOPE_CANCEL, {"scope": "s", "tenant": "globex"}, ALICE)
    assert done["claims"] == 1
    assert core.refused(Op.CLAIM_ACQUIRE, ACQ, BOB).code == ErrorCode.SCOPE_CANCELLED
    assert core.call(Op.CLAIM_ACQUIRE, ACQ, ALICE)["generation"] >= 1  # acme's "s" lives
    # Naming one's own tenant is no admin op.
    core.create_runs("t", conn=CAROL)
    assert core.call(Op.SCOPE_CANCEL, {"scope": "t", "tenant": "acme"}, CAROL)["cancelled"]


# ---- per-tenant limits ---------------------------------------------------------------------


def limited(**limits: int) -> CoreDriver:
    return tenants_core(tenant_limits=TenantLimits(**limits))


def assert_exhausted(core: CoreDriver, op: int, args: dict[str, Any], conn: int,
                     limit: str) -> None:
    before = len(core.records) + len(core.effects.records)
    error = core.refused(op, args, conn)
    assert error.code == ErrorCode.RESOURCE_EXHAUSTED and limit in error.message
    assert error.details == {"limit": limit, "value": error.details["value"]}
    assert len(core.records) + len(core.effects.records) == before  # nothing changed


def test_runs_per_tenant_are_limited_however_a_run_is_created() -> None:
    core = limited(runs=3)  # acme's "s" is its first
    core.call(Op.SCOPE_CREATE, {})
    assert core.call(Op.SCOPE_CREATE, {"scope": "a"}, CAROL)["created"] is True
    name = "max_runs_per_tenant"
    assert_exhausted(core, Op.SCOPE_CREATE, {}, ALICE, name)
    assert_exhausted(core, Op.SCOPE_CREATE, {"scope": "c"}, CAROL, name)
    # Naming a run never created makes none, whatever the op: NOT_FOUND, nothing changed.
    before = len(core.records) + len(core.effects.records)
    for op, args in [
        (Op.CLAIM_ACQUIRE, {"scope": "c", "key": "k"}),
        (Op.SCOPE_CANCEL, {"scope": "never-used"}),
        (Op.TASK_SUBMIT, {"scope": "c", "mailbox": "jobs", "data": 1}),
        (Op.RECEIVE, {"scope": "c", "mailbox": "jobs", "wait": True}),
    ]:
        assert core.refused(op, args).code == ErrorCode.NOT_FOUND
    assert len(core.records) + len(core.effects.records) == before
    assert core.call(Op.SCOPE_CREATE, {"scope": "a"}) == {"scope": "a", "created": False}
    assert core.call(Op.CLAIM_ACQUIRE, {"scope": "a", "key": "k2"})  # an existing run
    assert core.call(Op.SCOPE_CREATE, {}, BOB)  # another tenant's count
    assert core.tenant_usage("acme")["runs"] == 3


def test_held_claims_per_tenant_are_limited() -> None:
    core = limited(claims=3)
    core.create_runs("t")
    leases = [core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": f"k{i}"}, ALICE if i % 2
                        else CAROL)["lease"] for i in range(3)]
    assert_exhausted(core, Op.CLAIM_ACQUIRE, {"scope": "t", "key": "x"}, ALICE,
                     "max_claims_per_tenant")
    core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k9"}, BOB)
    core.call(Op.CLAIM_RELEASE, {"lease": leases[0]}, CAROL)
    assert core.call(Op.CLAIM_ACQUIRE, {"scope": "t", "key": "x"})


def test_tasks_and_messages_per_tenant_are_limited() -> None:
    core = limited(items=2)
    core.call(Op.TASK_SUBMIT, {**BOX, "data": 1, "key": "a"})
    core.call(Op.MESSAGE_SEND, {**BOX, "data": 2}, CAROL)
    name = "max_items_per_tenant"
    assert_exhausted(core, Op.TASK_SUBMIT, {**BOX, "data": 3}, ALICE, name)
    assert_exhausted(core, Op.MESSAGE_SEND, {**BOX, "data": 3}, ALICE, name)
    # Joining the existing task makes nothing new: allowed.
    assert core.call(Op.TASK_SUBMIT, {**BOX, "data": 1, "key": "a"})["created"] is False
    assert core.call(Op.TASK_SUBMIT, {**BOX, "data": 3}, BOB)
    delivery = core.call(Op.RECEIVE, BOX)["delivery"]
    assert delivery["kind"] == "task"
    delivery = core.call(Op.RECEIVE, BOX)["delivery"]
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})  # a message is forgotten
    assert core.call(Op.MESSAGE_SEND, {**BOX, "data": 4})


def test_pending_waits_per_tenant_are_limited_across_its_connections() -> None:
    core = limited(waits=2)
    park = {**BOX, "wait": True, "timeout_ms": 60_000}
    core.call(Op.RECEIVE, park, ALICE, rid=1)
    core.call(Op.RECEIVE, park, CAROL, rid=2)
    assert_exhausted(core, Op.RECEIVE, park, ALICE, "max_waits_per_tenant")
    assert core.call(Op.RECEIVE, park, BOB, rid=3) is not None
    core.call(Op.CANCEL, {"request": 2}, CAROL)
    core.call(Op.RECEIVE, park, CAROL, rid=4)
    core.disconnected(ALICE)
    assert core.tenant_usage("acme")["waits"] == 1
    assert core.waits.count(ALICE) == 0


def test_mailboxes_per_tenant_are_limited() -> None:
    core = limited(mailboxes=2)  # "jobs" is the first
    core.call(Op.MAILBOX_ENSURE, {"name": "second"})
    assert_exhausted(core, Op.MAILBOX_ENSURE, {"name": "third"}, ALICE,
                     "max_mailboxes_per_tenant")
    assert core.call(Op.MAILBOX_ENSURE, {"name": "second", "max_attempts": 3})  # a change
    assert core.call(Op.MAILBOX_ENSURE, {"name": "third"}, BOB)


# ---- recovery keeps tenants ----------------------------------------------------------------


def _history(core: CoreDriver) -> dict[str, Any]:
    run = core.call(Op.SCOPE_CREATE, {})["scope"]
    held = core.call(Op.CLAIM_ACQUIRE, ACQ)["lease"]
    task = core.call(Op.TASK_SUBMIT, {**BOX, "data": "d", "key": "t"})["id"]
    core.call(Op.MAILBOX_ENSURE, {"name": "private", "max_attempts": 2})
    core.call(Op.CLAIM_ACQUIRE, ACQ, BOB)
    core.drain()
    return {"run": run, "held": held, "task": task}


def _assert_tenants_kept(rebuilt: CoreDriver, seen: dict[str, Any]) -> None:
    for conn, holder in HOLDERS.items():
        if conn in TENANTS:
            rebuilt.connected(conn, holder, tenant=TENANTS[conn][0], admin=TENANTS[conn][1])
    task = {"scope": "s", "task": seen["task"]}
    assert rebuilt.call(Op.TASK_STATUS, task, CAROL)["state"] == "PENDING"
    assert rebuilt.refused(Op.TASK_STATUS, task, BOB).code == ErrorCode.NOT_FOUND
    assert rebuilt.call(Op.LEASE_RENEW, {"leases": [seen["held"]]}, CAROL)["results"] == [None]
    assert rebuilt.call(Op.LEASE_RENEW, {"leases": [seen["held"]]}, BOB)["results"] == [
        "STALE_CLAIM"
    ]
    assert rebuilt.call(Op.CLAIM_INSPECT, ACQ, BOB)["holder"] == "bob"
    assert rebuilt.call(Op.CLAIM_INSPECT, ACQ, CAROL)["holder"] == "alice"
    box = {"scope": "s", "mailbox": "private"}
    assert rebuilt.refused(Op.QUEUE_INSPECT, box, BOB).code == ErrorCode.NOT_FOUND
    assert rebuilt.call(Op.MAILBOX_ENSURE, {"name": "private", "max_attempts": 2})[
        "created"] is False
    assert ("acme", seen["run"]) in rebuilt.scopes


def test_a_journal_replay_keeps_every_objects_tenant(core: CoreDriver) -> None:
    seen = _history(core)
    _assert_tenants_kept(core.replay(), seen)


def test_a_snapshot_keeps_every_objects_tenant(core: CoreDriver) -> None:
    seen = _history(core)
    rebuilt = core.fresh(holders={})
    for rec in core.snapshot():
        rebuilt.apply(on_disk(rec), core.now)
    assert sorted(rebuilt.snapshot()) == sorted(core.snapshot())
    _assert_tenants_kept(rebuilt, seen)


def test_a_data_directory_from_before_tenants_recovers_as_tenant_default(
    tmp_path: Path,
) -> None:
    """A format version 2 journal, records in their old layout (no tenant, lease ids):
    its objects are tenant "default"'s, and its leases (by id) cannot be presented."""
    old = CoreDriver()  # every connection "default", as before tenants
    run = old.call(Op.SCOPE_CREATE, {})["scope"]
    lease = old.call(Op.CLAIM_ACQUIRE, ACQ)["lease"]
    task = old.call(Op.TASK_SUBMIT, {**BOX, "data": "d", "key": "t"})["id"]
    old.call(Op.RECEIVE, BOX)
    old.drain()
    salt = new_salt()
    data = file_header(JOURNAL_MAGIC, 1, salt, version=2) + encode_batch(
        [downgrade(on_disk(rec)) for rec in old.records], salt
    )
    (tmp_path / segment_name(1)).write_bytes(data)
    core = CoreDriver(holders={}, mailbox=None)
    recover(tmp_path, core, 0.0, policy="no")
    core.connected(ALICE, "alice")
    core.connected(BOB, "bob", tenant="globex", admin=False)
    assert ("default", run) in core.scopes
    assert core.call(Op.TASK_STATUS, {"scope": "s", "task": task})["state"] == "RUNNING"
    assert core.refused(Op.TASK_STATUS, {"scope": "s", "task": task}, BOB).code == (
        ErrorCode.NOT_FOUND
    )
    assert core.call(Op.CLAIM_INSPECT, ACQ)["holder"] == "alice"
    # The old lease is known by its id alone: no handle presents it, it just expires.
    assert core.call(Op.LEASE_RENEW, {"leases": [lease]})["results"] == ["STALE_CLAIM"]
    core.advance(30.01)
    assert core.call(Op.CLAIM_INSPECT, ACQ)["held"] is False
    assert core.call(Op.RECEIVE, BOX)["delivery"]["id"] == task  # back on the queue


def test_the_sdk_raises_permission_denied_error_for_permission_denied() -> None:
    from rsclient import PermissionDeniedError, RunstateError
    from rsclient.errors import error_for

    error = error_for("PERMISSION_DENIED", "SERVER_STATS is an admin operation")
    assert isinstance(error, PermissionDeniedError) and isinstance(error, RunstateError)
    assert error.code == "PERMISSION_DENIED"
