"""Refused HELLOs: when their answer leaves, how many may wait for it, and what is logged.

What always holds:
- a wrong token's refusal (auth.py) within its address's and network's allowance is
  answered at once: the HELLO's UNAUTHENTICATED, the connection-level one, close;
- past the allowance the refusal is slowed down by ``Refusal.delay`` (ratelimit.py:
  doubling, capped at 5 s): it takes one of its network's ``MAX_HELD_PER_NETWORK``
  places and one of the server's ``MAX_HELD`` for that whole delay, and its answer waits
  as long, but never more than ``MAX_ANSWER_WAIT``. So a client with a wrong token is
  told UNAUTHENTICATED well within an SDK's bound on a HELLO's answer (a slowed
  refusal that outlasted it looked like an unreachable server), while a network still
  gets no more verdicts than its places allow: at most 16 per full delay, as when the
  answer waited the whole delay. A waiting refusal holds its connection, which reads
  and drops whatever else it sends (``Connection.hold``). Answers and places sit in
  heaps under one loop timer, armed for the earliest: no task and no timer per
  connection;
- a refusal over those bounds is not held: it is answered at once with UNAVAILABLE and
  ``details.retry_after_ms`` (the delay it would have had, at least 1), then the
  connection is closed. That answer says "slowed down, try later", never "wrong token",
  so an SDK retries it (protocol.md, "Handshake");
- failures are logged in one line per interval, not one per failure: the first of an
  interval at once (an operator sees a misconfigured client straight away), the rest
  summed up when the interval ends ("N failed HELLOs from M addresses in the last 60 s;
  worst: ...": logsummary.py). The addresses counted per interval are bounded
  (``MAX_SUMMED``), and the connections these refusals close are not logged one by one
  either.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from typing import TYPE_CHECKING, Any

import rsproto as wire
from rsproto import ErrorCode

from ..logsummary import MAX_SUMMED, SUMMARY_SECONDS, Interval, LogSummary
from ..security.auth import Refusal

if TYPE_CHECKING:
    from .connection import Connection

__all__ = [
    "MAX_ANSWER_WAIT", "MAX_HELD", "MAX_HELD_PER_NETWORK", "MAX_SUMMED", "SUMMARY_SECONDS",
    "Refusals",
    "retry_after_ms",
]

log = logging.getLogger("rsd")

MAX_HELD = 256  # refusals waiting for their moment, server-wide
MAX_HELD_PER_NETWORK = 16  # of one network (IPv4 /24, IPv6 /56)
# Seconds at most a slowed refusal's answer waits: well below the SDKs' bound on a HELLO's
# answer (1 s at least, connection.py and reach.ts), so that a wrong token is told as one.
MAX_ANSWER_WAIT = 0.5
HANDSHAKE_FAILED = "handshake failed"


def retry_after_ms(delay: float) -> int:
    """The ``retry_after_ms`` of a refusal slowed down by ``delay`` seconds (at least 1)."""
    return max(1, math.ceil(delay * 1000))


class Refusals:
    """Answers refused HELLOs, at once or at their moment; sums up their log lines."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[tuple[float, int, Connection, bytes]] = []  # answers waiting
        self._places: list[tuple[float, str]] = []  # places taken: until when, of which network
        self._seq = 0
        self._per_network: dict[str, int] = {}  # places taken per network
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.delayed = 0  # refusals that waited for their moment
        self.throttled = 0  # answered UNAVAILABLE: too many were waiting already
        self.failures = LogSummary(loop, _sum_up)  # by address, one line per interval

    def refuse(self, conn: Connection, rid: int, refusal: Refusal) -> None:
        """Answer ``conn``'s HELLO ``rid`` as ``refusal`` says: now, later, or slowed down."""
        self._note(refusal)
        frame = wire.error_frame(rid, ErrorCode.UNAUTHENTICATED, refusal.message)
        if refusal.delay <= 0:
            conn.put(frame)
            conn.fail(ErrorCode.UNAUTHENTICATED, HANDSHAKE_FAILED, quiet=True)
            return
        network = refusal.keys.network
        waiting = self._per_network.get(network, 0)
        if waiting >= MAX_HELD_PER_NETWORK or len(self._places) >= MAX_HELD:
            self.throttled += 1
            wait = retry_after_ms(refusal.delay)
            conn.put(wire.error_frame(
                rid, ErrorCode.UNAVAILABLE,
                f"too many failed HELLOs from {network} lately: this one is slowed down; "
                f"retry in {wait} ms",
                {"retry_after_ms": wait},
            ))
            conn.fail(ErrorCode.UNAVAILABLE, "slowed down", quiet=True)
            return
        self.delayed += 1
        self._per_network[network] = waiting + 1
        now = self.loop.time()
        heapq.heappush(self._places, (now + refusal.delay, network))
        seq = self._seq = self._seq + 1
        due = now + min(refusal.delay, MAX_ANSWER_WAIT)
        heapq.heappush(self._heap, (due, seq, conn, frame))
        conn.hold()
        if due < self._timer_at:
            self._arm(due)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.loop.call_at(at, self._due)

    def _due(self) -> None:
        """Answer every refusal whose moment has come (connections gone since: skipped)
        and give back every place whose delay is over."""
        self._timer, self._timer_at = None, math.inf
        heap, places, now = self._heap, self._places, self.loop.time()
        while heap and heap[0][0] <= now:
            _, _, conn, frame = heapq.heappop(heap)
            conn.release_refusal(frame, ErrorCode.UNAUTHENTICATED, HANDSHAKE_FAILED)
        while places and places[0][0] <= now:
            _, network = heapq.heappop(places)
            left = self._per_network[network] - 1
            if left:
                self._per_network[network] = left
            else:
                del self._per_network[network]
        if heap or places:
            self._arm(min(heap[0][0] if heap else math.inf,
                          places[0][0] if places else math.inf))

    def _note(self, refusal: Refusal) -> None:
        """Count a failure for this interval's line; the first of an interval is logged now."""
        if self.failures.note(refusal.keys.address):
            log.warning(
                "authentication failed from %s: %s (more failures in the next %g s are "
                "summed up in one line)", refusal.peer, refusal.message, self.failures.seconds,
            )

    def stop(self) -> None:
        """The server stops: no more timers; this interval's line is written now."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf
        self.failures.stop()

    def stats(self) -> dict[str, Any]:
        return {"delayed": self.delayed, "throttled": self.throttled, "held": len(self._heap)}


def _sum_up(failures: Interval) -> None:
    log.warning(
        "%d failed HELLOs from %s addresses in the last %.0f s; worst: %s",
        failures.count, failures.keys(), failures.seconds, failures.worst(),
    )
