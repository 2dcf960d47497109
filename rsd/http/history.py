"""The last minutes of the server, one sample a second: what the dashboard's overview
chart draws (``/api/history``, api.py).

The core never reads a clock, so this lives in the shell: one repeating loop timer
(``interval``, a second) reads a few figures the server already keeps and appends one
row to a ring of the last ``size`` rows (ten minutes). Each row:

- ``time``: the wall clock of the sample (seconds);
- ``requests_per_second``: requests answered (at once, later or with an error) since the
  previous sample, per second of the time between them;
- ``connections``, ``leases_held``: as SERVER_STATS counts them now;
- ``pending``, ``running``, ``delayed``: tasks and messages in those states now (the
  queue depths summed over every mailbox);
- ``loop_lag_ms``: how late this sample's own timer fired: a loop that was busy (or
  stalled) delays every callback, this one among them;
- ``fsync_p99_ms``: the 99th percentile of the fsyncs done since the previous sample
  (None when there was none: ``--fsync no``, or nothing written).

What always holds: a sample costs O(1) (counters and sizes, the bounded list of recent
fsyncs, never a walk over runs, leases or queues); the ring holds at most ``size`` rows,
so memory is fixed; each row has a sequence number, and ``since(after)`` returns only
the rows after a number a client was given, in work proportional to what it returns
(a page polling once a second gets one row, not ten minutes). Where no server answers
(a standby), no row is added; a new server (a standby promoted) starts the rates over.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Sized
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol

from ..core.run.items import State

if TYPE_CHECKING:
    from ..core import Core
    from ..metrics import Metrics

__all__ = ["COLUMNS", "History", "Sampled"]

COLUMNS = ("time", "requests_per_second", "connections", "leases_held", "pending",
           "running", "delayed", "loop_lag_ms", "fsync_p99_ms")
SIZE = 600  # rows: ten minutes at one a second
INTERVAL = 1.0

Row = tuple[float | int | None, ...]


class Sampled(Protocol):
    """What a sample reads of the server (server.py's ``Server`` is one): no more."""

    @property
    def metrics(self) -> Metrics: ...
    @property
    def core(self) -> Core: ...
    @property
    def conns(self) -> Sized: ...


def _requests(metrics: Metrics) -> int:
    return sum(metrics.ok) + sum(metrics.deferred) + sum(metrics.errors.values())


def _p99_ms(recent: deque[float], count: int) -> float | None:
    """The 99th percentile of the newest ``count`` of ``recent`` (at most its length)."""
    count = min(count, len(recent))
    if count <= 0:
        return None
    newest = sorted(islice(reversed(recent), count))
    return round(newest[min(count - 1, math.ceil(0.99 * count) - 1)] * 1000.0, 3)


class History:
    """The ring of samples and the timer that fills it; ``server()``: the server to
    sample, or None where none serves."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        server: Callable[[], Sampled | None],
        *,
        interval: float = INTERVAL,
        size: int = SIZE,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.loop = loop
        self.server = server
        self.interval = interval
        self.wall = wall
        self.rows: deque[Row] = deque(maxlen=size)
        self.last = 0  # the sequence number of the newest row (0: none yet)
        self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        # what the previous sample read, for the rates: its server, instant, counts
        self._seen: tuple[object, float, int, int] | None = None

    def start(self) -> None:
        self._due = self.loop.time() + self.interval
        self._timer = self.loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        now = self.loop.time()
        late = max(0.0, now - self._due)
        self._due = now + self.interval
        self._timer = self.loop.call_at(self._due, self._tick)
        server = self.server()
        if server is not None:
            self.sample(server, now, late)

    def sample(self, server: Sampled, now: float, late: float = 0.0) -> None:
        """Append one row read from ``server`` at loop time ``now`` (``late``: how late
        the timer fired, seconds)."""
        metrics, core = server.metrics, server.core
        requests, fsyncs = _requests(metrics), metrics.fsync.count
        rate: float | None = None
        fsync_p99: float | None = None
        seen = self._seen
        if seen is not None and seen[0] is server and now > seen[1]:
            rate = round((requests - seen[2]) / (now - seen[1]), 1)
            fsync_p99 = _p99_ms(metrics.recent_fsyncs, fsyncs - seen[3])
        self._seen = (server, now, requests, fsyncs)
        by_state = core.work.by_state

        def count(state: State) -> int:
            return by_state[(False, state)] + by_state[(True, state)]

        self.last += 1
        self.rows.append((
            round(self.wall(), 3), rate, len(server.conns), len(core.leases),
            count(State.PENDING), count(State.RUNNING), count(State.DELAYED),
            round(late * 1000.0, 1), fsync_p99,
        ))

    def since(self, after: int) -> dict[str, Any]:
        """The rows after sequence number ``after`` (0, or one this ring never gave: every
        row kept), oldest first, each in ``COLUMNS`` order; ``last``: the number to ask
        after next time."""
        if after > self.last:  # a number from before a restart: every row
            after = 0
        wanted = min(len(self.rows), self.last - after)
        rows = [list(row) for row in islice(reversed(self.rows), wanted)]  # newest first
        rows.reverse()
        return {"interval": self.interval, "columns": list(COLUMNS), "rows": rows,
                "last": self.last}
