"""The core's timer: one ``call_at`` for the core's next deadline, never one per request.

What always holds: after every flush the timer is armed for ``core.next_deadline()``
(or disarmed when there is none), and the server flushes once as it starts serving
(``Server.start``), so a loaded state's deadlines run with no client connected; when
it fires, the core's due deadlines are fired and their effects flushed. A deadline
already past (work the core left for the next turn) fires at the next loop turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core import Core

__all__ = ["CoreTimer"]

_TIMER_SLACK = 0.001  # uvloop's timers have millisecond resolution: never wake early


class CoreTimer:
    def __init__(
        self, core: Core, loop: asyncio.AbstractEventLoop, flush: Callable[[], None]
    ) -> None:
        """``flush``: what sends the output of the expiries a deadline ran (output.py)."""
        self.core = core
        self.loop = loop
        self.flush = flush
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None

    def arm(self) -> None:
        deadline = self.core.next_deadline()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            self._timer = self.loop.call_at(deadline + _TIMER_SLACK, self._on_timer)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = None

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.core.tick(self.loop.time())
        self.flush()
