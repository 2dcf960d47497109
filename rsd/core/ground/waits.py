"""Pending waits: requests whose reply is deferred until something happens.

A claim acquire with ``wait``, a task ``result`` (tasks.py) and a queue ``receive`` can
all park on the server. Each is a Wait: it belongs to one connection and one request id, it is
parked in some owner's line (a claim's FIFO, a task's watchers, a queue's consumers),
and it ends in exactly one of four ways: it is served (the owner replies), it times out
(WAIT_TIMEOUT), the client cancels it (CANCELLED), or its connection closes (dropped,
no reply). This module is the one registry of them, so CANCEL and disconnects work the
same for every kind of wait.

What always holds:
- a wait that ended is in no line, no registry and not on the timer wheel (its entry is
  cancelled when it ends; the lines drop it lazily, see ``WaitLine``): memory follows
  the waits that are pending, not the ones that were;
- timeouts: waits whose deadlines come in order (most do: a client asks with one
  timeout) share one wheel entry, for the first of them, in a ``DeadlineLine``
  (dueline.py); a wait whose deadline is before the line's last gets a wheel entry of
  its own. Either
  way a wait times out at its deadline, never before, and at most a wheel tick after;
- finding a wait (CANCEL, the end of a wait) and taking it out of its line cost O(1)
  amortised, whatever the number of waits; ``total()`` is a counter;
- a connection holds at most ``max_per_conn`` pending waits, and a tenant (its
  connections together) at most its ``waits`` limit (tenants.py); the tenant's count
  follows the registry, so a wait counts exactly while it is registered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from rsproto import ErrorCode

from .dueline import DeadlineLine
from .effects import Effects
from .errors import CoreError
from .tenants import Tenants
from .timerwheel import TimerWheel

__all__ = ["Wait", "WaitLine", "Waits", "leave_line"]



class Wait:
    __slots__ = (
        "conn", "deadline", "lined", "pending", "registry", "request_id", "run", "since",
    )

    def __init__(self, conn: int, request_id: int, deadline: float, since: float) -> None:
        self.conn = conn
        self.request_id = request_id
        self.deadline = deadline
        self.since = since  # when it parked: a grant tells the client how long it waited
        self.pending = True
        self.registry: Waits | None = None
        self.lined = False  # its timeout is in the registry's deadline line (Waits)
        # The run it is parked for, when that run must find it to end it on
        # cancellation (pool and quota waits, which sit in lines of no run): the run's
        # ``parked`` holds the wait exactly while it is registered here.
        self.run: Any = None

    def withdraw(self) -> None:
        """Leave the owner's line (called once ``pending`` is False). Subclasses know
        which line that is."""
        raise NotImplementedError

    def timeout_message(self) -> str:
        return "the wait timed out"

    def fire(self, now: float) -> None:
        """Called by the timer wheel at the deadline."""
        if not self.pending or self.registry is None:
            return
        if self.deadline > now:  # float rounding in the wheel: not yet
            self.registry.wheel.schedule(self.deadline, self)
            return
        self.registry.end(self, ErrorCode.WAIT_TIMEOUT, self.timeout_message())


class WaitLine:
    """A first-in first-out line of waits, any of which can leave it in O(1) amortised.

    A wait that ends while in line (timeout, cancel, dropped connection) is marked not
    pending and counted as stale; its entry is skipped when it reaches the front, and
    the line is rebuilt without such entries once they are half of it (at a cost paid
    by the withdrawals that made them). So a line never holds more than twice its
    pending waits, plus a constant, and ``len`` counts only pending ones.
    """

    __slots__ = ("_line", "_stale")

    def __init__(self) -> None:
        self._line: deque[Wait] = deque()
        self._stale = 0

    def __len__(self) -> int:
        return len(self._line) - self._stale

    def __iter__(self) -> Iterator[Wait]:
        return (wait for wait in self._line if wait.pending)

    def append(self, wait: Wait) -> None:
        self._line.append(wait)

    def take(self) -> list[Wait]:
        """Every pending wait, in line order, taken off the line (left empty)."""
        line = self._line
        waits = list(line) if not self._stale else [wait for wait in line if wait.pending]
        line.clear()
        self._stale = 0
        return waits

    def peek(self) -> Wait | None:
        """The longest-waiting pending wait, left in line; None if none. Ended entries
        in front of it are dropped on the way, so repeated peeks cost O(1) amortised."""
        line = self._line
        while line:
            wait = line[0]
            if wait.pending:
                return wait
            line.popleft()
            self._stale -= 1
        return None

    def popleft(self) -> Wait | None:
        """The longest-waiting pending wait, taken off the line; None if none."""
        line = self._line
        while line:
            wait = line.popleft()
            if wait.pending:
                return wait
            self._stale -= 1
        return None

    def withdraw(self, wait: Wait) -> None:
        """``wait`` (in this line, no longer pending) leaves it."""
        self._stale += 1
        line = self._line
        if self._stale == len(line):
            line.clear()
            self._stale = 0
        elif self._stale > 32 and self._stale * 2 > len(line):
            self._line = deque(entry for entry in line if entry.pending)
            self._stale = 0


class Waits:
    def __init__(
        self, wheel: TimerWheel, effects: Effects, max_per_conn: int, tenants: Tenants,
        release_run: Callable[[Any], None],
    ) -> None:
        self.wheel = wheel
        self.tenants = tenants
        self.deadlines = DeadlineLine(wheel)  # the timeouts that come in order
        self.effects = effects
        self.max_per_conn = max_per_conn
        self._by_conn: dict[int, dict[int, Wait]] = {}
        self._total = 0
        # A run its last parked wait kept may be empty now (Tables.release_scope).
        self.release_run = release_run

    def total(self) -> int:
        return self._total

    def count(self, conn: int) -> int:
        return len(self._by_conn.get(conn, ()))

    def add(self, wait: Wait) -> None:
        """Register a wait the caller has already put in its owner's line."""
        by_conn = self._by_conn.setdefault(wait.conn, {})
        if wait.request_id in by_conn:
            wait.pending = False
            wait.withdraw()
            raise CoreError(
                ErrorCode.INVALID_ARGUMENT, f"request id {wait.request_id} is already waiting"
            )
        if len(by_conn) >= self.max_per_conn:
            wait.pending = False
            wait.withdraw()
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"this connection already has {self.max_per_conn} pending waits, the limit",
            )
        tenants = self.tenants
        usage = tenants.usage_of(wait.conn)
        if usage.waits >= tenants.limits.waits:  # at the limit: ``room`` refuses it
            try:
                tenants.room(tenants.of(wait.conn), "waits")
            except CoreError:
                wait.pending = False
                wait.withdraw()
                if not by_conn:
                    del self._by_conn[wait.conn]
                raise
        by_conn[wait.request_id] = wait
        self._total += 1
        usage.waits += 1
        wait.registry = self
        if wait.run is not None:
            wait.run.parked[wait] = None
        self._time(wait)

    def served(self, wait: Wait) -> None:
        """The owner took the wait out of its line and is replying to it."""
        wait.pending = False
        self._forget(wait)

    def end(
        self, wait: Wait, code: ErrorCode, message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        """End a wait with an error reply (timeout, cancellation, scope cancelled, its
        run moved to another shard)."""
        if not wait.pending:
            return
        wait.pending = False
        wait.withdraw()
        self._forget(wait)
        self.effects.error(wait.conn, wait.request_id, code, message, details)

    def cancel(self, conn: int, request_id: int) -> bool:
        wait = self._by_conn.get(conn, {}).get(request_id)
        if wait is None:
            return False
        self.end(wait, ErrorCode.CANCELLED, "the wait was cancelled by the client")
        return True

    def drop_connection(self, conn: int) -> None:
        """The connection closed: its waits end without a reply. O(its waits)."""
        by_conn = self._by_conn.pop(conn, {})
        self._total -= len(by_conn)
        if by_conn:
            self.tenants.of_tenant(self.tenants.of(conn)).waits -= len(by_conn)
        for wait in by_conn.values():
            if wait.run is not None:
                wait.run.parked.pop(wait, None)
                self.release_run(wait.run)
            if wait.pending:
                wait.pending = False
                wait.withdraw()
                self._untime(wait)

    def _forget(self, wait: Wait) -> None:
        """Out of the registry and off the wheel (a no-op for the wheel if it fired),
        and out of its run's parked waits."""
        if wait.run is not None:
            wait.run.parked.pop(wait, None)
            self.release_run(wait.run)
        by_conn = self._by_conn.get(wait.conn)
        if by_conn is not None and by_conn.get(wait.request_id) is wait:
            del by_conn[wait.request_id]
            self._total -= 1
            self.tenants.usage_of(wait.conn).waits -= 1
            if not by_conn:
                del self._by_conn[wait.conn]
        self._untime(wait)


    # ---- timeouts ------------------------------------------------------------------

    def _time(self, wait: Wait) -> None:
        """Arm ``wait``'s timeout: in the deadline line, or on the wheel of its own."""
        if not self.deadlines.add(wait):
            self.wheel.schedule(wait.deadline, wait)  # out of order: not behind the line

    def _untime(self, wait: Wait) -> None:
        """Disarm ``wait``'s timeout (a no-op if it fired). O(1) amortised."""
        if wait.lined:
            self.deadlines.withdraw(wait)
        else:
            self.wheel.cancel(wait.deadline, wait)


def leave_line(owner: Any, wait: Wait) -> None:
    """Take ``wait`` out of ``owner.waiters`` (its WaitLine) and put back the empty tuple
    once the line is empty: a key, pool or quota nobody waits on keeps no line."""
    waiters = owner.waiters
    assert isinstance(waiters, WaitLine)
    waiters.withdraw(wait)
    if not waiters:
        owner.waiters = ()
