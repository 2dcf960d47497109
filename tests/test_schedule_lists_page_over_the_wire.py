"""A run's schedules are listed page by page over the wire, through the Python SDKs:
``run.schedules.list()`` returns every one (by name) however large their data, as
``page()`` and ``iter()`` walk the server's pages (each under the frame limit). Before,
SCHEDULE_LIST answered all of them in one reply, refused past the frame limit
("the reply would be ... bytes"), so six schedules of 200 KB data broke ``list()``.

Why over the wire: the frame limit and the SDK's walk of the cursor are the wire's (the
pages themselves are tested on the core's fake clock).
"""

from __future__ import annotations

from typing import Any

from rsclient import AsyncRunstate
from rsclient.sync import Runstate

_BIG = "x" * 200_000
_NAMES = [f"big-{n}" for n in (3, 1, 5, 0, 4, 2)]  # ensured in this order


async def test_large_schedules_are_listed_page_by_page(clients: Any) -> None:
    rs: AsyncRunstate = clients("sched-pages")
    await rs.mailboxes.ensure("big")
    run = await rs.scopes.create()
    for name in _NAMES:
        await run.schedules.ensure(name, mailbox="big", cron="0 3 * * *", data=_BIG)
    listed = await run.schedules.list()
    assert [s["name"] for s in listed] == sorted(_NAMES)
    assert all(s["data"] == _BIG for s in listed)
    first, cursor = await run.schedules.page()
    assert 1 <= len(first) < len(_NAMES) and cursor is not None  # bounded in bytes
    assert [s["name"] for s in first] == _NAMES[:len(first)]  # in the order ensured
    two, cursor = await run.schedules.page(limit=2, newest_first=True)
    assert [s["name"] for s in two] == _NAMES[::-1][:2] and cursor is not None
    walked = [s["name"] async for s in run.schedules.iter(limit=1)]
    assert walked == _NAMES


def test_the_sync_client_lists_them_too(rsd: Any) -> None:
    with Runstate(holder="sched-pages-sync", address=rsd.address) as rs:
        rs.mailboxes.ensure("big")
        run = rs.scopes.create()
        for name in _NAMES[:5]:
            run.schedules.ensure(name, mailbox="big", every_seconds=3600, data=_BIG)
        assert [s["name"] for s in run.schedules.list()] == sorted(_NAMES[:5])
        found, cursor = run.schedules.page(limit=3)
        assert len(found) == 3 and cursor is not None
