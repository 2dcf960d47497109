"""SCHEDULE_LIST is paged like every listing (``cursor``, ``limit``, ``newest_first``,
the reply's ``next``), and a page weighs its schedules' data: a run's 100 schedules
with 200 KB of data each come back page after page, each page under the frame limit,
each schedule exactly once. Before, the one reply of all of them was refused ("the reply
would be 20,015,708 bytes, over the frame limit"), and with it rs.schedules.list() and
the dashboard's page.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from rsd.policy import Policy
from rsproto import ErrorCode, Limits, Op
from tests.support.core import CoreDriver

_BIG = "x" * 200_000


def _ensure(core: CoreDriver, count: int, data: Any = None, prefix: str = "s") -> list[str]:
    names = [f"{prefix}-{n:03}" for n in range(count)]
    for name in names:
        core.call(Op.SCHEDULE_ENSURE, {"scope": "s", "name": name, "mailbox": "jobs",
                                       "cron": "0 3 * * *", "data": data})
    core.drain()
    return names


def _walk(core: CoreDriver, **args: Any) -> list[dict[str, Any]]:
    """Every page of the listing: each page's reply as the wire would carry it."""
    pages: list[dict[str, Any]] = []
    cursor: int | None = 0
    while cursor is not None:
        reply = core.call(Op.SCHEDULE_LIST, {"scope": "s", "cursor": cursor, **args})
        pages.append(reply)
        cursor = reply["next"]
    return pages


def test_large_schedules_come_back_page_by_page_each_page_under_a_frame() -> None:
    core = CoreDriver(recovered=True)
    names = _ensure(core, Policy.MAX_SCHEDULES_PER_RUN, _BIG)
    pages = _walk(core)
    sizes = [len(msgpack.packb(page, use_bin_type=True)) for page in pages]
    assert max(sizes) < Limits.MAX_FRAME_BYTES
    assert sum(sizes) > 100 * 200_000  # what one reply could not carry
    listed = [schedule["name"] for page in pages for schedule in page["schedules"]]
    assert listed == names  # each once, in the order they were ensured
    assert all(page["schedules"] for page in pages)  # each page holds one at least
    assert all(schedule["data"] == _BIG for page in pages for schedule in page["schedules"])


def test_small_schedules_page_by_limit_and_newest_first() -> None:
    core = CoreDriver(recovered=True)
    names = _ensure(core, 25)
    first = core.call(Op.SCHEDULE_LIST, {"scope": "s"})  # the default page: all 25
    assert [s["name"] for s in first["schedules"]] == names and first["next"] is None
    pages = _walk(core, limit=10)
    assert [len(page["schedules"]) for page in pages] == [10, 10, 5]
    newest = _walk(core, limit=10, newest_first=True)
    assert [s["name"] for page in newest for s in page["schedules"]] == names[::-1]


def test_a_walk_skips_what_was_deleted_and_each_schedule_comes_once() -> None:
    core = CoreDriver(recovered=True)
    names = _ensure(core, 12)
    page = core.call(Op.SCHEDULE_LIST, {"scope": "s", "limit": 5})
    core.call(Op.SCHEDULE_DELETE, {"scope": "s", "name": names[7]})
    core.call(Op.SCHEDULE_ENSURE, {"scope": "s", "name": names[8], "mailbox": "jobs",
                                   "every_seconds": 60})  # a new definition: moves last
    rest: list[dict[str, Any]] = []
    cursor = page["next"]
    while cursor is not None:
        reply = core.call(Op.SCHEDULE_LIST, {"scope": "s", "cursor": cursor, "limit": 5})
        rest.append(reply)
        cursor = reply["next"]
    listed = [s["name"] for s in page["schedules"]] + [
        s["name"] for reply in rest for s in reply["schedules"]]
    assert listed == [*names[:7], *names[9:], names[8]]


@pytest.mark.parametrize("args", [{"limit": 0}, {"limit": Policy.ADMIN_PAGE_MAX + 1},
                                  {"cursor": -1}, {"cursor": "x"}])
def test_bad_paging_arguments_are_refused(args: dict[str, Any]) -> None:
    core = CoreDriver(recovered=True)
    _ensure(core, 1)
    refused = core.refused(Op.SCHEDULE_LIST, {"scope": "s", **args})
    assert refused.code == ErrorCode.INVALID_ARGUMENT
