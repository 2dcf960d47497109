"""A merged page of a sharded cluster's listing asks each shard its share of the page's
``limit`` and never more in all, goes on from each shard's own position, asks no shard
that is done, and its cursor, the client's own, round-trips; the stats of several shards
sum their counters key by key (rsproto/fanout.py, the rules the SDK and the dashboard
share; the real shards are tests/test_the_admin_views_of_a_sharded_cluster_cover_every_
shard.py and tests/test_the_dashboard_shows_every_shard.py); the page sizes both SDKs use
(rsproto/sdkrules.py) are the server's."""

from __future__ import annotations

import pytest

from rsd.policy import Policy
from rsproto import sdkrules
from rsproto.fanout import CursorError, merge_stats, plan_page, read_cursor, write_cursor

SHARDS = ["a", "b", "c"]


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 7, 100, 1000])
def test_a_page_asks_at_most_its_limit_split_evenly(limit: int) -> None:
    asks = plan_page({}, SHARDS, limit)
    shares = [share for _, _, share in asks]
    assert sum(shares) == limit and max(shares) - min(shares) <= 1
    assert [name for name, _, _ in asks] == SHARDS[:limit]
    assert all(at == 0 for _, at, _ in asks)


def test_a_page_goes_on_from_each_shards_position_and_skips_the_done() -> None:
    assert plan_page({"a": None, "b": 40}, SHARDS, 10) == [("b", 40, 5), ("c", 0, 5)]
    assert plan_page({"a": None, "b": None, "c": None}, SHARDS, 10) == []


def test_the_cursor_round_trips_and_ends_when_every_shard_is_done() -> None:
    positions: dict[str, int | None] = {"a": None, "b": 7}
    cursor = write_cursor(positions)
    assert isinstance(cursor, str) and read_cursor(cursor) == positions
    assert read_cursor(0) == {}
    assert write_cursor({"a": None, "b": None}) is None
    for wrong in ("x", 3, True, str(write_cursor({"a": 1}))[:-2], "eyJhdCI6IHsiYSI6IC0xfX0="):
        with pytest.raises(CursorError, match="cursor"):
            read_cursor(wrong)


def test_the_stats_of_shards_sum_their_counters() -> None:
    merged = merge_stats({
        "a": {"server": "rsd a", "time": 1.0, "connections": 2, "core": {"scopes": 3},
              "ops": {"PING": {"ok": 1}}, "journal": {"segment": 4}},
        "b": {"server": "rsd b", "time": 2.0, "connections": 5, "core": {"scopes": 1,
              "claims": 2}, "ops": {"PING": {"ok": 2, "errors": 1}}, "journal": None},
    })
    assert (merged["server"], merged["time"], merged["connections"]) == ("rsd a", 1.0, 7)
    assert merged["core"] == {"scopes": 4, "claims": 2}
    assert merged["ops"] == {"PING": {"ok": 3, "errors": 1}}
    assert "journal" not in merged and merged["shards"]["b"]["journal"] is None


def test_the_page_sizes_both_sdks_use_are_the_servers() -> None:
    assert (sdkrules.PAGE_DEFAULT, sdkrules.PAGE_MAX) == (
        Policy.ADMIN_PAGE_DEFAULT, Policy.ADMIN_PAGE_MAX)
