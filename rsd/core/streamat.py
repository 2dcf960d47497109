"""A cluster node's place in its primary's stream, kept with the state it describes.

The state of a standby is the primary's journal up to some batch; the state of a primary
is its own. STREAM_AT says which, and is part of the state like any other record: a
standby journals one after each batch (in the same write) and puts one in the snapshot
of its copy; a node that becomes the primary journals one with ``led``; every snapshot
carries the latest. So a node's data directory, recovered after a restart, says where
it stands without a file of its own beside the journal (which a crash could leave out
of step with it).

The core never reads it in its rules: only the cluster's shell does (node.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .records import Rec, StreamAt
from .state.tables import Applier, Handler, Tables

__all__ = ["StreamMark"]


class StreamMark:
    """STREAM_AT: the latest one applied, and the snapshot's copy of it."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.at: StreamAt | None = None
        self.ops: dict[int, Handler] = {}
        self.appliers: dict[int, Applier] = {Rec.STREAM_AT: self.apply}

    def apply(self, rec: tuple[Any, ...], now: float) -> None:
        _, epoch, batch, led = rec
        self.at = StreamAt(Rec.STREAM_AT, epoch, batch, led)

    def led(self, epoch: int, now: float) -> None:
        """This state is now the primary of ``epoch``'s own (a record, journaled with
        the next batch)."""
        self.tables.commit(StreamAt(Rec.STREAM_AT, epoch, -1, True), now)

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        if self.at is not None:
            yield self.at
