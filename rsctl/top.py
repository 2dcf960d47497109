"""``rsctl top``: a live view of one rsd (of a sharded cluster: of every shard, the
counters summed, each run naming its shard), refreshed every second until Ctrl-C.

Each refresh asks for SERVER_STATS and the first page of runs (one bounded page, never
the whole list), shows the figures that matter most, the request rates computed from
the previous refresh, and the runs. ``--iterations N`` stops after N refreshes (for
scripts and tests); ``--json`` prints one JSON line per refresh instead of a screen.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from rsclient import AsyncRunstate
from rsproto import Op

from .online import SCOPE_COLUMNS, rates
from .render import flatten, print_json, print_pairs, print_table

__all__ = ["top"]

_CLEAR = "\x1b[H\x1b[2J"
_RUNS_SHOWN = 20
_HEADLINE = (
    "server", "connections", "core.scopes", "core.claims", "core.leases", "core.items",
    "core.queues", "core.waits", "core.pools", "journal.segment",
    "journal.bytes_since_snapshot", "journal.snapshots", "loop.stalls",
)


async def top(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    previous: dict[str, Any] | None = None
    shown = 0
    clear = sys.stdout.isatty() and not args.json
    while args.iterations is None or shown < args.iterations:
        if shown:
            await asyncio.sleep(args.interval)
        stats = await rs.admin.stats()
        runs, _ = await rs.admin.page(
            Op.ADMIN_SCOPES, "scopes", limit=_RUNS_SHOWN, tenant=args.tenant
        )
        per_second = rates(previous, stats, args.interval) if previous is not None else {}
        previous = stats
        shown += 1
        if args.json:
            print_json({"stats": stats, "rates": per_second, "scopes": runs}, line=True)
            continue
        if clear:
            sys.stdout.write(_CLEAR)
        print(f"rsd at {rs.address}  {time.strftime('%H:%M:%S')}  (Ctrl-C to quit)")
        flat = flatten(stats)
        print_pairs({name: flat[name] for name in _HEADLINE if name in flat})
        if per_second:
            print_pairs(per_second)
        print()
        print_table(runs, ("shard", *SCOPE_COLUMNS) if any("shard" in run for run in runs)
                    else SCOPE_COLUMNS)
        sys.stdout.flush()
    return 0
