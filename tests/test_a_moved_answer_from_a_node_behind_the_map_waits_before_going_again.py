"""A request answered MOVED by a node whose slot map is older than the client's goes
again only after a pause (``rsproto.sdkrules.LAGGING_NODE_PAUSE_SECONDS``, doubled with
each redirect in a row: ``moved_pause``, the rule both SDKs follow; the TypeScript
twin is this file's name under sdk/typescript/test/, ``.test.ts``).
During a slot move the source lets its held requests go to the target as soon as it has
the new map, while the target adopts it only when its etcd watch says so: it answers
MOVED back meanwhile, and a request sent straight back used all of its MAX_REDIRECTS at
once ("answered MOVED 4 times in a row: the slot map did not settle"; 1 run in 36 of
tests/test_a_slot_move_carries_its_runs_to_the_new_shard.py at load 11 to 14). A MOVED
from a node with a newer map still refreshes the client's map at once, and one with the
same map goes again at once."""

from __future__ import annotations

from typing import Any

import pytest

from rsclient import shards as shards_module
from rsclient.connection import Moved
from rsclient.shards import Shards
from rsproto.sdkrules import LAGGING_NODE_PAUSE_SECONDS as LAGGING_NODE_PAUSE


class Known:
    """The client's slot map, as far as ``follow`` reads it."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch


def shards_knowing(epoch: int) -> tuple[Shards, list[str]]:
    shards = object.__new__(Shards)
    shards.map = Known(epoch)  # type: ignore[assignment]
    refreshed: list[str] = []

    async def refresh(**_: Any) -> bool:
        refreshed.append("map asked")
        return True

    shards.refresh = refresh  # type: ignore[method-assign]
    return shards, refreshed


def moved(epoch: int) -> Moved:
    return Moved("MOVED: slot 7 is shard b's", {"map_epoch": epoch}, None)  # type: ignore[arg-type]


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    taken: list[float] = []

    async def sleep(seconds: float) -> None:
        taken.append(seconds)

    monkeypatch.setattr(shards_module.asyncio, "sleep", sleep)
    return taken


async def test_a_node_behind_the_clients_map_is_given_time_to_catch_up(
    pauses: list[float],
) -> None:
    shards, refreshed = shards_knowing(epoch=5)
    for redirects in (1, 2, 3):
        await shards.follow(moved(epoch=4), redirects)
    assert pauses == [LAGGING_NODE_PAUSE, 2 * LAGGING_NODE_PAUSE, 4 * LAGGING_NODE_PAUSE]
    assert refreshed == []  # the client's map is the newer: nothing to ask


async def test_a_node_ahead_refreshes_at_once_and_one_level_goes_again_at_once(
    pauses: list[float],
) -> None:
    shards, refreshed = shards_knowing(epoch=5)
    await shards.follow(moved(epoch=6), 1)
    await shards.follow(moved(epoch=5), 1)
    assert refreshed == ["map asked"]
    assert pauses == []
