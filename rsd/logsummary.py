"""Events that can come in floods, logged in at most two lines per interval: the first at
once, the rest summed up when the interval ends.

Failed HELLOs (refusals.py) and the core's notes of kinds that repeat without end (a
schedule's fire skipped, each second, while its tenant has no room: logs.py's
``NoteLog``) are counted here instead of logged one by one.

What always holds:
- ``note(key, count)`` returns True for the first of an interval: its caller logs that
  one, with its details, at once (an operator sees the problem straight away), and an
  interval of ``seconds`` starts; the events after it in that interval are counted,
  per ``key``, and summed up in one line when it ends (``sum_up``), unless there were
  none; a quiet interval says nothing and arms nothing;
- the keys told apart in one interval are bounded (``MAX_SUMMED``): past that, events
  are still counted but no new key is kept (``Interval.capped`` says so), so a flood of
  distinct keys costs bounded memory;
- one timer per summary, only while an interval is open; ``stop`` writes the open
  interval's line at once and arms nothing more.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["MAX_SUMMED", "SUMMARY_SECONDS", "Interval", "LogSummary"]

SUMMARY_SECONDS = 60.0
MAX_SUMMED = 1024  # keys told apart in one interval's summary


@dataclass
class Interval:
    """What one interval saw: ``count`` events (its first included), by key, in
    ``notes`` calls of ``LogSummary.note``."""

    count: int = 0
    notes: int = 0
    by_key: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # how long it lasted

    @property
    def capped(self) -> bool:
        """Whether keys were left uncounted (``MAX_SUMMED`` reached)."""
        return len(self.by_key) >= MAX_SUMMED

    def keys(self) -> str:
        """How many keys, as a summary says it: "at least 1024" once capped."""
        return f"{'at least ' if self.capped else ''}{len(self.by_key)}"

    def worst(self, most: int = 3) -> str:
        """The keys with the most events, "key (n), ...", the most first."""
        top = heapq.nlargest(most, self.by_key.items(), key=lambda item: item[1])
        return ", ".join(f"{key} ({n})" for key, n in top)


class LogSummary:
    """Counts one kind of event per interval; ``sum_up(interval)`` logs its line."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sum_up: Callable[[Interval], None],
        seconds: float = SUMMARY_SECONDS,
    ) -> None:
        self.loop = loop
        self.seconds = seconds
        self._sum_up = sum_up
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0
        self._interval = Interval()

    @property
    def open(self) -> Interval:
        """The interval under way (empty when none is)."""
        return self._interval

    def note(self, key: str, count: int = 1) -> bool:
        """Count ``count`` events of ``key``; True if they are the first of an interval
        (log them)."""
        interval = self._interval
        interval.count += count
        interval.notes += 1
        by_key = interval.by_key
        if key in by_key or len(by_key) < MAX_SUMMED:
            by_key[key] = by_key.get(key, 0) + count
        if self._timer is not None:
            return False
        self._since = self.loop.time()
        self._timer = self.loop.call_later(self.seconds, self._end)
        return True

    def _end(self) -> None:
        self._timer = None
        interval, self._interval = self._interval, Interval()
        if interval.notes <= 1:
            return  # the one note of this interval was logged when it came
        interval.seconds = self.loop.time() - self._since
        self._sum_up(interval)

    def stop(self) -> None:
        """No more timers; the open interval's line is written now."""
        if self._timer is not None:
            self._timer.cancel()
            self._end()
