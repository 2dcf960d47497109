"""The admin ops on the pure core: admin-only, tenant-scoped, paged in bounded work (from
the oldest or the newest), and a dead letter's requeue recorded and replayed.

Connections: ALICE (tenant "acme", admin), CAROL (tenant "acme", client), BOB (tenant
"globex", client).
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CAROL, HOLDERS, CoreDriver, on_disk

from rsd.core import DEFERRED, Rec
from rsd.core.ground.pages import BLOCK, PagedIndex
from rsd.policy import Policy
from rsproto import ErrorCode, Op

TENANTS = {ALICE: ("acme", True), CAROL: ("acme", False), BOB: ("globex", False)}
LISTINGS = [
    (Op.ADMIN_SCOPES, {}),
    (Op.ADMIN_CLAIMS, {"scope": "s"}),
    (Op.ADMIN_TASKS, {"scope": "s"}),
    (Op.ADMIN_TASK, {"scope": "s", "task": "t-1"}),
    (Op.ADMIN_POOLS, {}),
    (Op.DEAD_LETTER_REQUEUE, {"scope": "s", "mailbox": "jobs", "all": True}),
    (Op.SNAPSHOT_NOW, {}),
    (Op.ADMIN_DEAD_LETTERS, {"scope": "s", "mailbox": "jobs"}),
    (Op.DEAD_LETTER_DELETE, {"scope": "s", "mailbox": "jobs", "id": "t-1"}),
    (Op.ADMIN_GROUPS, {"scope": "s"}),
    (Op.ADMIN_QUOTAS, {}),
    (Op.ADMIN_MAILBOXES, {}),
    (Op.ADMIN_QUEUES, {"scope": "s"}),
]


def tenants_core() -> CoreDriver:
    return CoreDriver(holders={c: HOLDERS[c] for c in TENANTS}, tenants=TENANTS, runs=())


def walk(
    core: CoreDriver, op: int, field: str, args: dict[str, Any], limit: int, cursor: int = 0
) -> list[Any]:
    """Every page of a listing from ``cursor``; checks each page's bound on the way."""
    found: list[Any] = []
    pages = 0
    while cursor is not None:
        reply = core.call(op, {**args, "cursor": cursor, "limit": limit}, ALICE)
        assert len(reply[field]) <= limit
        found += reply[field]
        cursor = reply["next"]
        pages += 1
        assert pages < 10_000
    return found


@pytest.mark.parametrize(("op", "args"), LISTINGS)
def test_every_admin_op_refuses_a_client_role_connection(op: int, args: dict[str, Any]) -> None:
    core = tenants_core()
    core.call(Op.SCOPE_CREATE, {}, ALICE)
    err = core.refused(op, args, CAROL)
    assert err.code == ErrorCode.PERMISSION_DENIED
    assert "admin operation" in err.message
    assert core.drain() == [] and core.effects.snapshot_asks == []


def test_a_list_bigger_than_a_page_comes_back_whole_across_bounded_pages() -> None:
    core = CoreDriver(runs=())  # no run made at setup: the list is exactly these
    scopes = [core.call(Op.SCOPE_CREATE, {})["scope"] for _ in range(250)]
    assert [s["scope"] for s in walk(core, Op.ADMIN_SCOPES, "scopes", {}, 7)] == scopes
    keys = [f"k{i}" for i in range(230)]
    for key in keys:
        core.call(Op.CLAIM_ACQUIRE, {"scope": scopes[0], "key": key})
    claims = walk(core, Op.ADMIN_CLAIMS, "claims", {"scope": scopes[0]}, 50)
    assert [c["key"] for c in claims] == keys
    assert all(c["held"] and c["holder"] == "alice" for c in claims)
    for n in range(120):
        core.call(Op.TASK_SUBMIT, {"scope": scopes[1], "mailbox": "jobs", "data": n})
    tasks = walk(core, Op.ADMIN_TASKS, "tasks", {"scope": scopes[1]}, 1000)
    assert [t["id"] for t in tasks] == [f"t-{n}" for n in range(1, 121)]
    # The default page and the largest one are bounded; one larger is refused.
    reply = core.call(Op.ADMIN_SCOPES, {})
    assert len(reply["scopes"]) == Policy.ADMIN_PAGE_DEFAULT and reply["next"] is not None
    err = core.refused(Op.ADMIN_SCOPES, {"limit": Policy.ADMIN_PAGE_MAX + 1})
    assert err.code == ErrorCode.INVALID_ARGUMENT


def test_a_walk_survives_removals_between_pages_and_returns_each_survivor_once() -> None:
    core = CoreDriver()
    scope = core.call(Op.SCOPE_CREATE, {})["scope"]
    leases = {}
    for i in range(300):
        leases[f"k{i}"] = core.call(Op.CLAIM_ACQUIRE, {"scope": scope, "key": f"k{i}"})["lease"]
    first = core.call(Op.ADMIN_CLAIMS, {"scope": scope, "limit": 100})
    # Release every other claim, the page boundary's among them: compaction runs.
    for i in range(0, 300, 2):
        core.call(Op.CLAIM_RELEASE, {"lease": leases[f"k{i}"]})
    rest = walk(core, Op.ADMIN_CLAIMS, "claims", {"scope": scope}, 40, first["next"])
    seen = [c["key"] for c in first["claims"]] + [c["key"] for c in rest]
    assert len(seen) == len(set(seen))
    assert [f"k{i}" for i in range(100, 300) if i % 2] == [c["key"] for c in rest]


def test_a_page_looks_at_a_bounded_number_of_entries_whatever_was_removed() -> None:
    index: PagedIndex[int] = PagedIndex(lambda n: n % 1000 == 0)
    looked = 0

    def alive(n: int) -> bool:
        nonlocal looked
        looked += 1
        return n % 1000 == 0

    index.alive = alive
    for n in range(1, 100_001):
        index.add(n)
    found, cursor = index.page(0, 10, 40)
    assert found == [] and cursor == 40 and looked == 40  # short page, cursor to go on
    found, cursor = index.page(cursor, 10, 40)
    assert looked == 80 and cursor == 80


def test_filters_by_state_and_mailbox_and_scope_to_the_tenant() -> None:
    core = tenants_core()  # (acme's item ids carry its name: ids are counted per tenant)
    run = core.call(Op.SCOPE_CREATE, {}, ALICE)["scope"]
    core.call(Op.MAILBOX_ENSURE, {"name": "other"}, ALICE)
    for n in range(5):
        core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": n}, ALICE)
    core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "other", "data": 9}, ALICE)
    core.call(Op.RECEIVE, {"scope": run, "mailbox": "jobs"}, ALICE)
    args = {"scope": run, "state": "RUNNING"}
    assert [t["id"] for t in walk(core, Op.ADMIN_TASKS, "tasks", args, 2)] == ["t-1.acme"]
    args = {"scope": run, "mailbox": "other"}
    assert [t["id"] for t in walk(core, Op.ADMIN_TASKS, "tasks", args, 2)] == ["t-6.acme"]
    assert core.refused(Op.ADMIN_TASKS, {"scope": run, "state": "nope"}).code == (
        ErrorCode.INVALID_ARGUMENT
    )
    # globex's run of the same id does not exist for acme's admin unless it names globex.
    globex_run = core.call(Op.SCOPE_CREATE, {}, BOB)["scope"]
    core.call(Op.CLAIM_ACQUIRE, {"scope": globex_run, "key": "g"}, BOB)
    assert core.refused(Op.ADMIN_CLAIMS, {"scope": globex_run}).code == ErrorCode.NOT_FOUND
    theirs = core.call(Op.ADMIN_CLAIMS, {"scope": globex_run, "tenant": "globex"})
    assert [c["key"] for c in theirs["claims"]] == ["g"]
    assert [s["scope"] for s in core.call(Op.ADMIN_SCOPES, {})["scopes"]] == [run]
    listed = core.call(Op.ADMIN_SCOPES, {"tenant": "globex"})["scopes"]
    assert [s["scope"] for s in listed] == [globex_run]
    assert core.call(Op.ADMIN_SCOPES, {"tenant": "nobody"}) == {"scopes": [], "next": None}
    task = core.call(Op.ADMIN_TASK, {"scope": run, "task": "t-1.acme"})
    assert task["state"] == "RUNNING" and task["data"] == 0
    assert task["delivery"]["holder"] == "alice"
    err = core.refused(Op.ADMIN_TASK, {"scope": run, "task": "t-1.acme", "tenant": "globex"})
    assert err.code == ErrorCode.NOT_FOUND


def _dead_letters(core: CoreDriver, run: str, count: int) -> None:
    core.call(Op.MAILBOX_ENSURE, {"name": "once", "max_attempts": 1})
    for n in range(count):
        core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "once", "data": n, "key": f"k{n}"})
    for _ in range(count):
        got = core.call(Op.RECEIVE, {"scope": run, "mailbox": "once"})
        core.call(Op.DELIVERY_REJECT, {"lease": got["delivery"]["lease"], "reason": "bad"})


def test_a_requeue_is_recorded_and_replayed_and_takes_the_letter_off_the_list() -> None:
    core = CoreDriver()
    run = core.call(Op.SCOPE_CREATE, {})["scope"]
    _dead_letters(core, run, 3)
    box = {"scope": run, "mailbox": "once"}
    assert len(core.call(Op.DEAD_LETTERS, box)["items"]) == 3
    listed = core.call(Op.ADMIN_DEAD_LETTERS, {**box, "limit": 2})
    assert [e["id"] for e in listed["items"]] == ["t-2", "t-3"] and listed["count"] == 3
    one = core.call(Op.DEAD_LETTER_REQUEUE, {**box, "id": "t-2"})
    assert one == {"requeued": [{"id": "t-2", "new": "t-4"}], "left": 2}
    assert core.refused(Op.DEAD_LETTER_REQUEUE, {**box, "id": "t-2"}).code == (
        ErrorCode.NOT_FOUND
    )
    rest = core.call(Op.DEAD_LETTER_REQUEUE, {**box, "all": True, "limit": 1})
    assert rest == {"requeued": [{"id": "t-1", "new": "t-5"}], "left": 1}
    core.drain()
    kinds = [rec[0] for rec in core.records[-4:]]
    assert kinds == [Rec.ITEM_ENQUEUED, Rec.DEAD_LETTER_REQUEUED] * 2
    new = core.call(Op.TASK_STATUS, {"scope": run, "task": "t-4"})
    assert (new["state"], new["key"], new["attempt"]) == ("PENDING", "k1", 0)
    # The task key now names the requeued task: a resubmit of the same input joins it.
    joined = core.call(Op.TASK_SUBMIT, {**box, "data": 1, "key": "k1"})
    assert joined["id"] == "t-4" and not joined["created"]
    for rebuilt in (core.replay(), core.replay(core.records + core.records[-4:])):
        assert [e["id"] for e in rebuilt.call(Op.DEAD_LETTERS, box)["items"]] == ["t-3"]
        listed = rebuilt.call(Op.ADMIN_TASKS, {"scope": run, "state": "PENDING"})
        assert [t["id"] for t in listed["tasks"]] == ["t-4", "t-5"]
    assert core.refused(Op.DEAD_LETTER_REQUEUE, box).code == ErrorCode.INVALID_ARGUMENT


def test_a_snapshot_request_is_left_for_the_shell_and_answered_later() -> None:
    core = CoreDriver()
    assert core.call(Op.SNAPSHOT_NOW, {}, rid=77) is DEFERRED
    assert core.effects.snapshot_asks == [(ALICE, 77)]


def test_removals_compact_the_index_in_bounded_steps_and_keep_it_near_the_live_size() -> None:
    live: set[int] = set()
    looked = 0

    def alive(n: int) -> bool:
        nonlocal looked
        looked += 1
        return n in live

    index: PagedIndex[int] = PagedIndex(alive)
    worst = 0
    for n in range(200_000):  # churn: add one, remove the oldest beyond 1000 live
        live.add(n)
        index.add(n)
        if n >= 1000:
            live.discard(n - 1000)
            looked = 0
            index.removed()
            worst = max(worst, looked)
    assert worst <= BLOCK  # no call pauses for more than one block
    assert len(index) <= 2 * len(live) + 2 * BLOCK  # dead entries stay bounded
    found: list[int] = []
    cursor: int | None = 0
    while cursor is not None:
        page, cursor = index.page(cursor, 100, 400)
        found += page
    assert found == sorted(live)


def test_the_newest_first_walk_returns_each_object_once_newest_first() -> None:
    core = CoreDriver(runs=())
    scopes = [core.call(Op.SCOPE_CREATE, {})["scope"] for _ in range(1100)]
    args = {"newest_first": True}
    newest = core.call(Op.ADMIN_SCOPES, {**args, "limit": 10})
    assert [s["scope"] for s in newest["scopes"]] == scopes[::-1][:10]
    assert [s["scope"] for s in walk(core, Op.ADMIN_SCOPES, "scopes", args, 7)] == scopes[::-1]
    # Runs are indexed in the order they were made, after a restart too (the journal's
    # order, or a snapshot's, which lists them as the table holds them).
    core.drain()
    from_snapshot = core.fresh()
    for rec in core.snapshot():
        from_snapshot.apply(on_disk(rec), core.now)
    for rebuilt in (core.replay(), from_snapshot):
        newest = rebuilt.call(Op.ADMIN_SCOPES, {**args, "limit": 10})
        assert [s["scope"] for s in newest["scopes"]] == scopes[::-1][:10]
    # Claims released between pages (compaction runs) are skipped; the others come once.
    leases = {}
    for i in range(1100):
        leases[i] = core.call(Op.CLAIM_ACQUIRE, {"scope": scopes[0], "key": f"k{i}"})["lease"]
    claims = {"scope": scopes[0], **args}
    first = core.call(Op.ADMIN_CLAIMS, {**claims, "limit": 100})
    assert [c["key"] for c in first["claims"]] == [f"k{i}" for i in range(1099, 999, -1)]
    for i in range(0, 1100, 2):
        core.call(Op.CLAIM_RELEASE, {"lease": leases[i]})
    rest = walk(core, Op.ADMIN_CLAIMS, "claims", claims, 40, first["next"])
    assert [c["key"] for c in rest] == [f"k{i}" for i in range(999, -1, -1) if i % 2]
    # The newest page of an index looks at a bounded number of entries too.
    index: PagedIndex[int] = PagedIndex(lambda n: n == 1)
    for n in range(1, 10_001):
        index.add(n)
    assert index.page(0, 10, 40, newest_first=True) == ([], 9961)
    assert index.page(2, 10, 40, newest_first=True) == ([1], None)


def test_a_runs_groups_and_mailboxes_and_a_tenants_quotas_and_mailboxes_are_paged() -> None:
    core = tenants_core()
    run = core.call(Op.SCOPE_CREATE, {}, ALICE)["scope"]
    names = [f"box{n}" for n in range(30)]
    for name in names:
        core.call(Op.MAILBOX_ENSURE, {"name": name}, ALICE)
        core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": name, "data": 1}, ALICE)
    mailboxes = walk(core, Op.ADMIN_MAILBOXES, "mailboxes", {}, 7)
    assert [m["name"] for m in mailboxes] == ["jobs", *names]
    assert mailboxes[1] == {"name": "box0", "mode": "WORK", "max_attempts": 5,
                            "retry_backoff_ms": 1000, "paused": False, "ready": 1,
                            "running": 0}
    queues = walk(core, Op.ADMIN_QUEUES, "mailboxes", {"scope": run}, 4)
    assert [q["mailbox"] for q in queues] == names
    assert queues[0] == {"mailbox": "box0", "ready": 1, "running": 0, "delayed": 0,
                         "waiting": 0, "consumers": 0, "dead_letters": 0, "paused": False,
                         "blocked_by_parents": 0}
    # A queue that empties leaves the run's listing; one made again comes back last.
    got = core.call(Op.RECEIVE, {"scope": run, "mailbox": "box0"}, ALICE)
    core.call(Op.DELIVERY_COMPLETE, {"lease": got["delivery"]["lease"]}, ALICE)
    core.call(Op.MESSAGE_SEND, {"scope": run, "mailbox": "box0", "data": 2}, ALICE)
    queues = walk(core, Op.ADMIN_QUEUES, "mailboxes", {"scope": run}, 1000)
    assert [q["mailbox"] for q in queues] == [*names[1:], "box0"]
    for n in range(12):
        core.call(Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": n,
                                   "group": f"g{n % 4}"}, ALICE)
    groups = walk(core, Op.ADMIN_GROUPS, "groups", {"scope": run}, 3)
    assert [(g["group"], g["tasks"], g["counts"]) for g in groups] == [
        (f"g{n}", 3, {"PENDING": 3}) for n in range(4)]
    for n in range(25):
        core.call(Op.QUOTA_ENSURE, {"name": f"q{n}", "limit": 10, "per_seconds": 60}, ALICE)
    core.call(Op.QUOTA_TAKE, {"scope": run, "quota": "q3", "amount": 4}, ALICE)
    quotas = walk(core, Op.ADMIN_QUOTAS, "quotas", {}, 10)
    assert [q["name"] for q in quotas] == [f"q{n}" for n in range(25)]
    assert (quotas[3]["level"], quotas[3]["limit"], quotas[3]["waiters"]) == (6.0, 10, 0)
    # Another tenant's are not there, unless an admin names it.
    assert core.call(Op.ADMIN_QUOTAS, {"tenant": "globex"}) == {"quotas": [], "next": None}
    assert core.refused(Op.ADMIN_GROUPS, {"scope": run, "tenant": "globex"}).code == (
        ErrorCode.NOT_FOUND)
    for op in (Op.ADMIN_GROUPS, Op.ADMIN_QUEUES):
        assert core.refused(op, {"scope": "nope"}).code == ErrorCode.NOT_FOUND
        assert core.refused(op, {"scope": run, "limit": 1001}).code == ErrorCode.INVALID_ARGUMENT
        assert core.refused(op, {"scope": run, "cursor": -1}).code == ErrorCode.INVALID_ARGUMENT


def test_a_group_that_ends_leaves_the_listing_and_the_index_stays_near_its_size() -> None:
    core = CoreDriver(retention_seconds=1.0, tombstone_seconds=1.0)
    for n in range(2000):  # groups of one task each, finished and forgotten
        core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": n,
                                   "group": f"g{n}"})
        got = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})
        core.call(Op.DELIVERY_COMPLETE, {"lease": got["delivery"]["lease"]})
        if n % 100 == 99:
            core.advance(5.0)
    core.advance(5.0)
    assert core.call(Op.ADMIN_GROUPS, {"scope": "s"}) == {"groups": [], "next": None}
    pages = core.scopes[("default", "s")].group_pages
    assert pages is not None and len(pages) < 500
