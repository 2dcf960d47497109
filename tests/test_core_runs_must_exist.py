"""A run id that was never created is NOT_FOUND for every op naming it; runs are made by
SCOPE_CREATE, with a fresh id or a chosen one (idempotent), and survive recovery.

Issue 13: a mistyped run id gave a worker that waited forever in a silently created
empty run. Here, on the pure core: every op that names a run refuses one never created
and leaves no record; the chosen-id form is idempotent and per tenant; a run made by
first use in an older journal keeps existing after recovery.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, WALL, CoreDriver, handle, on_disk

from rsd.core import Rec
from rsproto import ErrorCode, Limits, Op

MISSING = "nightly-2026-12-01-typo"

OPS_NAMING_A_RUN: list[tuple[int, dict[str, Any]]] = [
    (Op.CLAIM_ACQUIRE, {"key": "k"}),
    (Op.CLAIM_ACQUIRE, {"key": "k", "wait": True}),
    (Op.CLAIM_INSPECT, {"key": "k"}),
    (Op.FENCE_CHECK, {"key": "k", "token": handle(1)}),
    (Op.POOL_ACQUIRE, {"pool": "gpu"}),
    (Op.QUOTA_TAKE, {"quota": "api", "amount": 1}),
    (Op.TASK_SUBMIT, {"mailbox": "jobs", "data": 1, "key": "t"}),
    (Op.MESSAGE_SEND, {"mailbox": "jobs", "data": 1}),
    (Op.RECEIVE, {"mailbox": "jobs"}),
    (Op.RECEIVE, {"mailbox": "jobs", "wait": True}),
    (Op.QUEUE_INSPECT, {"mailbox": "jobs"}),
    (Op.DEAD_LETTERS, {"mailbox": "jobs"}),
    (Op.TASK_STATUS, {"task": "t-1"}),
    (Op.TASK_RESULT, {"task": "t-1"}),
    (Op.TASK_JOIN, {"task": "t-1", "subscriber_id": "x"}),
    (Op.TASK_DETACH, {"task": "t-1", "subscriber_id": "x"}),
    (Op.TASK_CANCEL, {"task": "t-1"}),
    (Op.SCOPE_CANCEL, {}),
]


@pytest.fixture
def core() -> CoreDriver:
    core = CoreDriver(recovered=True)
    core.call(Op.POOL_ENSURE, {"name": "gpu", "size": 1})
    core.call(Op.QUOTA_ENSURE, {"name": "api", "limit": 10, "per_seconds": 1})
    core.drain()
    return core


@pytest.mark.parametrize(("op", "args"), OPS_NAMING_A_RUN,
                         ids=[f"{Op(op).name}-{i}" for i, (op, _) in enumerate(OPS_NAMING_A_RUN)])
def test_every_op_naming_a_run_never_created_is_not_found_and_changes_nothing(
    core: CoreDriver, op: int, args: dict[str, Any]
) -> None:
    before = core.stats()
    err = core.refused(op, {"scope": MISSING, **args})
    assert err.code == ErrorCode.NOT_FOUND
    assert repr(MISSING) in err.message and "create it first" in err.message
    assert core.effects.take_records() == []
    assert core.stats() == before


def test_a_chosen_id_is_created_once_and_then_returned_as_it_is(core: CoreDriver) -> None:
    first = core.call(Op.SCOPE_CREATE, {"scope": "nightly-2026-12-01"})
    assert first == {"scope": "nightly-2026-12-01", "created": True}
    assert core.effects.take_records() == [
        (Rec.SCOPE_CREATED, "nightly-2026-12-01", WALL, "default"),
        (Rec.RUN_QUIET, "nightly-2026-12-01", WALL, "default"),  # it holds nothing yet
    ]
    core.call(Op.CLAIM_ACQUIRE, {"scope": "nightly-2026-12-01", "key": "k"})
    core.drain()
    again = core.call(Op.SCOPE_CREATE, {"scope": "nightly-2026-12-01"}, BOB)
    assert again == {"scope": "nightly-2026-12-01", "created": False}
    assert core.effects.take_records() == []  # nothing changed: the claim is still held
    assert core.call(Op.CLAIM_INSPECT, {"scope": "nightly-2026-12-01", "key": "k"})["held"]


def test_a_cancelled_run_created_again_stays_cancelled(core: CoreDriver) -> None:
    core.create_runs("r")
    core.call(Op.SCOPE_CANCEL, {"scope": "r"})
    assert core.call(Op.SCOPE_CREATE, {"scope": "r"})["created"] is False
    err = core.refused(Op.CLAIM_ACQUIRE, {"scope": "r", "key": "k"})
    assert err.code == ErrorCode.SCOPE_CANCELLED


@pytest.mark.parametrize(("scope", "mention"), [
    ("", "must not be empty"),
    ("x" * (Limits.MAX_SCOPE_ID_BYTES + 1), str(Limits.MAX_SCOPE_ID_BYTES)),
    (7, "must be a string"),
])
def test_a_chosen_id_is_checked_like_every_run_id(
    core: CoreDriver, scope: Any, mention: str
) -> None:
    err = core.refused(Op.SCOPE_CREATE, {"scope": scope})
    assert err.code == ErrorCode.INVALID_ARGUMENT and mention in err.message
    assert core.effects.take_records() == []


def test_created_runs_come_back_from_the_journal_and_from_a_snapshot(core: CoreDriver) -> None:
    core.create_runs("a", "b")
    core.drain()
    for rebuilt in (core.replay(), core.replay(list(core.snapshot()))):
        rebuilt.connected(ALICE, "alice")
        assert rebuilt.call(Op.CLAIM_ACQUIRE, {"scope": "b", "key": "k"})["generation"] >= 1
        assert rebuilt.call(Op.SCOPE_CREATE, {"scope": "a"})["created"] is False


def test_a_run_an_older_journal_made_by_first_use_keeps_existing_after_recovery() -> None:
    lease = handle(5, b"\x01" * 8)
    old = [(Rec.CLAIM_GRANTED, "implicit", "k", lease, 1, "alice", 30, "default")]
    core = CoreDriver(holders={}, mailbox=None, runs=())
    for rec in old:
        core.apply(on_disk(rec), 0.0)
    core.recovered(0.0, clean=True)
    created = [r for r in core.effects.take_records() if r[0] == Rec.SCOPE_CREATED]
    assert created == [(Rec.SCOPE_CREATED, "implicit", WALL, "default")]
    core.connected(ALICE, "alice")
    core.call(Op.CLAIM_RELEASE, {"lease": lease})  # the run holds nothing any more
    assert core.call(Op.CLAIM_INSPECT, {"scope": "implicit", "key": "k"})["held"] is False
    assert core.call(Op.SCOPE_CREATE, {"scope": "implicit"})["created"] is False


def test_another_tenants_chosen_id_is_a_separate_run() -> None:
    core = CoreDriver(tenants={ALICE: ("acme", True), BOB: ("globex", False)},
                      holders={ALICE: "alice", BOB: "bob"}, mailbox=None)
    assert core.call(Op.SCOPE_CREATE, {"scope": "shared-name"}, ALICE)["created"] is True
    assert core.call(Op.SCOPE_CREATE, {"scope": "shared-name"}, BOB)["created"] is True
    assert core.tenant_usage("acme")["runs"] == core.tenant_usage("globex")["runs"] == 2
