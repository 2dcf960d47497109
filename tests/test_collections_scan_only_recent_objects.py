"""rsd's collections never scan the whole heap (collector.py).

Automatic full collections are off while a collector runs; a step collects what is not
frozen yet and freezes the survivors, so afterwards no generation holds the long-lived
objects: the next collection, of any generation, scans only what was made since. Stopping
the last collector puts the interpreter's thresholds back.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from rsd.collector import CHECK_SECONDS, NEVER, Collector, frozen_when_done, settle

LIVE = 100_000  # long-lived containers, like a server's claims


@pytest.fixture(autouse=True)
def unfrozen_afterwards() -> Iterator[None]:
    """This test process's heap goes back under the collector once a test is done."""
    yield
    gc.unfreeze()


def unfrozen() -> int:
    """Objects some collection would scan (every generation; frozen ones are in none)."""
    return len(gc.get_objects())


async def test_a_step_freezes_what_survives_when_generation_two_would_run() -> None:
    before = gc.get_threshold()
    collector = Collector(asyncio.get_running_loop())
    collector.start()
    try:
        assert gc.get_threshold()[2] == NEVER  # no automatic full collection
        live = [[n] for n in range(LIVE)]  # promotes into generation 2: a step is due
        assert unfrozen() > LIVE
        await asyncio.sleep(CHECK_SECONDS * 3)
        assert collector.steps >= 1
        assert unfrozen() < LIVE // 10  # the live lists are out of every collection's reach
        stats = collector.stats()
        assert stats["steps"] == collector.steps and stats["longest_step_ms"] > 0
        assert len(stats["collections"]) == len(stats["collected"]) == 3
        assert live[-1] == [LIVE - 1]  # frozen, not freed
    finally:
        collector.stop()
    assert gc.get_threshold() == before


async def test_the_last_collector_to_stop_puts_the_thresholds_back() -> None:
    before = gc.get_threshold()
    loop = asyncio.get_running_loop()
    first, second = Collector(loop), Collector(loop)
    first.start()
    second.start()
    first.stop()
    assert gc.get_threshold()[2] == NEVER  # one is still serving
    second.stop()
    second.stop()  # a second stop changes nothing
    assert gc.get_threshold() == before


def test_settle_collects_unreachable_cycles_before_freezing() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    found, seconds = settle()
    assert found >= 1 and seconds >= 0
    assert unfrozen() < 1000


def test_state_built_under_frozen_when_done_is_frozen_and_the_collector_back_on() -> None:
    assert gc.isenabled()
    with frozen_when_done():
        assert not gc.isenabled()
        built = [[n] for n in range(LIVE)]
    assert gc.isenabled()
    assert unfrozen() < LIVE // 10
    assert len(built) == LIVE
