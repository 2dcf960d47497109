"""One view of many shards: the admin listings and stats of a sharded cluster, merged.

Each shard's primary answers the admin ops for what it holds alone. A view of the whole
cluster asks a listing that names no run (ADMIN_SCOPES, ADMIN_POOLS, ADMIN_QUOTAS,
ADMIN_MAILBOXES) of every shard that owns slots, and merges the answers into one page.
Two views do the asking: the Python SDK's ``rs.admin`` (rsclient/admin.py, when its map
gives slots to more than one shard) and the dashboard's API (rsd/http/shardviews.py);
this module holds the rules both follow, so a cursor one writes the other reads:

- the cursor of a merged page is the client's own, an opaque string: the URL-safe
  base64 of the JSON ``{"at": {shard: cursor or null}}``, each shard's own position
  (its last ``next``; null once its listing is complete, and a shard done is not asked
  again; a shard not named starts at 0: one that came to own slots since the listing
  began is listed whole; one that owns no slot any more is not asked: its runs went
  with its slots);
- one page asks at most ``limit`` objects in all: the first ``min(limit, shards not
  done)`` shards in the map's order, ``limit`` split evenly among them, so a page holds
  at most ``limit`` objects and costs each shard at most its share (a page may hold
  fewer, even none, while the cursor is not None: as a lone rsd's pages, protocol.md's
  "Paging"); every object present for the whole listing comes exactly once;
- each object of a merged page names its shard (``shard``); a page's objects come shard
  by shard in the map's order, each shard's in its own order (``newest_first`` walks
  each shard newest first): there is no order across shards;
- the stats of a sharded cluster are every shard's SERVER_STATS under ``shards``
  (shard → its primary's answer), ``server`` and ``time`` of the first shard, and the
  counters of ``SUMMED`` added up over the shards (a map's counters key by key);
- a shard's row of a view of the cluster (``shard_row``: ``rsctl cluster --json``'s
  ``shards``, the dashboard's overview) is its name, its primary node, its members, its
  slot ranges and its runs, read from its primary's SERVER_STATS.

A server alone, or a cluster of one shard, is none of this: one request, as ever.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any

from rsproto.sdkrules import PAGE_DEFAULT, PAGE_MAX, STATS_SUMMED

__all__ = ["MEMBER_KEYS", "PAGE_DEFAULT", "PAGE_MAX", "SUMMED", "CursorError", "merge_page",
           "merge_stats", "plan_page", "read_cursor", "shard_row", "write_cursor"]

# A page's ``limit`` when none is given and the most it may be (PAGE_DEFAULT, PAGE_MAX),
# and the SERVER_STATS counters that add up over shards (the others are each shard's
# own): rsproto/sdkrules.py's, the rules both SDKs share.
SUMMED = STATS_SUMMED

# A cluster member's fields a view of the shards shows (``rsctl cluster``, the dashboard).
MEMBER_KEYS = ("node", "address", "role", "sync", "lag_records")

Positions = dict[str, int | None]  # shard -> its cursor (None: its listing is complete)


class CursorError(ValueError):
    """A cursor no page of a merged listing gave (the SDK raises InvalidArgumentError,
    the dashboard's API answers 400)."""


def write_cursor(positions: Positions) -> str | None:
    """The merged cursor of ``positions``; None once every shard's listing is complete."""
    if all(at is None for at in positions.values()):
        return None
    text = json.dumps({"at": positions}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(text.encode()).decode()


def read_cursor(cursor: object) -> Positions:
    """The positions of a merged cursor (0: a listing's start); CursorError for anything
    that is no cursor this module wrote."""
    if cursor == 0 and not isinstance(cursor, bool):
        return {}
    if isinstance(cursor, str):
        try:
            found = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        except (ValueError, binascii.Error, UnicodeError):
            found = None
        at = found.get("at") if isinstance(found, dict) else None
        if isinstance(at, dict) and all(
            isinstance(k, str) and (v is None or (isinstance(v, int)
                                                  and not isinstance(v, bool) and v >= 0))
            for k, v in at.items()
        ):
            return dict(at)
    raise CursorError(
        f"cursor {cursor!r} is not one a page of this listing gave: a sharded cluster's "
        "listing starts at 0 and goes on from the string each page returns")


def plan_page(
    positions: Positions, shards: Iterable[str], limit: int
) -> list[tuple[str, int, int]]:
    """The requests of one merged page: ``(shard, its cursor, its limit)`` for the first
    ``min(limit, shards not done)`` shards not done (``shards``: those that own slots,
    in the map's order), ``limit`` split evenly among them (the first get one more)."""
    going = [(name, at) for name in shards if (at := positions.get(name, 0)) is not None]
    asked = going[:limit]
    if not asked:
        return []
    share, extra = divmod(limit, len(asked))
    return [(name, at, share + (1 if n < extra else 0)) for n, (name, at) in enumerate(asked)]


def merge_page(
    positions: Positions, shards: Iterable[str], asks: list[tuple[str, int, int]],
    answers: Mapping[str, Mapping[str, Any]], field: str,
) -> tuple[list[dict[str, Any]], str | None]:
    """One merged page from the answers to ``asks`` (``plan_page``'s; ``answers``: shard
    → its reply, each with ``field`` and ``next``; a shard asked but missing from
    ``answers`` keeps its position, so the next page asks it again): the objects, each
    naming its shard, shard by shard in ``asks``' order, and the cursor to go on from
    (``shards``: those that own slots now; one not named starts at 0 on a later page)."""
    found: list[dict[str, Any]] = []
    after: Positions = {name: positions.get(name, 0) for name in shards}
    for name, _, _ in asks:
        answer = answers.get(name)
        if answer is None:
            continue
        for obj in answer[field]:
            obj["shard"] = name
            found.append(obj)
        after[name] = answer["next"]
    return found, write_cursor(after)


def shard_row(
    name: str, ranges: Iterable[tuple[int, int]], stats: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Shard ``name``'s row of a view of the cluster (``rsctl cluster --json``'s
    ``shards``): from its primary's SERVER_STATS (``stats``; None: its primary could not
    be asked, so no primary, no members, runs unknown)."""
    primary, members, runs = None, [], None
    if stats is not None:
        view = stats.get("cluster") or {}
        primary = view.get("primary")
        members = [{key: member.get(key) for key in MEMBER_KEYS}
                   for member in view.get("members", ())]
        runs = (stats.get("core") or {}).get("scopes")
    return {"shard": name, "primary": primary, "members": members,
            "slots": [list(span) for span in ranges], "runs": runs}


def merge_stats(answers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The stats of a sharded cluster from each shard's SERVER_STATS (``answers``, in the
    map's order): see the module docstring."""
    first = next(iter(answers.values()))
    merged: dict[str, Any] = {"server": first.get("server"), "time": first.get("time")}
    for key in SUMMED:
        values = [stats[key] for stats in answers.values() if key in stats]
        total = _total(values)
        if total is not None:
            merged[key] = total
    merged["shards"] = {name: dict(stats) for name, stats in answers.items()}
    return merged


def _total(values: list[Any]) -> Any:
    """The sum of numbers, or of maps key by key (recursively); None if they are
    neither (a counter some shard does not keep as the others do)."""
    if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return sum(values)
    if values and all(isinstance(v, dict) for v in values):
        keys: dict[str, None] = {}
        for value in values:
            keys.update(dict.fromkeys(value))
        summed = {k: _total([v[k] for v in values if k in v]) for k in keys}
        return {k: v for k, v in summed.items() if v is not None}
    return None
