"""DEAD_LETTER_DELETE on the pure core (fake clock): a deleted dead letter leaves its list
and its tenant's stored bytes, as one DEAD_LETTER_DELETED record that a restart replays
(twice harmlessly) and a snapshot agrees with; a bad request (an id not on the list,
another tenant's run, a client token, no id) is refused and writes nothing.

Connections: ALICE (tenant "acme", admin), CAROL (tenant "acme", client), BOB (tenant
"globex", admin).
"""

from __future__ import annotations

from typing import Any

from support.core import ALICE, BOB, CAROL, HOLDERS, CoreDriver, on_disk

from rsd.core import Rec
from rsproto import ErrorCode, Op

TENANTS = {ALICE: ("acme", True), CAROL: ("acme", False), BOB: ("globex", True)}


def with_dead_letters(count: int, conn: int = ALICE, run: str = "s") -> CoreDriver:
    """A core whose run ``run`` of ``conn``'s tenant has ``count`` dead letters in
    mailbox "once" (keys k0.., data 0..)."""
    core = CoreDriver(holders={c: HOLDERS[c] for c in TENANTS}, tenants=TENANTS)
    core.call(Op.MAILBOX_ENSURE, {"name": "once", "max_attempts": 1}, conn)
    for n in range(count):
        core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "once", "data": {"n": n},
                                   "key": f"k{n}"}, conn)
    for _ in range(count):
        got = core.call(Op.RECEIVE, {"scope": run, "mailbox": "once"}, conn)
        core.call(Op.DELIVERY_REJECT, {"lease": got["delivery"]["lease"], "reason": "bad"}, conn)
    core.drain()
    return core


BOX = {"scope": "s", "mailbox": "once"}


def restarted(core: CoreDriver, records: list[Any] | None = None) -> CoreDriver:
    """A fresh core (its connections said HELLO again) that replayed ``records`` (by
    default the journal so far), as recovery does after a restart."""
    rebuilt = core.fresh({c: HOLDERS[c] for c in TENANTS})
    for rec in core.records if records is None else records:
        rebuilt.apply(on_disk(rec), core.now)
    rebuilt.recovered(core.now, clean=True)
    return rebuilt


def ids(core: CoreDriver, conn: int = ALICE) -> list[str]:
    return [e["id"] for e in core.call(Op.ADMIN_DEAD_LETTERS, BOX, conn)["items"]]


def test_a_delete_is_one_record_that_a_restart_replays() -> None:
    core = with_dead_letters(3)
    first, second, third = ids(core)
    stored = core.tenant_usage("acme")["payload_bytes"]
    reply = core.call(Op.DEAD_LETTER_DELETE, {**BOX, "id": second})
    assert reply == {"deleted": second, "left": 2}
    assert ids(core) == [first, third]
    assert core.call(Op.QUEUE_INSPECT, BOX)["dead_letters"] == 2
    assert core.tenant_usage("acme")["payload_bytes"] < stored  # its data's bytes back
    core.drain()
    assert [rec[0] for rec in core.records[-1:]] == [Rec.DEAD_LETTER_DELETED]
    assert core.records[-1][1:] == ("s", "once", second, "acme")
    # A restart replays it; a record replayed twice changes nothing more.
    for rebuilt in (restarted(core), restarted(core, core.records + core.records[-1:])):
        assert ids(rebuilt) == [first, third]
        assert rebuilt.tenant_usage("acme") == core.tenant_usage("acme")
    # The task it came from is still FAILED: deleting the letter ends nothing else.
    assert core.call(Op.TASK_STATUS, {**BOX, "task": second})["state"] == "FAILED"


def test_a_snapshot_taken_after_a_delete_agrees_with_the_journal() -> None:
    core = with_dead_letters(2)
    first, second = ids(core)
    core.call(Op.DEAD_LETTER_DELETE, {**BOX, "id": first})
    core.drain()
    from_snapshot = restarted(core, list(core.snapshot()))
    from_journal = restarted(core)
    for rebuilt in (from_snapshot, from_journal):
        assert ids(rebuilt) == [second]
        assert rebuilt.tenant_usage("acme") == core.tenant_usage("acme")


def test_the_last_dead_letter_deleted_frees_its_queue() -> None:
    core = with_dead_letters(1)
    (only,) = ids(core)
    queues = core.work.queue_count
    assert core.call(Op.DEAD_LETTER_DELETE, {**BOX, "id": only}) == {"deleted": only, "left": 0}
    assert core.work.queue_count == queues - 1
    assert core.call(Op.ADMIN_QUEUES, {"scope": "s"})["mailboxes"] == []
    assert core.call(Op.ADMIN_DEAD_LETTERS, BOX) == {"items": [], "truncated": False,
                                                      "count": 0}


def test_a_cancelled_runs_dead_letters_may_be_deleted_not_requeued() -> None:
    core = with_dead_letters(2)
    first, _ = ids(core)
    core.call(Op.SCOPE_CANCEL, {"scope": "s"})
    assert core.refused(Op.DEAD_LETTER_REQUEUE, {**BOX, "id": first}).code == (
        ErrorCode.SCOPE_CANCELLED)
    assert core.call(Op.DEAD_LETTER_DELETE, {**BOX, "id": first})["left"] == 1


def test_bad_deletes_are_refused_and_write_nothing() -> None:
    core = with_dead_letters(2)
    listed = ids(core)
    first = listed[0]
    before, written = core.tenant_usage("acme"), len(core.records)
    refusals = [
        ({**BOX, "id": "t-999.acme"}, ALICE, ErrorCode.NOT_FOUND),  # not on the list
        ({**BOX, "mailbox": "jobs", "id": first}, ALICE, ErrorCode.NOT_FOUND),  # other box
        ({**BOX, "scope": "nope", "id": first}, ALICE, ErrorCode.NOT_FOUND),  # no such run
        ({**BOX, "id": first}, BOB, ErrorCode.NOT_FOUND),  # globex's admin: acme's run is
        ({**BOX, "id": first}, CAROL, ErrorCode.PERMISSION_DENIED),  # a client token
        (BOX, ALICE, ErrorCode.INVALID_ARGUMENT),  # no id
        ({**BOX, "id": 7}, ALICE, ErrorCode.INVALID_ARGUMENT),  # not a string
    ]
    for args, conn, code in refusals:
        assert core.refused(Op.DEAD_LETTER_DELETE, args, conn).code == code, (args, conn)
    assert core.drain() == [] and len(core.records) == written  # nothing written
    assert ids(core) == listed and core.tenant_usage("acme") == before
    # Deleted once, the same id is not there a second time.
    core.call(Op.DEAD_LETTER_DELETE, {**BOX, "id": first})
    assert core.refused(Op.DEAD_LETTER_DELETE, {**BOX, "id": first}).code == ErrorCode.NOT_FOUND


def test_an_admin_naming_another_tenant_deletes_in_its_run() -> None:
    """The tenant rule of every admin op (as DEAD_LETTER_REQUEUE's): an admin reads its
    own tenant unless it names another in ``tenant``."""
    core = with_dead_letters(1, conn=BOB)  # globex's run "s"
    theirs = {**BOX, "tenant": "globex"}
    (only,) = [e["id"] for e in core.call(Op.ADMIN_DEAD_LETTERS, theirs)["items"]]
    assert core.refused(Op.DEAD_LETTER_DELETE, {**BOX, "id": only}).code == ErrorCode.NOT_FOUND
    assert core.call(Op.DEAD_LETTER_DELETE, {**theirs, "id": only})["left"] == 0
