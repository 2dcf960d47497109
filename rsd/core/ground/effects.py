"""What a core call produced besides its return value: messages and journal records.

The core never performs an effect. It appends wire messages (deferred replies, errors,
pushes) addressed to connection ids, and journal records, to this buffer; the server
drains both once per batch, writes the records first and sends the messages after.

Notes are rare events an operator wants to read about (a lease that expired, a dead
letter, a cancelled run), each an event name and its ids; the server logs them. Only
rare paths add notes, never a request's usual path, and at most ``MAX_NOTES`` wait
between two drains (the rest are only counted), so an undrained core cannot grow.
Every note is also counted by event name (``counts``, read by the metrics): the names
are literals of the core's code, so the table has a handful of keys whatever happens.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from rsproto import ErrorCode, Kind, Push

__all__ = ["DEFERRED", "MAX_NOTES", "Effects"]

DEFERRED: Final[Any] = object()  # an op's return value meaning "the reply comes later"
MAX_NOTES: Final = 256  # notes kept between two drains; more are counted in ``notes_dropped``
_LEASE_LOST: Final = int(Push.LEASE_LOST)
# The frame kinds, read as statics (an enum's member read by name runs EnumType's
# attribute hook: some 3,000 instructions a reply in the compiled core).
_REPLY: Final = Kind.REPLY
_ERROR: Final = Kind.ERROR
_PUSH: Final = Kind.PUSH


class Held(Protocol):
    """A lease as LEASE_LOST names it (leases.py's ``LeaseBase``)."""

    @property
    def conn(self) -> int: ...

    @property
    def handle(self) -> bytes: ...


class Effects:
    __slots__ = (
        "counts", "messages", "notes", "notes_dropped", "records", "snapshot_asks", "sync"
    )

    def __init__(self) -> None:
        self.messages: list[tuple[int, list[Any]]] = []
        self.records: list[tuple[Any, ...]] = []
        # The records must be on disk before the messages leave, whatever the fsync
        # policy (an id reservation): the journal fsyncs this batch before replying.
        self.sync = False
        self.notes: list[tuple[str, dict[str, Any]]] = []
        self.notes_dropped = 0
        # SNAPSHOT_NOW requests (connection, request id): the shell takes them at its
        # flush and answers each once a snapshot started after it has been written.
        self.snapshot_asks: list[tuple[int, int]] = []
        self.counts: dict[str, int] = {}  # notes by event name, since start

    def reply(self, conn: int, request_id: int, result: Any) -> None:
        self.messages.append((conn, [_REPLY, request_id, result]))

    def error(
        self,
        conn: int,
        request_id: int,
        code: ErrorCode,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        self.messages.append((conn, [_ERROR, request_id, str(code), message, details]))

    def lease_lost(self, lease: Held, reason: str) -> None:
        """LEASE_LOST to ``lease``'s holder (its last connection): the lease ended for
        ``reason`` ("expired", "cancelled", "deadline", "scope cancelled") without the
        holder asking. The one place that message is built (the core's other push, a
        task's events, is progress.py's; results and grants are deferred replies)."""
        self.messages.append(
            (lease.conn, [_PUSH, _LEASE_LOST, {"lease": lease.handle, "reason": reason}])
        )

    def note(self, event: str, **ids: Any) -> None:
        """A rare event for the operator's log (see the module docstring)."""
        self.counts[event] = self.counts.get(event, 0) + 1
        if len(self.notes) < MAX_NOTES:
            self.notes.append((event, ids))
        else:
            self.notes_dropped += 1

    def take_notes(self) -> tuple[list[tuple[str, dict[str, Any]]], int]:
        """The notes since the last call, and how many more were only counted."""
        out, dropped = self.notes, self.notes_dropped
        self.notes, self.notes_dropped = [], 0
        return out, dropped

    def take_messages(self) -> list[tuple[int, list[Any]]]:
        out, self.messages = self.messages, []
        return out

    def take_records(self) -> list[tuple[Any, ...]]:
        out, self.records = self.records, []
        return out

    def take_sync(self) -> bool:
        sync, self.sync = self.sync, False
        return sync
