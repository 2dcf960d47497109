"""Tasks that depend on tasks (core/work/parents.py), on the fake clock: a task submitted
``after`` parents is BLOCKED until every parent SUCCEEDED, then joins its ready line
with its delay, priority and fairness as submitted; a parent that did not succeed
cancels it (reason naming the parent) unless ``on_parent_failure="run"``; a task after
parents already finished is decided at submit; the state (children links too) is the
same after a replay, from a snapshot, after a torn tail and on another shard; bad input
is refused with a clear code; the links are bounded, and an end costs its own
dependents only. Children ending with their parent:
tests/test_core_a_cancelled_parent_ends_its_unfinished_subtree.py."""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, WALL, CoreDriver
from support.twoshards import move, placed, shard, slot

from rsd.core import DEFERRED
from rsd.core.records import Rec
from rsd.core.work import parents as parents_module
from rsproto import ErrorCode, Limits, Op

TICK = 0.005


def submit(core: CoreDriver, data: Any = None, run: str = "s", **extra: Any) -> dict[str, Any]:
    return core.call(
        Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": data, **extra}, ALICE
    )


def state(core: CoreDriver, task: str, run: str = "s") -> str:
    return core.call(Op.TASK_STATUS, {"scope": run, "task": task})["state"]  # type: ignore[no-any-return]


def view(core: CoreDriver, task: str, run: str = "s") -> dict[str, Any]:
    return core.call(Op.TASK_STATUS, {"scope": run, "task": task})  # type: ignore[no-any-return]


def receive(core: CoreDriver, run: str = "s") -> Any:
    return core.call(Op.RECEIVE, {"scope": run, "mailbox": "jobs"}).get("delivery")


def work_all(core: CoreDriver, run: str = "s", outcome: Any = "ok") -> list[dict[str, Any]]:
    """Receive and complete everything ready, again until nothing is: the deliveries."""
    out = []
    while (delivery := receive(core, run)) is not None:
        out.append(delivery)
        core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": outcome})
    return out


def refused(core: CoreDriver, **args: Any) -> tuple[ErrorCode, str]:
    error = core.refused(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 1, **args})
    return error.code, error.message


# ---- dependencies -----------------------------------------------------------------------


def test_a_diamond_of_four_tasks_runs_in_order_and_the_join_sees_both_outcomes() -> None:
    core = CoreDriver()
    a = submit(core, "a")["id"]
    b = submit(core, "b", after=[a])["id"]
    c = submit(core, "c", after=[a])["id"]
    d = submit(core, "d", after=[b, c])
    assert d["state"] == "BLOCKED" and d["after"] == [b, c]
    assert core.call(Op.SCOPE_STATUS, {"scope": "s"})["tasks"] == {"PENDING": 1, "BLOCKED": 3}
    inspect = core.call(Op.QUEUE_INSPECT, {"scope": "s", "mailbox": "jobs"})
    assert (inspect["ready"], inspect["blocked_by_parents"]) == (1, 3)
    first = receive(core)
    assert first["data"] == "a" and receive(core) is None and "parents" not in first
    core.call(Op.DELIVERY_COMPLETE, {"lease": first["lease"], "outcome": "A"})
    assert (state(core, b), state(core, c), state(core, d["id"])) == (
        "PENDING", "PENDING", "BLOCKED")
    middle = receive(core)
    assert middle["parents"] == {a: {"id": a, "state": "SUCCEEDED", "outcome": "A",
                                     "reason": None}}
    core.call(Op.DELIVERY_COMPLETE, {"lease": middle["lease"], "outcome": middle["data"]})
    assert state(core, d["id"]) == "BLOCKED"  # one parent of two
    last = work_all(core, outcome="x")
    assert [each["data"] for each in last] == ["c", "d"]
    assert {k: v["outcome"] for k, v in last[1]["parents"].items()} == {b: "b", c: "x"}
    assert core.call(Op.SCOPE_STATUS, {"scope": "s"})["tasks"] == {"SUCCEEDED": 4}


def test_a_failed_parent_cancels_the_chain_after_it_each_naming_its_parent() -> None:
    core = CoreDriver()
    a = submit(core, "a")["id"]
    b = submit(core, "b", after=[a])["id"]
    c = submit(core, "c", after=[b])["id"]
    core.call(Op.DELIVERY_REJECT, {"lease": receive(core)["lease"], "reason": "no"})
    assert view(core, b)["state"] == "CANCELLED"
    assert view(core, b)["reason"] == f"parent {a} ended FAILED"
    assert view(core, c)["reason"] == f"parent {b} ended CANCELLED"
    assert receive(core) is None


def test_on_parent_failure_run_starts_the_task_once_its_parents_have_ended() -> None:
    core = CoreDriver()
    a = submit(core, "a")["id"]
    ok = submit(core, "ok")["id"]
    b = submit(core, "b", after=[a, ok], on_parent_failure="run")["id"]
    assert view(core, b)["on_parent_failure"] == "run"
    first = receive(core)
    core.call(Op.DELIVERY_REJECT, {"lease": first["lease"], "reason": "broken"})
    assert state(core, b) == "BLOCKED"  # ``ok`` has not ended
    done = work_all(core)
    assert [each["data"] for each in done] == ["ok", "b"]
    parents = done[1]["parents"]
    assert parents[a]["state"] == "FAILED" and parents[a]["reason"] == "rejected: broken"
    assert parents[ok]["state"] == "SUCCEEDED"


def test_a_task_after_finished_parents_is_decided_at_submit() -> None:
    core = CoreDriver()
    good = submit(core, "good")["id"]
    work_all(core)
    bad = submit(core, "bad")["id"]
    core.call(Op.TASK_CANCEL, {"scope": "s", "task": bad})
    assert submit(core, after=[good])["state"] == "PENDING"
    cancelled = submit(core, after=[good, bad])
    assert cancelled["state"] == "CANCELLED"
    assert cancelled["reason"] == f"parent {bad} ended CANCELLED"
    assert submit(core, after=[bad], on_parent_failure="run")["state"] == "PENDING"
    assert submit(core, parent=bad)["state"] == "CANCELLED"
    assert submit(core, parent=good)["state"] == "PENDING"


def test_an_unblocked_task_keeps_its_delay_priority_and_fairness() -> None:
    core = CoreDriver()
    a = submit(core, "a")["id"]
    submit(core, "late", after=[a], delay_ms=60_000)
    submit(core, "low", after=[a])
    submit(core, "high", after=[a], priority=5, fairness_key="t1")
    work_all(core, outcome=None)  # a, then high (priority 5), then low
    assert core.call(Op.QUEUE_INSPECT, {"scope": "s", "mailbox": "jobs"})["delayed"] == 1
    core.advance(60.0 + 2 * TICK)
    assert [each["data"] for each in work_all(core)] == ["late"]


def test_the_order_of_unblocked_tasks_follows_priority() -> None:
    core = CoreDriver()
    a = submit(core, "a")["id"]
    submit(core, "low", after=[a])
    submit(core, "high", after=[a], priority=5)
    core.call(Op.DELIVERY_COMPLETE, {"lease": receive(core)["lease"]})
    assert [each["data"] for each in work_all(core)] == ["high", "low"]


def test_a_blocked_task_can_be_cancelled_and_expire_and_its_parents_let_it_go() -> None:
    core = CoreDriver()
    a = submit(core, "a")["id"]
    b = submit(core, "b", after=[a])["id"]
    c = submit(core, "c", after=[a], deadline=WALL + 5.0)["id"]
    core.call(Op.TASK_CANCEL, {"scope": "s", "task": b})
    core.advance(5.0 + 2 * TICK)
    assert (state(core, b), state(core, c)) == ("CANCELLED", "EXPIRED")
    assert not core.work.items[a].links.dependents  # both left their parent's line
    assert [each["data"] for each in work_all(core)] == ["a"]


def test_a_parked_consumer_gets_the_task_its_parent_lets_go() -> None:
    core = CoreDriver()
    a = submit(core, "a")["id"]
    b = submit(core, "b", after=[a])["id"]
    lease = receive(core)["lease"]
    parked = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs", "wait": True}, BOB)
    assert parked is DEFERRED
    core.call(Op.DELIVERY_COMPLETE, {"lease": lease})
    assert state(core, b) == "RUNNING"


# ---- replay, snapshot, a moved run ----------------------------------------------------------


def scenario() -> CoreDriver:
    """Links in every phase: a diamond half done, a child of a running parent, a blocked
    task with a delay, a cancelled one, and tasks decided at submit."""
    core = CoreDriver()
    a = submit(core, "a")["id"]
    b = submit(core, "b", after=[a])["id"]
    c = submit(core, "c", after=[a], delay_ms=30_000)["id"]
    submit(core, "d", after=[b, c], priority=3)
    core.call(Op.DELIVERY_COMPLETE, {"lease": receive(core)["lease"], "outcome": "A"})
    root = submit(core, "root", key="root")["id"]
    receive(core)  # b, running
    submit(core, "kid", parent=root)
    submit(core, "kid2", parent=root, after=[root])
    bad = submit(core, "bad")["id"]
    core.call(Op.TASK_CANCEL, {"scope": "s", "task": bad})
    submit(core, "doomed", after=[bad])
    core.drain()
    return core


def state_of(core: CoreDriver) -> dict[str, Any]:
    work = core.work
    return {
        "items": {item_id: (item.view(), item.visible_at, item.queued)
                  for item_id, item in work.items.items()},
        "dependents": {item_id: sorted(item.links.dependents or ())
                       for item_id, item in work.items.items()
                       if item.links is not None and not item.terminal},
        "children": {item_id: list(item.links.children)
                     for item_id, item in work.items.items()
                     if item.links is not None and item.links.children},
        "by_state": dict(work.by_state),
        "status": core.call(Op.SCOPE_STATUS, {"scope": "s"})["tasks"],
        "inspect": {k: v for k, v in core.call(
            Op.QUEUE_INSPECT, {"scope": "s", "mailbox": "jobs"}).items() if k != "consumers"},
    }


def go_on(core: CoreDriver) -> list[Any]:
    """What happens next: everything worked off, the delay waited out."""
    out = [each["data"] for each in work_all(core)]
    core.advance(30.0 + 2 * TICK)
    out += [each["data"] for each in work_all(core)]
    core.advance(60.0)  # b's lease, held by nobody now, runs out
    out += [each["data"] for each in work_all(core)]
    return out


@pytest.mark.parametrize("how", ["replay", "snapshot"])
def test_replay_and_snapshot_rebuild_blocked_tasks_and_links_as_live(how: str) -> None:
    core = scenario()
    rebuilt = core.rebuilt(from_snapshot=how == "snapshot")
    assert state_of(rebuilt) == state_of(core)
    assert go_on(rebuilt) == go_on(core)
    assert state_of(rebuilt) == state_of(core)


def test_a_record_applied_twice_changes_nothing() -> None:
    core = scenario()
    rebuilt = core.replay(core.records + core.records[-12:])
    rebuilt.now = core.now
    assert state_of(rebuilt) == state_of(core)


def test_a_linked_tasks_record_applied_again_after_it_was_forgotten_leaves_nothing() -> None:
    core = CoreDriver(retention_seconds=1.0, tombstone_seconds=1.0)
    parent = submit(core, "parent")["id"]
    child = submit(core, "child", after=[parent], parent=parent)["id"]
    work_all(core)
    core.advance(3.0)
    assert core.work.items == {}  # both forgotten
    core.drain()
    enqueued = next(
        rec for rec in core.records if rec[0] == Rec.ITEM_ENQUEUED and rec[1] == child)
    again = core.replay([*core.records, enqueued])
    assert again.work.items == {}


def test_a_torn_tail_that_kept_an_end_but_not_what_followed_is_followed_at_recovery() -> None:
    """The records an end brings to its dependents and children are written with it;
    a crash may keep the end and lose them: recovery after an unclean stop follows
    every ended task with links again."""
    core = CoreDriver()
    a = submit(core, "a")["id"]
    b = submit(core, "b", after=[a])["id"]
    c = submit(core, "c", after=[a])["id"]
    kid = submit(core, "kid", parent=b)["id"]
    core.drain()
    core.call(Op.TASK_CANCEL, {"scope": "s", "task": a})  # b and c cancelled, then kid
    core.drain()
    cut = next(n for n, rec in enumerate(core.records)
               if rec[0] == Rec.FINISHED and rec[1] == a) + 1
    torn = core.replay(core.records[:cut])  # a CANCELLED, the rest lost
    assert state(torn, b) == "BLOCKED" and state(torn, kid) == "PENDING"
    torn.recovered(torn.now, clean=False)
    assert [state(torn, t) for t in (b, c, kid)] == ["CANCELLED"] * 3
    assert view(torn, kid)["reason"] == f"parent {b} ended CANCELLED"
    again = core.replay()  # nothing lost: recovery finds nothing to do
    again.drain()
    before = len(again.records)
    again.recovered(again.now, clean=False)
    again.drain()
    assert not [rec for rec in again.records[before:] if rec[0] == Rec.FINISHED]


def test_a_moved_run_keeps_its_blocked_tasks_and_children() -> None:
    a, b = shard("a", 1), shard("b", 2)
    run = placed("deps")
    a.create_runs(run)
    root = submit(a, "root", run=run)["id"]
    kid = submit(a, "kid", run=run, parent=root, after=[root])["id"]
    a.drain()
    b.advance(a.now)
    assert move(a, b, slot(run))["runs"] == 1
    assert state(b, kid, run) == "BLOCKED"
    delivery = receive(b, run)
    assert delivery["id"] == root
    b.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": 1})
    got = receive(b, run)
    assert got["id"] == kid and got["parents"][root]["outcome"] == 1
    children = b.call(Op.TASK_CHILDREN, {"scope": run, "task": root})["children"]
    assert [c["id"] for c in children] == [kid]


# ---- bad input and bounds -------------------------------------------------------------------


def test_bad_links_are_refused_with_a_clear_code_and_leave_nothing() -> None:
    core = CoreDriver(runs=("s", "t"))
    here = submit(core, "here")["id"]
    there = submit(core, "there", run="t")["id"]
    before = dict(core.work.items)
    core.drain()
    written = len(core.records)
    assert refused(core, after=[there]) == (
        ErrorCode.INVALID_ARGUMENT,
        f"after names task {there!r} of run 't': a task's parents are tasks of its own run "
        "('s')",
    )
    assert refused(core, parent=there)[0] is ErrorCode.INVALID_ARGUMENT
    assert refused(core, after=["t-999"])[0] is ErrorCode.NOT_FOUND
    assert refused(core, parent="t-999")[0] is ErrorCode.NOT_FOUND
    code, message = refused(core, after=[here] * 65)
    assert code is ErrorCode.INVALID_ARGUMENT and "the limit is 64" in message
    assert refused(core, after=here)[0] is ErrorCode.INVALID_ARGUMENT
    assert refused(core, after=[7])[0] is ErrorCode.INVALID_ARGUMENT
    assert refused(core, after=[""])[0] is ErrorCode.INVALID_ARGUMENT
    code, message = refused(core, after=["t" * (Limits.MAX_KEY_BYTES + 1)])
    assert code is ErrorCode.INVALID_ARGUMENT and len(message) < 200
    assert refused(core, after=["t" * Limits.MAX_KEY_BYTES])[0] is ErrorCode.NOT_FOUND
    assert refused(core, parent="t" * (Limits.MAX_KEY_BYTES + 1))[0] is (
        ErrorCode.INVALID_ARGUMENT)
    assert refused(core, after=[here], on_parent_failure="maybe")[0] is ErrorCode.INVALID_ARGUMENT
    assert refused(core, on_parent_failure="run")[0] is ErrorCode.INVALID_ARGUMENT
    assert refused(core, parent=5)[0] is ErrorCode.INVALID_ARGUMENT
    core.drain()
    assert core.work.items == before and len(core.records) == written  # no record
    # a message is no parent; another tenant's task does not exist for you
    message = core.call(Op.MESSAGE_SEND, {"scope": "s", "mailbox": "jobs", "data": 1})["id"]
    assert refused(core, after=[message])[0] is ErrorCode.NOT_FOUND
    for field, value in (("after", [here]), ("parent", here), ("on_parent_failure", "run")):
        error = core.refused(Op.MESSAGE_SEND, {
            "scope": "s", "mailbox": "jobs", "data": 1, field: value})
        assert error.code is ErrorCode.INVALID_ARGUMENT and "TASK_SUBMIT" in error.message
    other = CoreDriver(tenants={ALICE: ("acme", False), BOB: ("globex", False)})
    theirs = other.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 1}, BOB)
    error = other.refused(Op.TASK_SUBMIT, {
        "scope": "s", "mailbox": "jobs", "data": 1, "after": [theirs["id"]]}, ALICE)
    assert error.code is ErrorCode.NOT_FOUND


def test_sixty_four_parents_are_accepted_and_duplicates_count_once() -> None:
    core = CoreDriver()
    parents = [submit(core, n)["id"] for n in range(Limits.MAX_TASK_PARENTS)]
    child = submit(core, "child", after=parents)
    assert child["after"] == parents and child["state"] == "BLOCKED"
    twice = submit(core, "twice", after=parents[:60] + parents[:4])
    assert twice["after"] == parents[:60]
    work_all(core)
    assert state(core, child["id"]) == "SUCCEEDED"


def test_the_same_key_with_other_links_is_a_conflict() -> None:
    core = CoreDriver()
    a = submit(core, "a")["id"]
    b = submit(core, "b")["id"]
    first = submit(core, "x", key="k", after=[a])
    assert submit(core, "x", key="k", after=[a])["id"] == first["id"]
    assert refused(core, data="x", key="k", after=[b])[0] is ErrorCode.IDEMPOTENCY_CONFLICT
    assert refused(core, data="x", key="k", after=[a], on_parent_failure="run")[0] is (
        ErrorCode.IDEMPOTENCY_CONFLICT)


def test_a_task_has_a_bounded_number_of_children_and_of_tasks_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound itself (10,000) is tried in full below; here a small one shows that
    forgotten children give their room back."""
    monkeypatch.setattr(parents_module, "_MAX_CHILDREN", 3)
    core = CoreDriver(retention_seconds=1.0, tombstone_seconds=1.0)
    root = submit(core, "root")["id"]
    for n in range(3):
        submit(core, n, parent=root, after=[root])
    assert refused(core, parent=root)[0] is ErrorCode.RESOURCE_EXHAUSTED
    code, message = refused(core, after=[root])
    assert code is ErrorCode.RESOURCE_EXHAUSTED and "tasks waiting for it" in message


def test_ten_thousand_children_fit_and_one_more_is_refused() -> None:
    core = CoreDriver()
    root = submit(core, "root")["id"]
    item = {"data": None, "parent": root, "after": [root]}
    for _ in range(Limits.MAX_TASK_CHILDREN // 250):
        reply = core.call(Op.TASK_SUBMIT_MANY, {
            "scope": "s", "mailbox": "jobs", "items": [item] * 250})
        assert all("error" not in each for each in reply["results"])
    assert refused(core, parent=root)[0] is ErrorCode.RESOURCE_EXHAUSTED
    assert refused(core, after=[root])[0] is ErrorCode.RESOURCE_EXHAUSTED
    core.call(Op.DELIVERY_COMPLETE, {"lease": receive(core)["lease"]})
    assert core.call(Op.QUEUE_INSPECT, {"scope": "s", "mailbox": "jobs"})["ready"] == (
        Limits.MAX_TASK_CHILDREN)


# ---- cost -------------------------------------------------------------------------------------


class CountedItems(dict):  # type: ignore[type-arg]
    """The item table, counting its lookups by id."""

    lookups = 0

    def get(self, key: Any, default: Any = None) -> Any:
        CountedItems.lookups += 1
        return super().get(key, default)


def lookups_of_an_end(others: int) -> int:
    """Item lookups made by a parent's completion that lets 3 dependents go, with
    ``others`` unrelated tasks in the run."""
    core = CoreDriver()
    for n in range(others):
        submit(core, n)
    parent = submit(core, "parent", priority=9)["id"]
    for n in range(3):
        submit(core, n, after=[parent], parent=parent)
    lease = receive(core)["lease"]
    core.work.items = CountedItems(core.work.items)
    CountedItems.lookups = 0
    core.call(Op.DELIVERY_COMPLETE, {"lease": lease})
    assert core.call(Op.QUEUE_INSPECT, {"scope": "s", "mailbox": "jobs"})["blocked_by_parents"] == 0
    return CountedItems.lookups


def test_an_end_costs_its_own_dependents_never_a_walk_over_the_tasks() -> None:
    assert lookups_of_an_end(10) == lookups_of_an_end(5000)


def test_a_join_after_64_parents_looks_at_each_parent_a_bounded_number_of_times() -> None:
    core = CoreDriver()
    parents = [submit(core, n)["id"] for n in range(Limits.MAX_TASK_PARENTS)]
    join = submit(core, "join", after=parents)["id"]
    core.work.items = CountedItems(core.work.items)
    CountedItems.lookups = 0
    for delivery in [receive(core) for _ in parents]:
        core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})
    assert state(core, join) == "PENDING"
    # Each end looks its own task up a few times; the join's parents are looked at once
    # each in all (not 64 times at each of 64 ends: 4,096).
    assert CountedItems.lookups < 20 * Limits.MAX_TASK_PARENTS
