"""What a core call produced besides its return value: messages and journal records.

The core never performs an effect. It appends wire messages (deferred replies, errors,
pushes) addressed to connection ids, and journal records, to this buffer; the server
drains both once per batch, writes the records first and sends the messages after.
"""

from __future__ import annotations

from typing import Any

from rsproto import ErrorCode, Kind

__all__ = ["DEFERRED", "Effects"]

DEFERRED: Any = object()  # an op's return value meaning "the reply comes later"


class Effects:
    __slots__ = ("messages", "records", "sync")

    def __init__(self) -> None:
        self.messages: list[tuple[int, list[Any]]] = []
        self.records: list[tuple[Any, ...]] = []
        # The records must be on disk before the messages leave, whatever the fsync
        # policy (an id reservation): the journal fsyncs this batch before replying.
        self.sync = False

    def reply(self, conn: int, request_id: int, result: Any) -> None:
        self.messages.append((conn, [Kind.REPLY, request_id, result]))

    def error(
        self,
        conn: int,
        request_id: int,
        code: ErrorCode,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        self.messages.append((conn, [Kind.ERROR, request_id, str(code), message, details]))

    def push(self, conn: int, event: int, body: dict[str, Any]) -> None:
        self.messages.append((conn, [Kind.PUSH, int(event), body]))

    def take_messages(self) -> list[tuple[int, list[Any]]]:
        out, self.messages = self.messages, []
        return out

    def take_records(self) -> list[tuple[Any, ...]]:
        out, self.records = self.records, []
        return out

    def take_sync(self) -> bool:
        sync, self.sync = self.sync, False
        return sync
