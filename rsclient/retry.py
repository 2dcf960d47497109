"""Trying again and giving up: the one backoff with jitter, the one way to outlast a
reconnect, and the one give-up timer for an answer that may never come.

What always holds:
- ``Backoff``: each pause is the current delay times a random factor in [0.5, 1]
  (so clients that failed together do not retry together); the delay then doubles, up
  to its ceiling; ``reset()`` starts over after a success;
- ``wait_across_reconnects``: a wait parked on the server dies with its connection (the
  server forgets it); it is made again on the next connection for the time that is left,
  never for longer than the caller asked in total. The request that got the answer
  gives the send time its caller dates a grant from;
- ``GiveUpLines`` (on parked waits): at its moment a future is cancelled, unless it is
  done by then; ``gave_up`` tells that apart from a cancellation of the caller. Futures
  given up after the same delay form one first-in first-out line (the loop's clock never
  goes back, so their moments are in order) with one timer, armed at the moment of its
  first future: a wait costs a dict insertion and removal, no timer handle of its own
  (under uvloop a ``call_later`` and its cancel measured about 1.7 us, the line 0.1 us,
  ``asyncio.timeout()`` more still), and no future is given up a moment early or late.
  An answered future leaves its line; a line that empties cancels its timer and is
  dropped, so what is kept is O(futures watched now);
- ``GiveUps``: the same for many futures that are almost always answered long before
  their moment (every release): one loop timer for all of them, futures grouped in
  half-second buckets, so a watched future costs a set insertion and removal rather than
  a timer handle; a future is given up no sooner than its moment and at most one bucket
  (half a second) later.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import UnavailableError, WaitTimeoutError
from .wire import ErrorCode, Limits

if TYPE_CHECKING:
    from .session import Session

__all__ = [
    "Backoff", "FirstWait", "GiveUpLine", "GiveUpLines", "GiveUps", "gave_up",
    "wait_across_reconnects",
]


class Backoff:
    """Exponential backoff with jitter, from ``first`` seconds up to ``ceiling``."""

    __slots__ = ("ceiling", "delay", "first")

    def __init__(self, first: float, ceiling: float) -> None:
        self.first = first
        self.ceiling = ceiling
        self.delay = first

    def next_pause(self) -> float:
        """The pause before the next try; the delay after it doubles."""
        pause = self.delay * random.uniform(0.5, 1.0)
        self.delay = min(self.delay * 2, self.ceiling)
        return pause

    async def sleep(self) -> None:
        """Sleep for the next pause (exponential with jitter, capped)."""
        await asyncio.sleep(self.next_pause())

    def reset(self) -> None:
        """Start again from the first pause (after a success)."""
        self.delay = self.first


class GiveUps:
    """Futures cancelled at their moment unless done by then, on one shared timer."""

    GRAIN = 0.5  # seconds per bucket

    __slots__ = ("_buckets", "_timer", "_timer_slot")

    def __init__(self) -> None:
        self._buckets: dict[int, set[asyncio.Future[Any]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_slot = 0

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._buckets.values())

    def watch(self, fut: asyncio.Future[Any], at: float) -> int:
        """Give ``fut`` up at loop time ``at`` (rounded up to its bucket); its bucket,
        for ``unwatch``."""
        slot = math.ceil(at / self.GRAIN)
        bucket = self._buckets.get(slot)
        if bucket is None:
            bucket = self._buckets[slot] = set()
        bucket.add(fut)
        if self._timer is None or slot < self._timer_slot:
            self._arm(fut.get_loop(), slot)
        return slot

    def unwatch(self, fut: asyncio.Future[Any], slot: int) -> None:
        """``fut`` was answered (or its caller left): forget it."""
        bucket = self._buckets.get(slot)
        if bucket is not None:
            bucket.discard(fut)
            if not bucket:
                del self._buckets[slot]

    def _arm(self, loop: asyncio.AbstractEventLoop, slot: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_slot = slot
        self._timer = loop.call_at(slot * self.GRAIN, self._due, loop)

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now_slot = math.floor(loop.time() / self.GRAIN)
        for slot in [slot for slot in self._buckets if slot <= now_slot]:
            for fut in self._buckets.pop(slot):
                if not fut.done():
                    fut.cancel()
        if self._buckets:
            self._arm(loop, min(self._buckets))


class GiveUpLines:
    """Futures each cancelled at exactly its own moment (``delay`` seconds after it was
    watched) unless done by then: one line, and one timer, per distinct delay."""

    __slots__ = ("_lines",)

    def __init__(self) -> None:
        self._lines: dict[float, GiveUpLine] = {}

    def __len__(self) -> int:
        return sum(len(line.futs) for line in self._lines.values())

    def watch(self, fut: asyncio.Future[Any], delay: float) -> GiveUpLine:
        """Give ``fut`` up ``delay`` seconds from now; its line, whose ``unwatch`` forgets
        it once it is answered."""
        line = self._lines.get(delay)
        if line is None:
            line = self._lines[delay] = GiveUpLine(self, fut.get_loop(), delay)
        line.futs[fut] = at = line.loop.time() + delay
        if line.timer is None:
            line.timer = line.loop.call_at(at, line.due)
        return line


class GiveUpLine:
    """The futures of one delay, in the order (and so the order of the moments) they
    were watched; the timer is armed at the first one's moment while any is watched."""

    __slots__ = ("delay", "futs", "loop", "owner", "timer")

    def __init__(
        self, owner: GiveUpLines, loop: asyncio.AbstractEventLoop, delay: float
    ) -> None:
        self.owner = owner
        self.loop = loop
        self.delay = delay
        # An OrderedDict, not a dict: a dict whose oldest keys were deleted scans past
        # their dead slots for its first key, so giving up k futures at one moment would
        # cost O(k^2) (40,000 of them: 0.46 s of the client's loop, against 12 ms here).
        self.futs: OrderedDict[asyncio.Future[Any], float] = OrderedDict()
        self.timer: asyncio.TimerHandle | None = None

    def sent_at(self, fut: asyncio.Future[Any]) -> float:
        """The loop time ``fut`` was watched from (its moment less the line's delay),
        while it is watched; else the loop time now."""
        at = self.futs.get(fut)
        return self.loop.time() if at is None else at - self.delay

    def unwatch(self, fut: asyncio.Future[Any]) -> None:
        """``fut`` was answered (or its caller left): forget it."""
        futs = self.futs
        if futs.pop(fut, None) is not None and not futs:
            self._drop()

    def due(self) -> None:
        """Give up every future whose moment has come; re-arm at the next one's."""
        self.timer = None
        now = self.loop.time()
        futs = self.futs
        while futs:
            fut = next(iter(futs))
            at = futs[fut]
            if at > now:
                self.timer = self.loop.call_at(at, self.due)
                return
            del futs[fut]
            if not fut.done():
                fut.cancel()
        self._drop()

    def _drop(self) -> None:
        """No future left: no timer, and the line leaves its owner."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.owner._lines.get(self.delay) is self:
            del self.owner._lines[self.delay]


def gave_up(fut: asyncio.Future[Any]) -> bool:
    """Whether the CancelledError the current task just caught while awaiting ``fut``
    was the give-up's doing: ``fut`` was cancelled while the task itself was not."""
    if not fut.cancelled():
        return False
    task = asyncio.current_task()
    return task is None or not task.cancelling()


async def wait_across_reconnects(
    session: Session,
    op: int,
    args: dict[str, Any],
    timeout_ms: int | None,
    *,
    give_back: Callable[[Any], None] | None = None,
    time_up: Callable[[], BaseException] | None = None,
    stop_when_closed: bool = False,
    on_send: Callable[[], None] | None = None,
    first: FirstWait | None = None,
) -> tuple[Any, float]:
    """Send ``op`` as a wait of at most ``timeout_ms`` (set as ``args["timeout_ms"]``);
    return its reply and the send time of the request that got it.

    If the connection drops, the wait is made again for the time left. When no time is
    left, ``time_up()`` is raised, or without it the drop's UnavailableError; with
    ``stop_when_closed`` that error is also raised at once if the client was closed.
    The server's own WAIT_TIMEOUT is raised as it is; a MOVED answer (a sharded
    cluster's) is followed as ``failover.py`` says. ``timeout_ms=None`` waits as long
    as it takes, as a chain of the longest waits the server allows. ``on_send()`` is
    called right before each send (to note which connection it goes on). ``first``:
    the caller made the first send itself, and it failed so (``FirstWait``).
    """
    loop = asyncio.get_running_loop()
    started = loop.time() if first is None else first.sent_at
    deadline = None if timeout_ms is None else started + timeout_ms / 1000.0
    wait_ms = Limits.MAX_WAIT_TIMEOUT_MS if timeout_ms is None else timeout_ms
    redirects = 0  # MOVED answers in a row (a sharded cluster's: not executed)
    failure = None if first is None else first.failure
    while True:
        if first is not None:  # the caller's own first send failed so (None: an
            first = None  # endless wait's first link ran out, and the next one goes)
        else:
            args["timeout_ms"] = wait_ms
            sent_at = loop.time()
            if on_send is not None:
                on_send()
            try:
                reply = await session.request_cancellable(
                    op, args, withdraw=True, give_back=give_back, timeout=wait_ms / 1000.0
                )
                return reply, sent_at
            except WaitTimeoutError:
                if deadline is not None:
                    raise
                continue
            except UnavailableError as exc:
                failure = exc
        if failure is None:
            continue
        if failure.code == ErrorCode.MOVED:  # the slot map refreshed; raised past the limit
            redirects += 1
            await session.follow_moved(failure, redirects)
        else:
            redirects = 0
        if deadline is not None:
            wait_ms = _left_ms(deadline - loop.time(), failure, time_up,
                               stop_when_closed and session.closed)


def _left_ms(
    left: float, failure: UnavailableError, time_up: Callable[[], BaseException] | None,
    stop: bool,
) -> int:
    """A wait that failed with ``failure`` is made again for the ``left`` seconds of its
    time, in ms; none left (or ``stop``): ``time_up()`` raised, or ``failure``."""
    if left <= 0 or stop:
        if time_up is None:
            raise failure
        raise time_up() from None
    return int(left * 1000)


class FirstWait:
    """A wait's first send, made by its caller at loop time ``sent_at`` (a coroutine less
    per wait when it is answered, the common case), that failed with ``failure`` (None:
    an endless wait's first link ran out, WaitTimeoutError): ``wait_across_reconnects``
    goes on from there, as if it had made it."""

    __slots__ = ("failure", "sent_at")

    def __init__(self, sent_at: float, failure: UnavailableError | None) -> None:
        self.sent_at = sent_at
        self.failure = failure
