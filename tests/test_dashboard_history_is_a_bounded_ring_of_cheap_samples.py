"""The dashboard's chart data (rsd/http/history.py): one row a second read from counters the
server keeps, a ring of a fixed number of rows, and ``since`` returning only the rows a
poll has not seen; a new server starts the rates over. Driven by hand (no loop timer, no
sleep): the instants are passed in."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from support.core import CoreDriver

from rsd.http.history import COLUMNS, History
from rsd.metrics import Metrics
from rsproto import Op


def server(core: CoreDriver | None = None) -> Any:
    return SimpleNamespace(metrics=Metrics(), core=core or CoreDriver(), conns={1: 0, 2: 0})


def history(size: int = 5) -> History:
    """A ring whose wall clock reads 1000, 1001, ... (its timer is never started)."""
    clock = iter(range(1000, 2000))
    loop = asyncio.new_event_loop()
    loop.close()
    return History(loop, lambda: None, size=size, wall=lambda: float(next(clock)))


def test_each_row_holds_the_figures_of_its_second() -> None:
    ring = history()
    watched = server()
    core = watched.core
    core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    for n in range(3):
        core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": n})
    core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})
    core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": 9, "delay_ms": 60_000})
    ring.sample(watched, 10.0)
    watched.metrics.ok[Op.PING] += 50
    for seconds in (0.004, 0.001, 0.002):
        watched.metrics.fsynced(seconds)
    ring.sample(watched, 12.0, late=0.0125)
    rows = ring.since(0)
    assert rows["columns"] == list(COLUMNS) and rows["last"] == 2
    first, second = (dict(zip(COLUMNS, row, strict=True)) for row in rows["rows"])
    assert first["requests_per_second"] is None and first["fsync_p99_ms"] is None
    assert second == {
        "time": 1001.0, "requests_per_second": 25.0, "connections": 2, "leases_held": 2,
        "pending": 2, "running": 1, "delayed": 1, "loop_lag_ms": 12.5, "fsync_p99_ms": 4.0,
    }


def test_the_ring_keeps_its_size_and_a_poll_gets_only_new_rows() -> None:
    ring = history(size=5)
    watched = server()
    for n in range(12):
        ring.sample(watched, float(n))
    every = ring.since(0)
    assert len(every["rows"]) == 5 and every["last"] == 12
    assert [row[0] for row in every["rows"]] == [1007.0, 1008.0, 1009.0, 1010.0, 1011.0]
    assert ring.since(12)["rows"] == []
    assert [row[0] for row in ring.since(10)["rows"]] == [1010.0, 1011.0]
    assert len(ring.since(3)["rows"]) == 5  # older than the ring: what it holds
    assert len(ring.since(99)["rows"]) == 5  # a number from before a restart: everything


def test_a_new_server_starts_the_rates_over() -> None:
    ring = history()
    old, new = server(), server()
    old.metrics.ok[Op.PING] = 1000
    ring.sample(old, 1.0)
    ring.sample(new, 2.0)  # a standby promoted: its own counters, from zero
    assert ring.since(0)["rows"][-1][1] is None
