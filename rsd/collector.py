"""The garbage collector's policy: no full collection of the whole heap while serving.

CPython's cyclic collector scans every tracked object in a full (generation 2)
collection. rsd's live state (claims, leases, tasks, queues) is millions of tracked
objects, so a full collection stalls the event loop for 100 ms to seconds, and every
client with it. rsd's state is freed by reference counting (serving builds no reference
cycles: tests/test_no_reference_cycles_are_left_behind.py for the core's every op family,
tests/test_connections_leave_no_reference_cycles.py for connections), so rescanning it
finds nothing. The policy:

- the young generations (0 and 1) are collected automatically, as CPython does: each
  such collection scans only objects made since the last one, a bounded set;
- automatic full collections are off (generation 2's threshold is out of reach);
- instead, once ``STEP_GENERATIONS`` generation-1 collections have promoted objects into
  generation 2 (checked every ``CHECK_SECONDS`` from the loop, one timer per server), a
  *step* runs: a full collection, which scans only the objects not yet frozen (those
  promoted since the last step, about ``STEP_GENERATIONS`` x 7,000: a few milliseconds;
  CPython itself would rescan the whole heap after 10), then ``gc.freeze()`` moves every
  survivor into the permanent generation, which no collection scans again. Recovery
  (startup.py) and every snapshot's fork (snapshots.py) freeze too, the snapshot after
  the same step.

What always holds: no collection rsd runs or allows scans more than the objects made
since the last step, so its pause is bounded by allocation between two checks, not by
the size of the state. The price: a reference cycle that becomes garbage only after it
was frozen is never reclaimed, which is why serving must not build cycles (the tests
above), and why SERVER_STATS reports what each
collection found (``gc.collected``): a count that keeps growing there is a cycle built
by serving, which a frozen one would leak.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Collector", "frozen_when_done", "settle"]

STEP_GENERATIONS = 4  # generation-1 collections between two steps: ~30k objects, ~3 ms
CHECK_SECONDS = 0.05  # how often the loop looks whether a step is due
NEVER = 2**31 - 1  # a generation-2 threshold no count reaches: no automatic full collection


def settle() -> tuple[int, float]:
    """Collect the objects not yet frozen, then freeze the survivors: the number of
    unreachable objects found and the seconds it took. Scans only the unfrozen part."""
    began = time.perf_counter()
    found = gc.collect()
    gc.freeze()
    return found, time.perf_counter() - began


@contextmanager
def frozen_when_done() -> Iterator[None]:
    """No collection while the block builds the state (recovery: millions of new objects
    would make the collector rescan the heap over and over); everything the block built
    is frozen afterwards, out of every later collection's reach."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


class Collector:
    """The policy above, for one process: ``start`` when serving begins, ``stop`` after.

    Process-wide: the thresholds are the interpreter's, so the first start sets them and
    the last stop puts back what was there (servers made inside a test process).
    """

    _running = 0
    _saved: tuple[int, ...] = ()

    def __init__(self, loop: asyncio.AbstractEventLoop, step: int = STEP_GENERATIONS) -> None:
        self.loop = loop
        self.step = step
        self.steps = 0
        self.last_step = 0.0
        self.longest_step = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        cls = type(self)
        if cls._running == 0:
            cls._saved = gc.get_threshold()
            gc.set_threshold(cls._saved[0], cls._saved[1], NEVER)  # the young ones as they were
        cls._running += 1
        self._timer = self.loop.call_later(CHECK_SECONDS, self._check)

    def stop(self) -> None:
        if self._timer is None:
            return
        self._timer.cancel()
        self._timer = None
        cls = type(self)
        cls._running -= 1
        if cls._running == 0:
            gc.set_threshold(*cls._saved)

    def _check(self) -> None:
        self._timer = self.loop.call_later(CHECK_SECONDS, self._check)
        if gc.get_count()[2] >= self.step:
            self.run_step()

    def run_step(self) -> None:
        """Collect what is not frozen yet and freeze the rest (also before a snapshot's
        fork, so the child shares the pages the collector would otherwise touch)."""
        _, seconds = settle()
        self.steps += 1
        self.last_step = seconds
        self.longest_step = max(self.longest_step, seconds)

    def stats(self) -> dict[str, Any]:
        """SERVER_STATS' ``gc``: O(1), no walk over the heap (counting frozen objects
        would be one)."""
        per_generation = gc.get_stats()
        return {
            "collections": [g["collections"] for g in per_generation],
            "collected": [g["collected"] for g in per_generation],
            "uncollectable": sum(g["uncollectable"] for g in per_generation),
            "steps": self.steps,
            "last_step_ms": round(self.last_step * 1000.0, 3),
            "longest_step_ms": round(self.longest_step * 1000.0, 3),
        }
