"""The clock a leadership deadline is counted on: the loop's, plus the time the machine
spent suspended since rsd started.

The loop's clock (CLOCK_MONOTONIC) stops while the machine is suspended; etcd, on other
machines, goes on counting our lease. A primary that woke from a suspend would compare a
deadline with a clock that missed the suspend, and think it still leads when its lease
ran out long ago. CLOCK_BOOTTIME counts the suspend: the growth of BOOTTIME - MONOTONIC
since start is the time suspended, and ``now`` adds it to the loop's clock. Where
CLOCK_BOOTTIME does not exist (not Linux), nothing is added.

Deadlines are counted on ``now`` (etcd.py: from a keep-alive's send time); the elector
gives them to the server and to timers in the loop's own time (``in_loop_time``), so the
server's check before anything leaves (output.py) compares with the plain loop clock and
still sees a suspend.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["in_loop_time", "now", "suspended"]

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def _offset() -> float:
    if _BOOTTIME is None:
        return 0.0
    return time.clock_gettime(_BOOTTIME) - time.clock_gettime(time.CLOCK_MONOTONIC)


_START = _offset()


def suspended() -> float:
    """Seconds the machine was suspended since rsd started (0 without CLOCK_BOOTTIME)."""
    return max(0.0, _offset() - _START)


def now() -> float:
    """The running loop's clock plus the time suspended."""
    return asyncio.get_running_loop().time() + suspended()


def in_loop_time(instant: float) -> float:
    """An instant of ``now``'s clock on the loop's clock as it reads now (earlier by
    every suspend so far)."""
    return instant - suspended()
