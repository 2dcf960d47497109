"""``rsctl task RUN ID`` shows a task's limits by key and, while one holds it back, that
key's state (ADMIN_TASK's ``limits`` and ``held_by``), as a table and as JSON, against a
real rsd. The rule itself is tested on the fake clock in
tests/test_core_a_task_held_by_its_key_holds_back_no_other_key.py; this file's reason to
exist is the operator's view of it."""

from __future__ import annotations

import json

import pytest
from support.process import Rsd

from rsclient import AsyncRunstate
from rsctl.main import run

pytestmark = pytest.mark.rsd_per_module


async def test_rsctl_task_shows_the_key_holding_it_back(
    rsd: Rsd, capsys: pytest.CaptureFixture[str]
) -> None:
    async with AsyncRunstate("planner", rsd.address) as rs:
        await rs.mailboxes.ensure("emails")
        box = (await rs.scopes.create()).mailbox("emails")
        await box.submit({"n": 0}, concurrency_key="user:42", concurrency_limit=1)
        held = await box.submit({"n": 1}, concurrency_key="user:42", concurrency_limit=1)
        running = await box.receive()
        assert running is not None and await box.receive() is None
        capsys.readouterr()
        assert await run(["--address", rsd.address, "task", box.scope_id, held.id, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["limits"] == {"concurrency_key": "user:42", "concurrency_limit": 1}
        assert shown["held_by"] == {"kind": "concurrency", "key": "user:42", "limit": 1,
                                    "running": 1}
        assert await run(["--address", rsd.address, "task", box.scope_id, held.id]) == 0
        table = capsys.readouterr().out
        assert "held_by.key" in table and "user:42" in table
        await running.complete()
        capsys.readouterr()
        assert await run(["--address", rsd.address, "task", box.scope_id, held.id, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["held_by"] is None
