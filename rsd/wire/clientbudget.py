"""The server-wide budget for bytes held on behalf of clients (``--max-client-buffer-bytes``).

Each connection is bounded on its own (an unfinished frame by the frame limit and the
frame timeout, output by the high-water mark, connection.py), but many connections at
their bounds add up: 100 connections each holding a 1 MiB unfinished frame are 100 MiB.
This budget caps the sum, as Redis's ``maxmemory-clients`` does.

What always holds:
- a connection is charged what it holds: its undecoded input (an unfinished frame, or a
  read waiting for its turn), this turn's output, output held for an fsync, and its
  transport's write buffer. The charge is measured again whenever one of them grows (after
  a read, at the flush) or shrinks (output released, the write buffer drained), in O(1);
- when a charge that grew takes the total over the budget, the connections holding the
  most are closed, largest first, until the total is back under it: each gets
  RESOURCE_EXHAUSTED naming the option, after the answers already due to it; its
  unfinished input is dropped at once (as for every connection that fails). A
  connection that holds nothing is never chosen, and one holding less than another is
  never closed before it;
- finding the largest is O(1): connections are kept in classes by the bit length of
  their charge (powers of two, as Redis's client eviction buckets do); the victim is
  taken from the highest class and measured again first (its write buffer may have
  drained without a callback), so a stale figure never closes a connection;
- a closing connection is no longer charged: what it still holds is its last output,
  bounded by the high-water mark and gone within ``Policy.CLOSE_LINGER_SECONDS``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rsproto import ErrorCode

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["ClientBudget"]

log = logging.getLogger("rsd")

_CLASSES = 64  # bit lengths of a charge: far beyond any real one


class ClientBudget:
    __slots__ = ("_classes", "evictions", "limit", "total")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0  # the sum of every connection's ``charged``
        self.evictions = 0
        self._classes: list[set[Connection]] = [set() for _ in range(_CLASSES)]

    @staticmethod
    def measure(conn: Connection) -> int:
        """The bytes ``conn`` holds now (0 once it is closing)."""
        transport = conn.transport
        if conn.closing or conn.feed or transport is None or transport.is_closing():
            return 0  # (a feed is bounded by feeds.py's own limits)
        return (
            conn.decoder.buffered
            + conn.out_bytes
            + conn.held_bytes
            + transport.get_write_buffer_size()
        )

    def charge(self, conn: Connection) -> None:
        """Measure ``conn`` again. The caller then calls ``enforce`` if the total is over
        the budget (not here: the caller may be walking a set that closing changes)."""
        held = self.measure(conn)
        old = conn.charged
        if held != old:
            self._set(conn, old, held)

    def forget(self, conn: Connection) -> None:
        """``conn`` is closing or gone: it is charged nothing any more."""
        if conn.charged:
            self._set(conn, conn.charged, 0)

    def _set(self, conn: Connection, old: int, held: int) -> None:
        self.total += held - old
        conn.charged = held
        before, after = old.bit_length(), held.bit_length()
        if before != after:
            if old:
                self._classes[before].discard(conn)
            if held:
                self._classes[after].add(conn)

    def _largest(self) -> Connection | None:
        for members in reversed(self._classes):
            if members:
                return next(iter(members))
        return None

    def enforce(self) -> None:
        """Close the largest holders until the total is under the budget."""
        while self.total > self.limit:
            victim = self._largest()
            if victim is None:
                return
            held = self.measure(victim)
            if held < victim.charged:  # a stale figure (its write buffer drained): redo
                self._set(victim, victim.charged, held)
                continue
            total = self.total
            self.forget(victim)
            self.evictions += 1
            victim.fail(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"client buffers over the server's budget: this connection held {held} of "
                f"the {total} bytes held for all clients, over {self.limit} "
                "(--max-client-buffer-bytes)",
            )
