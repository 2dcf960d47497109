"""A loop clock a test moves by hand: ``time()``, ``call_at()`` and ``call_later()``, for
the shell's parts that keep timers of their own (refusals.py, logsummary.py) tested
without a server and without sleeping."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FakeLoop", "FakeTimer"]


class FakeTimer:
    def __init__(self, at: float, callback: Callable[[], None]) -> None:
        self.at, self.callback, self.cancelled = at, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """time(), call_at() and call_later() on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, at: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(at, callback)
        self.timers.append(timer)
        return timer

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        return self.call_at(self.now + delay, callback)

    def live(self) -> list[FakeTimer]:
        return [timer for timer in self.timers if not timer.cancelled]

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for timer in sorted(self.live(), key=lambda t: t.at):
            if timer.at <= self.now and not timer.cancelled:
                timer.cancelled = True  # fired
                timer.callback()
