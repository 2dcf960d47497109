"""Debounced sends through rsclient (async and sync) against a real rsd: ``send(data,
debounce_key=..., debounce_seconds=...)`` reaches the server, a later send with the key
replaces the waiting message's data (``replaced`` True, its id), the one delivery
carries the newest data, the next send after it starts a new message, and bad
combinations are refused. The rules themselves are tested on the fake clock in
tests/test_core_debounced_sends_fold_into_one_waiting_message.py; this file's reason to
exist is the SDK's arguments and reply over the wire.

Each test works in a run of its own (a mailbox "jobs" ensured alike by all), so they
share one rsd (``rsd_per_module``, tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.process import Rsd

from rsclient import AsyncRunstate, ConflictError, InvalidArgumentError
from rsclient.sync import Runstate

MakeClient = Callable[..., AsyncRunstate]
pytestmark = pytest.mark.rsd_per_module


async def test_sends_with_one_key_become_one_delivery_of_the_newest_data(
    clients: MakeClient,
) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    first = await box.send({"v": 1}, debounce_key="doc:7", debounce_seconds=60)
    assert first["replaced"] is False and first["replay"] is False
    second = await box.send({"v": 2}, debounce_key="doc:7", debounce_seconds=60)
    assert second == {"id": first["id"], "replay": False, "replaced": True}
    assert (await box.inspect())["delayed"] == 1
    assert await box.receive() is None  # its window (60 s) has not passed
    # A last send with a short window brings it forward: delivered once, newest data.
    last = await box.send({"v": 3}, debounce_key="doc:7", debounce_seconds=0.05)
    assert last["id"] == first["id"] and last["replaced"] is True
    delivery = await box.receive(wait=True, timeout_ms=30_000)
    assert delivery is not None and delivery.data == {"v": 3} and delivery.id == first["id"]
    await delivery.complete()
    assert (await box.inspect())["delayed"] == 0
    anew = await box.send({"v": 4}, debounce_key="doc:7", debounce_seconds=60)
    assert anew["replaced"] is False and anew["id"] != first["id"]
    plain = await box.send("plain")
    assert "replaced" not in plain  # a send without a debounce key answers as before


async def test_bad_debounce_arguments_are_refused(clients: MakeClient) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("jobs")
    box = (await rs.scopes.create()).mailbox("jobs")
    for kwargs in (
        {"debounce_key": "k"},
        {"debounce_key": "k", "debounce_seconds": 0},
        {"debounce_key": "k", "debounce_seconds": -1},
        {"debounce_key": "k", "debounce_seconds": 10**9},
        {"debounce_key": "k" * 513, "debounce_seconds": 5},
        {"debounce_key": "k", "debounce_seconds": 5, "work_key": "w"},
        {"debounce_key": "k", "debounce_seconds": 5, "delay_seconds": 1},
    ):
        with pytest.raises(InvalidArgumentError):
            await box.send(1, **kwargs)  # type: ignore[arg-type]
    await box.send(1, debounce_key="k", debounce_seconds=60, priority=3)
    with pytest.raises(ConflictError):
        await box.send(2, debounce_key="k", debounce_seconds=60)  # another priority
    assert (await box.inspect())["delayed"] == 1


def test_the_sync_client_sends_debounced_too(rsd: Rsd) -> None:
    with Runstate(holder="sync", address=rsd.address) as rs:
        rs.mailboxes.ensure("jobs")
        box = rs.scopes.create().mailbox("jobs")
        first = box.send("a", debounce_key="k", debounce_seconds=60)
        again = box.send("b", debounce_key="k", debounce_seconds=60)
        assert again == {"id": first["id"], "replay": False, "replaced": True}
