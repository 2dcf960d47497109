"""The Python side of the merged cursor's cross-SDK checks: a cursor of one SDK pages on
in the other. Each subcommand prints one JSON line:

    fanout_cursor.py cursors JSON
        JSON: {"write": [positions, ...], "read": [cursor, ...]}; prints {"written":
        [write_cursor(p), ...], "read": [read_cursor(c) or the error's class, ...]}
        (test/a_merged_page_asks_each_shard_its_share_of_its_limit.test.ts)
    fanout_cursor.py page ADDRESS CURSOR LIMIT
        one page of every run (ADMIN_SCOPES) through the Python SDK from CURSOR (a JSON
        value: 0 or a merged cursor); prints {"items": [[run, shard], ...], "next": the
        cursor to go on from} (test/the_admin_views_of_real_shards_cover_every_shard.test.ts)
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from rsclient import AsyncRunstate, RunstateError
from rsproto import Op
from rsproto.fanout import read_cursor, write_cursor


def cursors(asked: dict[str, Any]) -> None:
    read: list[object] = []
    for cursor in asked["read"]:
        try:
            read.append(read_cursor(cursor))
        except RunstateError as exc:
            read.append(type(exc).__name__)
    written = [write_cursor(p) for p in asked["write"]]
    print(json.dumps({"written": written, "read": read}))


async def page(address: str, cursor: int | str, limit: int) -> None:
    async with AsyncRunstate(holder="py-pager", address=address) as rs:
        found, after = await rs.admin.page(Op.ADMIN_SCOPES, "scopes", cursor=cursor, limit=limit)
    print(json.dumps({"items": [[obj["scope"], obj["shard"]] for obj in found], "next": after}))


def main() -> None:
    if sys.argv[1] == "cursors":
        cursors(json.loads(sys.argv[2]))
    else:
        asyncio.run(page(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])))


if __name__ == "__main__":
    main()
