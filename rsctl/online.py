"""The rsctl commands that ask a running rsd (through ``rs.admin``, rsclient/admin.py).

What always holds: every listing is fetched page by page (the server bounds each
page), so rsctl shows a list of any length while no request costs the server more
than one page; ``--json`` prints the whole list as one document. Of a sharded cluster
the listings and ``stats`` cover every shard (``rs.admin``: a run's objects from its
shard, the others merged from every shard), each row naming its shard (``shard``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import sys
from typing import Any

from rsclient import AsyncRunstate
from rsclient.wire import Op

from .backup import backup
from .render import (
    MEMBER_KEYS,
    UsageError,
    counted,
    flatten,
    print_json,
    print_pairs,
    print_table,
)
from .slots import shard_views, slots

__all__ = ["COMMANDS", "rates", "request_counters"]

# A stats field is a request counter when its last name is one of these: ops/s are
# computed from two samples of it. (SERVER_STATS is extended by others; rsctl shows
# every field it gets, whatever they are.)
_COUNTER = re.compile(r"(^|\.)(ops|ops_total|requests|requests_total)$")

SCOPE_COLUMNS = ("scope", "created_at", "cancelled", "claims", "tasks", "unfinished", "queues")
CLAIM_COLUMNS = ("key", "generation", "held", "holder", "expires_in",
                 "release_on_disconnect", "waiters")
TASK_COLUMNS = ("id", "kind", "mailbox", "key", "state", "attempt", "dead", "reason",
                "created_at", "finished_at")
POOL_COLUMNS = ("name", "size", "held", "waiters", "generation")
QUOTA_COLUMNS = ("name", "limit", "per_seconds", "level", "waiters", "head_amount")
MAILBOXES_COLUMNS = ("name", "mode", "max_attempts", "retry_backoff_ms", "paused", "ready",
                     "running")
GROUP_COLUMNS = ("group", "tasks", "succeeded", "unfinished", "waiters", "counts")
DEAD_COLUMNS = ("id", "kind", "key", "attempt", "reason", "at")
MAILBOX_COLUMNS = (
    "ready", "running", "delayed", "waiting", "consumers", "dead_letters", "paused",
)
SCHEDULE_COLUMNS = ("name", "mailbox", "every_seconds", "cron", "timezone", "catch_up",
                    "paused", "next_fire", "last_fire", "fires")


def request_counters(stats: dict[str, Any]) -> dict[str, float]:
    """The request counters in a SERVER_STATS reply, by dotted name."""
    return {
        name: value for name, value in flatten(stats).items()
        if _COUNTER.search(name) and isinstance(value, int | float)
        and not isinstance(value, bool)
    }


def rates(
    before: dict[str, Any], after: dict[str, Any], seconds: float
) -> dict[str, float]:
    """``<counter>/s`` for every request counter present in both samples."""
    first, second = request_counters(before), request_counters(after)
    span = seconds
    if isinstance(before.get("time"), float) and isinstance(after.get("time"), float):
        span = after["time"] - before["time"] or seconds  # the server's own clock
    return {
        f"{name}/s": round((second[name] - first[name]) / span, 1)
        for name in second if name in first and span > 0
    }


async def stats(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    first = await rs.admin.stats()
    result = first
    per_second: dict[str, float] = {}
    if request_counters(first):
        await asyncio.sleep(args.interval)
        result = await rs.admin.stats()
        per_second = rates(first, result, args.interval)
    if args.json:
        print_json({**result, "rates": per_second} if per_second else result)
    else:
        print_pairs({**flatten(result), **per_second})
    return 0


async def cluster(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    """The cluster as its primary sees it (SERVER_STATS' ``cluster``, of the primary
    reached: not the merged stats of every shard); a standby's address leads the client
    to the primary (NOT_PRIMARY). Exit 1 for a node alone."""
    view = (await rs.admin.request(Op.SERVER_STATS)).get("cluster")
    if view is None:
        print("rsctl: this rsd is not a node of a cluster (no --etcd)", file=sys.stderr)
        return 1
    shown = {key: view[key] for key in ("cluster", "epoch", "primary")}
    shown["members"] = [{key: member.get(key) for key in MEMBER_KEYS}
                        for member in view["members"]]
    sharded = await shard_views(rs, args)
    if sharded is not None:
        shown.update(sharded)
    if args.json:
        print_json(shown)
        return 0
    print(f"cluster {view['cluster']}, epoch {view['epoch']}, primary {view['primary']}")
    print_table(shown["members"], list(MEMBER_KEYS))
    for shard in shown.get("shards", ()):
        spans = ",".join(f"{lo}-{hi}" for lo, hi in shard["slots"]) or "-"
        print(f"\nshard {shard['shard']}: primary {shard['primary']}, slots {spans}, "
              f"{counted(shard['runs'] or 0, 'run')}")
        print_table(shard["members"], list(MEMBER_KEYS))
    return 0


async def _listing(
    args: argparse.Namespace, items: Any, columns: tuple[str, ...], what: str
) -> int:
    """Every row of a listing; of a sharded cluster each names its shard (``shard``: a
    first column in the table)."""
    rows = [row async for row in items]
    if any("shard" in row for row in rows):
        columns = ("shard", *columns)
        if what == "mailboxes":  # declared on every shard: a mailbox's rows side by side
            rows.sort(key=lambda row: str(row.get("name")))
    if args.json:
        print_json({what: rows})
    else:
        print_table(rows, columns)
    return 0


async def scopes(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    return await _listing(args, rs.admin.iter_scopes(args.tenant), SCOPE_COLUMNS, "scopes")


async def claims(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    return await _listing(
        args, rs.admin.iter_claims(args.scope, args.tenant), CLAIM_COLUMNS, "claims"
    )


async def tasks(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    found = rs.admin.iter_tasks(
        args.scope, state=args.state, mailbox=args.mailbox, tenant=args.tenant
    )
    return await _listing(args, found, TASK_COLUMNS, "tasks")


async def task(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    found = await rs.admin.task(args.scope, args.id, args.tenant)
    if args.json:
        print_json(found)
    else:
        print_pairs(flatten({**found, "links": _links_text(found.get("links"))}))
    return 0


def _links_text(links: dict[str, Any] | None) -> dict[str, Any] | None:
    """A task's parents and children as ``id (STATE)`` lists, one line each."""
    if links is None:
        return None

    def brief(tasks: list[dict[str, Any]]) -> str:
        return ", ".join(f"{task['id']} ({task['state'] or 'forgotten'})" for task in tasks)

    parent = links["parent"]
    return {
        "after": brief(links["after"]) or None,
        "on_parent_failure": links["on_parent_failure"],
        "parent": None if parent is None else brief([parent]),
        "children": brief(links["children"]) or None,
        "children_count": links["children_count"],
    }


async def pools(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    return await _listing(args, rs.admin.iter_pools(args.tenant), POOL_COLUMNS, "pools")


async def quotas(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    found = rs.admin.iterate(Op.ADMIN_QUOTAS, "quotas", tenant=args.tenant)
    return await _listing(args, found, QUOTA_COLUMNS, "quotas")


async def mailboxes(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    found = rs.admin.iterate(Op.ADMIN_MAILBOXES, "mailboxes", tenant=args.tenant)
    return await _listing(args, found, MAILBOXES_COLUMNS, "mailboxes")


async def groups(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    found = rs.admin.iterate(Op.ADMIN_GROUPS, "groups", scope=args.scope, tenant=args.tenant)
    return await _listing(args, found, GROUP_COLUMNS, "groups")


async def mailbox(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    """A mailbox's counts in a run (QUEUE_INSPECT: the connection's own tenant), or
    ``pause``/``resume`` NAME: in every run, or ``--run`` RUN's alone."""
    if args.scope in ("pause", "resume"):
        return await _pause(rs, args, args.scope == "pause")
    if args.run is not None:
        raise SystemExit("rsctl mailbox: --run goes with pause or resume")
    counts = await rs.scope(args.scope).mailbox(args.mailbox).inspect()
    if args.json:
        print_json(counts)
        return 0
    print_table([dict(counts)], MAILBOX_COLUMNS)
    return 0


async def _pause(rs: AsyncRunstate, args: argparse.Namespace, pause: bool) -> int:
    """MAILBOX_PAUSE (every run of the token's tenant) or QUEUE_PAUSE (``--run``)."""
    name: str = args.mailbox
    reply: Any
    if args.run is None:
        reply = await (rs.mailboxes.pause(name) if pause else rs.mailboxes.resume(name))
        where = "every run"
    else:
        box = rs.scope(args.run).mailbox(name)
        reply = await (box.pause() if pause else box.resume())
        where = f"run {args.run}"
    if args.json:
        print_json(reply)
    else:
        print(f"mailbox {name} {'paused' if pause else 'resumed'} in {where}")
    return 0


async def schedules(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    """A run's schedules (SCHEDULE_LIST, every page: the connection's own tenant); fire times as
    ISO 8601 UTC in the table, Unix seconds in --json."""
    found = await rs.scope(args.scope).schedules.list()
    if args.json:
        print_json({"schedules": found})
        return 0
    rows = [{**row, **{k: _iso(row[k]) for k in ("next_fire", "last_fire")}} for row in found]
    print_table(rows, SCHEDULE_COLUMNS)
    return 0


def _iso(when: float | None) -> str | None:
    return None if when is None else dt.datetime.fromtimestamp(when, dt.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


async def dead_letters(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    if args.delete is not None:
        reply = await rs.admin.request(Op.DEAD_LETTER_DELETE, scope=args.scope,
                                       mailbox=args.mailbox, id=args.delete, tenant=args.tenant)
        if args.json:
            print_json(reply)
        else:
            print(f"dead letter {reply['deleted']} deleted, {reply['left']} left")
        return 0
    if args.requeue is None and not args.all:
        found = await rs.admin.dead_letters(args.scope, args.mailbox, tenant=args.tenant)
        if args.json:
            print_json(found)
        else:
            print_table(found["items"], DEAD_COLUMNS)
            if found["truncated"]:
                print("(more dead letters than fit in one reply; the newest are shown)")
        return 0
    requeued: list[dict[str, Any]] = []
    left = 0
    if args.requeue is not None:
        reply = await rs.admin.requeue(
            args.scope, args.mailbox, dead_id=args.requeue, tenant=args.tenant
        )
        requeued, left = reply["requeued"], reply["left"]
    else:
        # Page by page; never more rounds than there were dead letters to begin with
        # (requeued work that fails again comes back to the list, and stays there).
        listed = await rs.admin.dead_letters(args.scope, args.mailbox, tenant=args.tenant)
        budget = listed["count"]
        while budget > 0:
            reply = await rs.admin.requeue(
                args.scope, args.mailbox, all=True, limit=min(budget, 1000), tenant=args.tenant
            )
            requeued += reply["requeued"]
            left = reply["left"]
            budget -= len(reply["requeued"])
            if not reply["requeued"]:
                break
    if args.json:
        print_json({"requeued": requeued, "left": left})
    else:
        print_table(requeued, ("id", "new"))
        print(f"{len(requeued)} requeued, {counted(left, 'dead letter')} left")
    return 0


async def signal(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    """TASK_SIGNAL (the connection's own tenant): ``--data`` is JSON (UsageError, exit
    2, when it is not)."""
    data: Any = None
    if args.data is not None:
        try:
            data = json.loads(args.data)
        except ValueError as exc:
            raise UsageError(f"--data is not JSON: {exc}") from None
    reply = await rs.scope(args.scope).task(args.task).signal(args.name, data)
    if args.json:
        print_json(reply)
    elif reply["woken"]:
        print(f"task {reply['id']} woken by {args.name!r}: {reply['state']}")
    else:
        print(f"task {reply['id']} keeps {args.name!r} for its wait ({reply['state']})")
    return 0


async def cancel(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    reply = await rs.admin.cancel(args.scope, args.reason, args.tenant)
    if args.json:
        print_json(reply)
    else:
        print(f"run {reply['scope']} cancelled: {counted(reply['tasks'], 'task')} and "
              f"{counted(reply['claims'], 'claim')} ended")
    return 0


async def snapshot(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    reply = await rs.admin.snapshot()
    if args.json:
        print_json(reply)
    else:
        print(f"snapshot {reply['snapshot']} written (covers segments up to {reply['covers']})")
    return 0


COMMANDS = {
    "stats": stats, "scopes": scopes, "claims": claims, "tasks": tasks, "task": task,
    "pools": pools, "quotas": quotas, "mailboxes": mailboxes, "groups": groups,
    "mailbox": mailbox, "schedules": schedules, "dead-letters": dead_letters,
    "signal": signal, "cancel": cancel,
    "snapshot": snapshot,
    "cluster": cluster,
    "slots": slots,
    "backup": backup,
}
