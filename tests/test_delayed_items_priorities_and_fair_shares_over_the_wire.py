"""Delays, priorities and fair shares through rsclient (async and sync) against a real
rsd: the new arguments of submit, submit_many, send and retry reach the server, and bad
ones are refused with INVALID_ARGUMENT before or at the server.

Each test works in a run of its own (a mailbox "jobs" ensured alike by all), so they
share one rsd (``rsd_per_module``, tests/conftest.py)."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable
from typing import Any

import pytest

from rsclient import AsyncRunstate, ConflictError, InvalidArgumentError, RunstateError
from rsclient.sync import Runstate

MakeClient = Callable[..., AsyncRunstate]
pytestmark = pytest.mark.rsd_per_module


async def test_a_delayed_task_is_delivered_only_once_its_delay_has_run_out(
    clients: MakeClient,
) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    started = time.monotonic()
    ticket = await box.submit({"n": 1}, delay_seconds=0.3)
    view = await ticket.status()
    assert view["state"] == "DELAYED" and view["not_before"] is not None
    assert (await box.inspect())["delayed"] == 1
    assert await box.receive() is None
    delivery = await box.receive(wait=True, timeout_ms=5000)
    assert delivery is not None and delivery.data == {"n": 1}
    assert time.monotonic() - started >= 0.3
    await delivery.complete()


async def test_not_before_takes_the_forms_of_deadline_and_send_takes_a_delay(
    clients: MakeClient,
) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)
    for form in (later, later.isoformat(), later.timestamp()):
        view = (await box.submit(str(form), not_before=form)).view
        assert view["state"] == "DELAYED"
        assert view["not_before"] == pytest.approx(later.timestamp())
    await box.send("m", delay_seconds=60)
    assert (await box.inspect())["delayed"] == 4


async def test_priorities_and_fairness_keys_order_deliveries(clients: MakeClient) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    for n in range(3):
        await box.send(["a", n], fairness_key="a")
    await box.send(["b", 0], fairness_key="b")
    await box.submit(["urgent", 0], priority=9)
    got = [d.data for d in await box.receive_many(10)]
    assert got == [["urgent", 0], ["a", 0], ["b", 0], ["a", 1], ["a", 2]]


async def test_the_same_key_with_another_priority_is_a_conflict(clients: MakeClient) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    await box.submit("x", key="k", priority=3)
    with pytest.raises(ConflictError) as info:
        await box.submit("x", key="k", priority=4)
    assert info.value.code == "IDEMPOTENCY_CONFLICT"


async def test_submit_many_and_retry_take_the_new_fields(clients: MakeClient) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    answers = await box.submit_many([
        {"data": "low"}, {"data": "high", "priority": 5},
        {"data": "later", "delay_seconds": 60}, {"data": "bad", "priority": 10},
    ])
    assert isinstance(answers[3], InvalidArgumentError)
    assert [a.view["state"] for a in answers[:3] if not isinstance(a, RunstateError)] == [
        "PENDING", "PENDING", "DELAYED",
    ]
    first = await box.receive()
    assert first is not None and first.data == "high"
    await first.retry(delay_seconds=0.2)
    second = await box.receive()
    assert second is not None and second.data == "low"
    again = await box.receive(wait=True, timeout_ms=5000)
    assert again is not None and again.data == "high" and again.attempt == 2


@pytest.mark.parametrize("kwargs", [
    {"priority": 10}, {"priority": -1}, {"priority": "high"},
    {"delay_seconds": -1}, {"delay_seconds": math.nan}, {"delay_seconds": 10**12},
    {"delay_seconds": 1, "not_before": 5.0}, {"not_before": "soon"},
    {"fairness_key": "x" * 257}, {"fairness_key": 7},
])
async def test_bad_arguments_are_invalid_argument_errors(
    clients: MakeClient, kwargs: dict[str, Any]
) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    with pytest.raises(InvalidArgumentError):
        await box.submit(1, **kwargs)
    with pytest.raises(InvalidArgumentError):
        await box.send(1, **kwargs)
    assert (await box.inspect())["delayed"] == 0


def test_the_sync_client_takes_the_same_fields(rsd: Any) -> None:
    rs = Runstate(holder="sync", address=rsd.address)
    try:
        rs.mailboxes.ensure("jobs")
        box = rs.scopes.create().mailbox("jobs")
        ticket = box.submit("later", delay_seconds=60, priority=2, fairness_key="acme")
        view = ticket.status()
        assert (view["state"], view["priority"], view["fairness_key"]) == (
            "DELAYED", 2, "acme",
        )
        box.send("now", priority=1)
        delivery = box.receive()
        assert delivery is not None and delivery.data == "now"
        delivery.retry(delay_seconds=30)
        assert box.inspect()["delayed"] == 1
    finally:
        rs.close()


async def test_a_delay_survives_a_restart(restartable: Any) -> None:
    async with AsyncRunstate(holder="p", address=restartable.address) as rs:
        await rs.mailboxes.ensure("jobs")
        run = await rs.scopes.create()
        ticket = await run.mailbox("jobs").submit("x", delay_seconds=1.0, priority=4)
    await restartable.restart()
    async with AsyncRunstate(holder="p", address=restartable.address) as rs:
        box = rs.scope(run.id).mailbox("jobs")
        view = await rs.scope(run.id).task(ticket.id).status()
        assert view["priority"] == 4
        delivery = await box.receive(wait=True, timeout_ms=10_000)
        assert delivery is not None and delivery.id == ticket.id
