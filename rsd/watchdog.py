"""The server's watchdog: event-loop stalls, and frames that never complete.

One repeating timer (every ``Policy.MONITOR_INTERVAL_SECONDS``) does both:

- it measures its own lateness; a lateness of ``Policy.STALL_SECONDS`` or more is a stall
  of the event loop (some callback ran that long, and every client waited), logged with
  its length and counted (``stalls``, ``longest_stall_ms``, in SERVER_STATS);
- it closes connections whose unfinished frame began more than the frame timeout ago.

What always holds: the watchdog adds nothing per request. Connections with an unfinished
frame are kept in the order their frame began (an OrderedDict: a connection whose new
frame begins moves to the end), so each tick looks only at the expired ones and the first
that is not: O(expired + 1).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .policy import Policy

__all__ = ["Watchdog"]

log = logging.getLogger("rsd")

Conn = TypeVar("Conn")


class Watchdog(Generic[Conn]):
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        frame_timeout: float,
        expire: Callable[[Conn], None],
        interval: float = Policy.MONITOR_INTERVAL_SECONDS,
    ) -> None:
        self.loop = loop
        self.frame_timeout = frame_timeout
        self.interval = interval
        self.stalls = 0
        self.longest_stall = 0.0
        self._expire = expire  # called for a connection whose frame is overdue
        self._partial: OrderedDict[Conn, float] = OrderedDict()
        self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.on_lag: Callable[[float], None] | None = None  # each tick's lateness (metrics)

    def start(self) -> None:
        self._due = self.loop.time() + self.interval
        self._timer = self.loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def stats(self) -> dict[str, Any]:
        return {
            "stalls": self.stalls,
            "longest_stall_ms": round(self.longest_stall * 1000.0, 1),
            "unfinished_frames": len(self._partial),
        }

    # ---- unfinished frames -------------------------------------------------------------

    def frame_begun(self, conn: Conn, now: float) -> None:
        """``conn`` holds the first bytes of a new frame, received at ``now``."""
        partial = self._partial
        partial[conn] = now
        partial.move_to_end(conn)

    def frame_pending(self, conn: Conn, now: float) -> None:
        """``conn`` holds part of a frame: its clock runs from ``now`` unless it already ran."""
        if conn not in self._partial:
            self._partial[conn] = now

    def frame_done(self, conn: Conn) -> None:
        """``conn`` holds no unfinished frame, or is not being read (its clock stops)."""
        self._partial.pop(conn, None)

    # ---- the timer ---------------------------------------------------------------------

    def _tick(self) -> None:
        now = self.loop.time()
        late = now - self._due
        if self.on_lag is not None:
            self.on_lag(max(0.0, late))
        if late >= Policy.STALL_SECONDS:
            self.stalls += 1
            self.longest_stall = max(self.longest_stall, late)
            log.warning("event loop stalled for %.0f ms", late * 1000.0)
        self._due = now + self.interval
        self._timer = self.loop.call_at(self._due, self._tick)
        partial = self._partial
        cutoff = now - self.frame_timeout
        while partial:
            conn = next(iter(partial))
            if partial[conn] > cutoff:
                break
            del partial[conn]
            self._expire(conn)
