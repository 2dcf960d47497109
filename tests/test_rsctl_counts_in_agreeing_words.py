"""rsctl's sentences count in words that agree with the number: "1 task and 1 claim
ended", never "1 claims" (rsctl.render.counted, used by every such sentence)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from rsctl.online import cancel
from rsctl.render import counted


class _Admin:
    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply

    async def cancel(self, scope: str, reason: str, tenant: str | None) -> dict[str, Any]:
        return {"scope": scope, **self.reply}


class _Client:
    def __init__(self, reply: dict[str, Any]) -> None:
        self.admin = _Admin(reply)


@pytest.mark.parametrize(
    ("tasks", "claims", "says"),
    [
        (1, 1, "run r1 cancelled: 1 task and 1 claim ended"),
        (0, 2, "run r1 cancelled: 0 tasks and 2 claims ended"),
        (3, 0, "run r1 cancelled: 3 tasks and 0 claims ended"),
    ],
)
async def test_rsctl_cancel_says_how_many_in_agreeing_words(
    tasks: int, claims: int, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(scope="r1", reason="done", tenant=None, json=False)
    client: Any = _Client({"cancelled": True, "tasks": tasks, "claims": claims})
    assert await cancel(client, args) == 0
    assert capsys.readouterr().out.strip() == says


def test_a_count_of_one_is_singular_every_other_plural() -> None:
    assert [counted(n, "dead letter") for n in (0, 1, 2)] == [
        "0 dead letters", "1 dead letter", "2 dead letters",
    ]
