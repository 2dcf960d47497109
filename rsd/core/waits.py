"""Pending waits: requests whose reply is deferred until something happens.

A claim acquire with ``wait``, a task ``result`` and a queue ``receive`` can all park
on the server. Each is a Wait: it belongs to one connection and one request id, it is
parked in some owner's line (a claim's FIFO, a task's watchers, a queue's consumers),
and it ends in exactly one of four ways: it is served (the owner replies), it times out
(WAIT_TIMEOUT), the client cancels it (CANCELLED), or its connection closes (dropped,
no reply). This module is the one registry of them, so CANCEL and disconnects work the
same for every kind of wait.
"""

from __future__ import annotations

from rsproto import ErrorCode

from .effects import Effects
from .errors import CoreError
from .timerwheel import TimerWheel

__all__ = ["Wait", "Waits"]


class Wait:
    __slots__ = ("conn", "deadline", "pending", "registry", "request_id", "since")

    def __init__(self, conn: int, request_id: int, deadline: float, since: float) -> None:
        self.conn = conn
        self.request_id = request_id
        self.deadline = deadline
        self.since = since  # when it parked: a grant tells the client how long it waited
        self.pending = True
        self.registry: Waits | None = None

    def withdraw(self) -> None:
        """Leave the owner's line. Subclasses know which line that is."""
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


class Waits:
    def __init__(self, wheel: TimerWheel, effects: Effects, max_per_conn: int) -> None:
        self.wheel = wheel
        self.effects = effects
        self.max_per_conn = max_per_conn
        self._by_conn: dict[int, dict[int, Wait]] = {}

    def total(self) -> int:
        return sum(len(by_conn) for by_conn in self._by_conn.values())

    def count(self, conn: int) -> int:
        return len(self._by_conn.get(conn, ()))

    def add(self, wait: Wait) -> None:
        """Register a wait the caller has already put in its owner's line."""
        by_conn = self._by_conn.setdefault(wait.conn, {})
        if wait.request_id in by_conn:
            wait.withdraw()
            raise CoreError(
                ErrorCode.INVALID_ARGUMENT, f"request id {wait.request_id} is already waiting"
            )
        if len(by_conn) >= self.max_per_conn:
            wait.withdraw()
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"this connection already has {self.max_per_conn} pending waits, the limit",
            )
        by_conn[wait.request_id] = wait
        wait.registry = self
        self.wheel.schedule(wait.deadline, wait)

    def served(self, wait: Wait) -> None:
        """The owner took the wait out of its line and is replying to it."""
        wait.pending = False
        self._forget(wait)

    def end(self, wait: Wait, code: ErrorCode, message: str) -> None:
        """End a wait with an error reply (timeout, cancellation, scope cancelled)."""
        if not wait.pending:
            return
        wait.pending = False
        wait.withdraw()
        self._forget(wait)
        self.effects.error(wait.conn, wait.request_id, code, message)

    def cancel(self, conn: int, request_id: int) -> bool:
        wait = self._by_conn.get(conn, {}).get(request_id)
        if wait is None:
            return False
        self.end(wait, ErrorCode.CANCELLED, "the wait was cancelled by the client")
        return True

    def drop_connection(self, conn: int) -> None:
        for wait in list(self._by_conn.pop(conn, {}).values()):
            if wait.pending:
                wait.pending = False
                wait.withdraw()

    def _forget(self, wait: Wait) -> None:
        by_conn = self._by_conn.get(wait.conn)
        if by_conn is not None:
            by_conn.pop(wait.request_id, None)
            if not by_conn:
                del self._by_conn[wait.conn]
