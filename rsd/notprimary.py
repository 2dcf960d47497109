"""What a node of a cluster that is not the primary answers on its client port.

A standby (or a node between roles) serves no client: it answers the first frame of
every connection, whatever it is, with NOT_PRIMARY, naming the primary's advertised
address when it knows it (``{"primary": "HOST:PORT" | nil, "epoch": N}``), then closes
the connection. A client SDK then connects to the primary (protocol.md).

What always holds: a connection costs at most one frame's header and body up to
``MAX_FIRST_FRAME_BYTES`` and ``Policy.HANDSHAKE_TIMEOUT_SECONDS`` before it is answered
or closed; nothing a client sends here reaches a core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import rsproto as wire
from rsproto import ErrorCode

from .policy import Policy

__all__ = ["NotPrimary", "not_primary_frame"]

MAX_FIRST_FRAME_BYTES = 64 << 10


def not_primary_frame(rid: int, primary: str | None, epoch: int) -> bytes:
    """The NOT_PRIMARY answer to request ``rid`` (0: to the connection)."""
    where = f"the primary is {primary}" if primary else "no primary is known right now"
    return wire.error_frame(
        rid, ErrorCode.NOT_PRIMARY, f"this node is not the cluster's primary; {where}",
        {"primary": primary, "epoch": epoch},
    )


class NotPrimary(asyncio.Protocol):
    """One client connection to a node that is not the primary."""

    def __init__(self, where: Callable[[], tuple[str | None, int]]) -> None:
        """``where``: the primary's advertised address (None if unknown) and the epoch."""
        self.where = where
        self.decoder = wire.Decoder(MAX_FIRST_FRAME_BYTES, "request")
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(Policy.HANDSHAKE_TIMEOUT_SECONDS, self._close)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data, 1)
        except wire.FrameError:
            frames = [None]
        if not frames:
            return
        first: Any = frames[0]
        rid = first[1] if type(first) is list and len(first) > 1 and type(first[1]) is int else 0
        primary, epoch = self.where()
        if self.transport is not None:
            self.transport.write(not_primary_frame(rid, primary, epoch))
        self._close()

    def _close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
