"""TASK_RESULT names its task by id, or by key in its scope (protocol.md, TASK_RESULT):
so a keyed submit and the wait for its result go in one write, the wait running after
the submit. The key is looked up when the wait runs, within the caller's tenant and
scope only; exactly one of ``task`` and ``key``. Pure core, fake clock."""

from __future__ import annotations

from typing import Any

from support.core import ALICE, BOB, CoreDriver, call, refused

from rsd.core import DEFERRED
from rsproto import ErrorCode, Kind, Op


def make_core() -> CoreDriver:
    return CoreDriver(mailbox="jobs", runs=("s", "other"))


def submit(core: CoreDriver, key: str, data: Any = 1, scope: str = "s") -> dict[str, Any]:
    args = {"scope": scope, "mailbox": "jobs", "data": data, "key": key}
    return call(core, 0.0, Op.TASK_SUBMIT, args)  # type: ignore[no-any-return]


def by_key(core: CoreDriver, key: str, conn: int = ALICE, rid: int = 9, **extra: Any) -> Any:
    args = {"scope": "s", "key": key, "timeout_ms": 10_000, **extra}
    return call(core, 0.0, Op.TASK_RESULT, args, conn, rid)


def test_a_wait_by_key_after_the_keyed_submit_parks_on_that_task_and_gets_its_end() -> None:
    core = make_core()
    task = submit(core, "k")["id"]
    assert by_key(core, "k") is DEFERRED
    delivery = call(core, 0.0, Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}, BOB)["delivery"]
    call(core, 1.0, Op.DELIVERY_COMPLETE, {"lease": delivery["lease"], "outcome": 42}, BOB)
    [(conn, reply)] = core.effects.take_messages()
    assert conn == ALICE and reply[:2] == [Kind.REPLY, 9]
    assert reply[2]["id"] == task and reply[2]["outcome"] == 42


def test_a_wait_by_key_on_a_finished_task_answers_at_once() -> None:
    core = make_core()
    task = submit(core, "k")["id"]
    call(core, 0.0, Op.TASK_CANCEL, {"scope": "s", "task": task})
    assert by_key(core, "k")["state"] == "CANCELLED"


def test_a_key_that_names_no_task_in_the_scope_is_not_found() -> None:
    core = make_core()
    submit(core, "k", scope="other")
    assert refused(core, 0.0, Op.TASK_RESULT, {"scope": "s", "key": "k"}).code == (
        ErrorCode.NOT_FOUND
    )


def test_another_tenants_key_is_not_found() -> None:
    core = CoreDriver(mailbox="jobs", runs=("s",), tenants={ALICE: ("a", False), BOB: ("b", False)})
    submit(core, "k")
    error = refused(core, 0.0, Op.TASK_RESULT, {"scope": "s", "key": "k"}, BOB)
    assert error.code == ErrorCode.NOT_FOUND


def test_a_wait_names_its_task_by_id_or_by_key_never_both_never_neither() -> None:
    core = make_core()
    task = submit(core, "k")["id"]
    both = refused(core, 0.0, Op.TASK_RESULT, {"scope": "s", "task": task, "key": "k"})
    neither = refused(core, 0.0, Op.TASK_RESULT, {"scope": "s"})
    bad = refused(core, 0.0, Op.TASK_RESULT, {"scope": "s", "key": 5})
    assert (both.code, neither.code, bad.code) == (ErrorCode.INVALID_ARGUMENT,) * 3
    assert "task is required" in neither.message
    assert core.effects.take_messages() == []
