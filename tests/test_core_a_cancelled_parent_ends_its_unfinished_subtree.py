"""Children (core/work/parents.py), on the fake clock: a task submitted with ``parent``
is that task's child (TASK_CHILDREN lists it; a child forgotten leaves the list, live
and in a replay alike, and gives its room back); a parent that ends CANCELLED or EXPIRED
cancels its unfinished children, and theirs, each naming its parent, and tells the
workers holding them; a child that finished, and its own children, are left alone; a
run's cancellation ends them all with the run's reason; a chain of thousands ends in
one step without recursion. Tasks after tasks:
tests/test_core_a_task_after_its_parents_starts_only_when_they_succeed.py."""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, WALL, CoreDriver

from rsd.core.work import parents as parents_module
from rsproto import ErrorCode, Kind, Op, Push

TICK = 0.005


def submit(core: CoreDriver, data: Any = None, run: str = "s", **extra: Any) -> dict[str, Any]:
    return core.call(
        Op.TASK_SUBMIT, {"scope": run, "mailbox": "jobs", "data": data, **extra}, ALICE
    )


def state(core: CoreDriver, task: str) -> str:
    return core.call(Op.TASK_STATUS, {"scope": "s", "task": task})["state"]  # type: ignore[no-any-return]


def view(core: CoreDriver, task: str) -> dict[str, Any]:
    return core.call(Op.TASK_STATUS, {"scope": "s", "task": task})  # type: ignore[no-any-return]


def receive(core: CoreDriver) -> Any:
    return core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}).get("delivery")


def test_a_cancelled_parent_cancels_its_unfinished_subtree() -> None:
    core = CoreDriver()
    root = submit(core, "root")["id"]
    root_lease = receive(core)["lease"]  # root runs
    kids = [submit(core, f"kid{n}", parent=root)["id"] for n in range(3)]
    done = receive(core)
    assert done["id"] == kids[0]
    kept = submit(core, "under a finished child", parent=kids[0])["id"]
    core.call(Op.DELIVERY_COMPLETE, {"lease": done["lease"]})
    running_delivery = receive(core)
    running = running_delivery["id"]
    assert running == kids[1]
    grandchild = submit(core, "grandchild", parent=running)["id"]
    great = submit(core, "great-grandchild", parent=grandchild)["id"]
    assert view(core, root)["children"] == 3 and view(core, kids[1])["parent"] == root
    children = core.call(Op.TASK_CHILDREN, {"scope": "s", "task": root})["children"]
    assert [(c["id"], c["state"]) for c in children] == [
        (kids[0], "SUCCEEDED"), (kids[1], "RUNNING"), (kids[2], "PENDING")]
    core.drain()
    core.call(Op.TASK_CANCEL, {"scope": "s", "task": root})
    assert state(core, kids[0]) == "SUCCEEDED"  # finished: left alone, and its own child
    assert state(core, kept) == "PENDING"
    assert view(core, running)["reason"] == f"parent {root} ended CANCELLED"
    assert view(core, kids[2])["reason"] == f"parent {root} ended CANCELLED"
    assert view(core, grandchild)["reason"] == f"parent {running} ended CANCELLED"
    assert view(core, great)["reason"] == f"parent {grandchild} ended CANCELLED"
    lost = [m[1][2]["lease"] for m in core.drain() if m[1][:2] == [Kind.PUSH, Push.LEASE_LOST]]
    assert lost == [root_lease, running_delivery["lease"]]  # both workers are told


def test_a_parents_deadline_ends_its_children_too() -> None:
    core = CoreDriver()
    root = submit(core, "root", deadline=WALL + 5.0)["id"]
    kid = submit(core, "kid", parent=root, delay_ms=60_000)["id"]
    core.advance(5.0 + 2 * TICK)
    assert state(core, root) == "EXPIRED"
    assert view(core, kid)["reason"] == f"parent {root} ended EXPIRED"


def test_a_cancelled_run_ends_children_with_the_runs_reason() -> None:
    core = CoreDriver()
    root = submit(core, "root")["id"]
    kid = submit(core, "kid", parent=root)["id"]
    after = submit(core, "after", after=[root])["id"]
    core.call(Op.SCOPE_CANCEL, {"scope": "s", "reason": "stop"})
    core.advance(TICK)
    for task in (root, kid, after):
        assert view(core, task)["reason"] == "run cancelled: stop"


def test_a_chain_thousands_long_is_cancelled_in_one_step_without_recursion() -> None:
    core = CoreDriver()
    ids = [submit(core, 0)["id"]]
    for n in range(3000):
        ids.append(submit(core, n, after=[ids[-1]], parent=ids[-1])["id"])
    core.call(Op.TASK_CANCEL, {"scope": "s", "task": ids[0]})
    assert core.call(Op.SCOPE_STATUS, {"scope": "s"})["tasks"] == {"CANCELLED": 3001}


def test_forgotten_children_leave_their_parent_and_give_their_room_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(parents_module, "_MAX_CHILDREN", 3)
    core = CoreDriver(retention_seconds=1.0, tombstone_seconds=1.0)
    root = submit(core, "root")["id"]
    receive(core)  # the root runs: it is not forgotten
    for n in range(3):
        submit(core, n, parent=root)
    error = core.refused(Op.TASK_SUBMIT, {
        "scope": "s", "mailbox": "jobs", "data": 4, "parent": root})
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED
    while (delivery := receive(core)) is not None:
        core.call(Op.DELIVERY_COMPLETE, {"lease": delivery["lease"]})
    assert view(core, root)["children"] == 3
    core.advance(3.0)  # the children are forgotten
    assert "children" not in view(core, root)
    assert core.call(Op.TASK_CHILDREN, {"scope": "s", "task": root})["children"] == []
    core.drain()
    rebuilt = core.replay()
    rebuilt.now = core.now
    assert view(rebuilt, root) == view(core, root)
    submit(core, "room again", parent=root)
