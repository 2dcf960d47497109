"""A TASK_RESULT with ``outcome_only`` is answered with the outcome view and nothing more.

What must hold (protocol.md, TASK_RESULT, "The outcome view"), in the pure core on a fake
clock:

- with ``outcome_only`` true the answer, at once for an ended task or pushed when it
  ends, is ``{"id", "state", "outcome", "reason"}`` (each as the whole view has it), with
  ``"tombstoned": true`` only once the task is tombstoned: nothing the waiter did not ask
  for;
- a request without the field, or with it false, gets the whole task view as before
  (the same as TASK_STATUS's), also when waits of both kinds park on one task and are
  answered by one ending;
- the submit-and-wait pair (the wait names the task by key) answers the same way;
- ``outcome_only`` of any type but a boolean is INVALID_ARGUMENT, and such a request
  parks nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CAROL, CoreDriver

from rsd.core import DEFERRED
from rsproto import ErrorCode, Kind, Op

RETENTION = 100.0
OUTCOME_KEYS = ["id", "state", "outcome", "reason"]


@pytest.fixture
def core() -> CoreDriver:
    return CoreDriver(retention_seconds=RETENTION)


def submitted(core: CoreDriver, key: str | None = None) -> str:
    args: dict[str, Any] = {"scope": "s", "mailbox": "jobs", "data": {"n": 1}}
    if key is not None:
        args["key"] = key
    task: str = core.call(Op.TASK_SUBMIT, args)["id"]
    return task


def delivered(core: CoreDriver) -> bytes:
    """The lease of the next delivery from "jobs" (to alice)."""
    reply = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})
    lease: bytes = reply["delivery"]["lease"]
    return lease


def status(core: CoreDriver, task: str) -> dict[str, Any]:
    view: dict[str, Any] = core.call(Op.TASK_STATUS, {"scope": "s", "task": task})
    return view


def wait(core: CoreDriver, task: str, conn: int = ALICE, rid: int | None = None,
         **extra: Any) -> Any:
    return core.call(Op.TASK_RESULT, {"scope": "s", "task": task, **extra}, conn, rid=rid)


def outcome_of(view: dict[str, Any]) -> dict[str, Any]:
    """What the outcome view holds of the whole view ``view``."""
    return {name: view[name] for name in OUTCOME_KEYS}


def test_an_ended_tasks_outcome_view_carries_the_outcome_and_nothing_more(
    core: CoreDriver,
) -> None:
    task = submitted(core)
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivered(core), "outcome": {"answer": 42}})
    slim = wait(core, task, outcome_only=True, timeout_ms=0)
    assert list(slim) == OUTCOME_KEYS
    assert slim == {"id": task, "state": "SUCCEEDED", "outcome": {"answer": 42},
                    "reason": None}
    assert slim == outcome_of(status(core, task))


@pytest.mark.parametrize("asked", [{}, {"outcome_only": False}, {"outcome_only": None}])
def test_a_wait_that_does_not_ask_for_the_outcome_only_gets_the_whole_view(
    core: CoreDriver, asked: dict[str, Any]
) -> None:
    task = submitted(core)
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivered(core), "outcome": "done"})
    assert wait(core, task, timeout_ms=0, **asked) == status(core, task)
    # ... parked too
    parked = submitted(core)
    lease = delivered(core)
    assert wait(core, parked, rid=70, timeout_ms=10_000, **asked) is DEFERRED
    core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": "done"})
    assert core.drain() == [(ALICE, [Kind.REPLY, 70, status(core, parked)])]


def test_waits_of_both_kinds_on_one_task_are_each_answered_their_own_way(
    core: CoreDriver,
) -> None:
    task = submitted(core)
    lease = delivered(core)
    assert wait(core, task, ALICE, 1, outcome_only=True, timeout_ms=10_000) is DEFERRED
    assert wait(core, task, BOB, 2, timeout_ms=10_000) is DEFERRED
    assert wait(core, task, CAROL, 3, outcome_only=True, timeout_ms=10_000) is DEFERRED
    core.call(Op.DELIVERY_REJECT, {"lease": lease, "reason": "bad input"})
    view = status(core, task)
    slim = {"id": task, "state": "FAILED", "outcome": None, "reason": view["reason"]}
    assert "bad input" in view["reason"]
    assert core.drain() == [
        (ALICE, [Kind.REPLY, 1, slim]),
        (BOB, [Kind.REPLY, 2, view]),
        (CAROL, [Kind.REPLY, 3, slim]),
    ]


def test_a_wait_by_key_asking_for_the_outcome_only_gets_the_outcome_view(
    core: CoreDriver,
) -> None:
    task = submitted(core, key="k")
    lease = delivered(core)
    args = {"scope": "s", "key": "k", "timeout_ms": 10_000, "outcome_only": True}
    assert core.call(Op.TASK_RESULT, args, rid=9) is DEFERRED
    core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": [1, 2]})
    assert core.drain() == [
        (ALICE, [Kind.REPLY, 9, {"id": task, "state": "SUCCEEDED", "outcome": [1, 2],
                                 "reason": None}]),
    ]


def test_a_tombstoned_tasks_outcome_view_says_it_is_one(core: CoreDriver) -> None:
    task = submitted(core)
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivered(core), "outcome": {"answer": 42}})
    core.advance(RETENTION + 1.0)
    assert wait(core, task, outcome_only=True, timeout_ms=0) == {
        "id": task, "state": "SUCCEEDED", "outcome": None, "reason": None, "tombstoned": True,
    }


@pytest.mark.parametrize("bad", [1, 0, "true", [True], {"yes": True}, 1.0])
def test_outcome_only_not_a_boolean_is_invalid_argument_and_parks_nothing(
    core: CoreDriver, bad: Any
) -> None:
    task = submitted(core)
    error = core.refused(
        Op.TASK_RESULT, {"scope": "s", "task": task, "timeout_ms": 10_000, "outcome_only": bad}
    )
    assert error.code == ErrorCode.INVALID_ARGUMENT and "outcome_only" in error.message
    core.call(Op.DELIVERY_COMPLETE, {"lease": delivered(core), "outcome": None})
    assert core.drain() == []  # no wait was left to answer
