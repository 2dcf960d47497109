"""``rs.admin`` against a real rsd: each listing of ADMIN_QUOTAS, ADMIN_MAILBOXES,
ADMIN_QUEUES and ADMIN_GROUPS, walked with a page smaller than what it holds, asks page
after page and finds every object made, once, in the order they were made; a dead letter
deleted (DEAD_LETTER_DELETE) is gone from the list and from its queue's count, and
deleting it again, or an id that was never dead-lettered, is NotFoundError. (A server
without a tokens file: every client has the admin role.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from rsclient import AsyncRunstate, NotFoundError
from rsproto import Op

MakeClient = Callable[..., AsyncRunstate]
PAGE = 2
MADE = 5  # three pages of PAGE


def pages_asked(rs: AsyncRunstate, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The op of every page ``rs.admin`` asks the server for, from now on."""
    asked: list[int] = []
    page = rs.admin.page

    async def counted(op: int, field: str, **args: Any) -> Any:
        asked.append(op)
        return await page(op, field, **args)

    monkeypatch.setattr(rs.admin, "page", counted)
    return asked


async def walked(listing: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [obj async for obj in listing]


async def test_each_admin_listing_walked_a_small_page_at_a_time_finds_all_made_in_order(
    clients: MakeClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    rs = clients("ops")
    run = await rs.scopes.create()
    for n in range(MADE):
        await rs.quotas.ensure(f"q-{n}", limit=n + 1, per_seconds=60)
        await rs.mailboxes.ensure(f"box-{n}", max_attempts=n + 1)
        await run.mailbox(f"box-{n}").submit({"n": n}, group=f"g-{n}")
    asked = pages_asked(rs, monkeypatch)

    quotas = await walked(rs.admin.iter_quotas(limit=PAGE))
    assert [(q["name"], q["limit"]) for q in quotas] == [(f"q-{n}", n + 1) for n in range(MADE)]
    mailboxes = await walked(rs.admin.iter_mailboxes(limit=PAGE))
    assert [(m["name"], m["max_attempts"], m["ready"]) for m in mailboxes] == [
        (f"box-{n}", n + 1, 1) for n in range(MADE)
    ]
    queues = await walked(rs.admin.iter_queues(run.id, limit=PAGE))
    assert [(q["mailbox"], q["ready"], q["dead_letters"]) for q in queues] == [
        (f"box-{n}", 1, 0) for n in range(MADE)
    ]
    groups = await walked(rs.admin.iter_groups(run.id, limit=PAGE))
    assert [(g["group"], g["tasks"], g["unfinished"]) for g in groups] == [
        (f"g-{n}", 1, 1) for n in range(MADE)
    ]
    for op in (Op.ADMIN_QUOTAS, Op.ADMIN_MAILBOXES, Op.ADMIN_QUEUES, Op.ADMIN_GROUPS):
        assert asked.count(op) >= 3, (op, asked)  # MADE objects, PAGE to a page


async def test_a_deleted_dead_letter_is_gone_and_deleting_it_again_is_not_found(
    clients: MakeClient,
) -> None:
    rs = clients("ops")
    await rs.mailboxes.ensure("jobs", max_attempts=1)
    run = await rs.scopes.create()
    box = run.mailbox("jobs")
    for n in range(2):
        await box.submit({"n": n})
        delivery = await box.receive()
        assert delivery is not None
        await delivery.reject("bad input")  # dead-lettered
    listed = await rs.admin.dead_letters(run.id, "jobs")
    first, second = (item["id"] for item in listed["items"])
    assert listed["count"] == 2

    deleted = await rs.admin.delete_dead_letter(run.id, "jobs", first)
    assert deleted == {"deleted": first, "left": 1}
    after = await rs.admin.dead_letters(run.id, "jobs")
    assert [item["id"] for item in after["items"]] == [second]
    assert after["count"] == 1
    assert (await box.inspect())["dead_letters"] == 1

    with pytest.raises(NotFoundError):
        await rs.admin.delete_dead_letter(run.id, "jobs", first)  # already deleted
    with pytest.raises(NotFoundError):
        await rs.admin.delete_dead_letter(run.id, "jobs", "never-dead-lettered")
    assert (await rs.admin.dead_letters(run.id, "jobs"))["count"] == 1
