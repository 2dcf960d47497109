"""The Python SDK asks rsd for the outcome view (TASK_RESULT ``outcome_only``) exactly
where its caller did, against a real rsd:

- ``ticket.result(outcome_only=True)`` and ``mailbox.submit_and_wait(...,
  outcome_only=True)`` (keyed: the wait by key in the same write; unkeyed: submit, then
  the wait) return the task's id, state, outcome and reason, nothing more, as the sync
  client's twins do;
- without it they return the whole task view, as they always did (the existing tests
  of ``result()`` and ``submit_and_wait`` hold that too);
- a wait made again after a timeout link (an endless wait) keeps asking for the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from rsclient import AsyncRunstate
from rsclient.sync import Runstate
from rsproto import Limits

MakeClient = Callable[..., AsyncRunstate]
# Each test works in a run of its own, so they share one rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module
OUTCOME_KEYS = ["id", "state", "outcome", "reason"]


async def _worker(rs: AsyncRunstate, scope: str, count: int) -> None:
    """Complete ``count`` tasks of ``scope``'s "jobs", each with {"got": its data}."""
    box = rs.scope(scope).mailbox("jobs")
    done = 0
    while done < count:
        delivery = await box.receive(wait=True)
        if delivery is not None:
            await delivery.complete(result={"payload": {"got": delivery.data}})
            done += 1


async def test_result_and_submit_and_wait_return_the_outcome_view_when_asked(
    clients: MakeClient,
) -> None:
    planner, worker = clients("planner"), clients("worker")
    await planner.mailboxes.ensure("jobs")
    run = await planner.scopes.create()
    box = run.mailbox("jobs")
    working = asyncio.create_task(_worker(worker, run.id, 3))
    ticket = await box.submit(1, key="a")
    slim = await ticket.result(timeout_ms=10_000, outcome_only=True)
    keyed = await box.submit_and_wait(2, key="b", timeout_ms=10_000, outcome_only=True)
    unkeyed = await box.submit_and_wait(3, timeout_ms=10_000, outcome_only=True)
    await working
    assert list(slim) == OUTCOME_KEYS
    assert slim == {"id": ticket.id, "state": "SUCCEEDED", "outcome": {"got": 1},
                    "reason": None}
    assert list(keyed) == OUTCOME_KEYS and keyed["outcome"] == {"got": 2}
    assert keyed["id"] == (await box.submit(2, key="b")).id
    assert list(unkeyed) == OUTCOME_KEYS and unkeyed["outcome"] == {"got": 3}
    # Asked without it: the whole view, as always.
    whole = await ticket.result(timeout_ms=0)
    assert whole == await ticket.status() and whole["attempt"] == 1
    again = await box.submit_and_wait(2, key="b", timeout_ms=0)
    assert again == await run.task(keyed["id"]).status()


async def test_an_endless_wait_made_again_still_asks_for_the_outcome_only(
    clients: MakeClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One link of an endless wait lasts 200 ms here, so the wait is made again.
    monkeypatch.setattr(Limits, "MAX_WAIT_TIMEOUT_MS", 200)
    planner, worker = clients("planner"), clients("worker")
    await planner.mailboxes.ensure("jobs")
    run = await planner.scopes.create()
    ticket = await run.mailbox("jobs").submit(7, key="late")
    waiting = asyncio.create_task(ticket.result(outcome_only=True))
    await asyncio.sleep(0.5)  # (two links ended meanwhile; no timing is asserted)
    assert not waiting.done()
    await _worker(worker, run.id, 1)
    assert list(await waiting) == OUTCOME_KEYS


def test_the_sync_clients_result_and_submit_and_wait_ask_alike(rsd: Any) -> None:
    with Runstate(holder="sync-planner", address=rsd.address) as rs:
        rs.mailboxes.ensure("jobs")
        run = rs.scopes.create()
        box = run.mailbox("jobs")
        ticket = box.submit(1, key="a")
        delivery = box.receive()
        assert delivery is not None
        delivery.complete(result={"payload": "done"})
        assert ticket.result(timeout_ms=0, outcome_only=True) == {
            "id": ticket.id, "state": "SUCCEEDED", "outcome": "done", "reason": None,
        }
        assert list(box.submit_and_wait(1, key="a", timeout_ms=0, outcome_only=True)) == (
            OUTCOME_KEYS
        )
        assert ticket.result(timeout_ms=0)["attempt"] == 1
