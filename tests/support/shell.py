"""The server shell in-process, on transports that only record: for rules about loop
turns, reads and writes that a real socket would make timing-dependent.

``Shell`` is a ``rsd.server.Server`` with no journal on the running loop; ``connect()``
gives a ``Connection`` on a ``FakeTransport``. A test feeds bytes with
``conn.data_received`` and lets loop turns pass with ``turn()``; each
``transport.write`` is one entry of ``transport.writes``, decoded by ``messages()``.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import rsproto as wire
from rsd.core import Core
from rsd.server import Server
from rsd.wire.connection import Connection
from rsproto import Op


class FakeTransport:
    """What a Connection asks of its transport, recorded; nothing is sent anywhere."""

    def __init__(self, peer: tuple[str, int] = ("127.0.0.1", 50000)) -> None:
        self.peer = peer
        self.writes: list[bytes] = []
        self.buffered = 0  # what get_write_buffer_size says (a test may set it)
        self.reading = True
        self.closed = False
        self.eof = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.writes.append(bytes(data))

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def messages(self) -> list[Any]:
        """Every message written so far, decoded, in order."""
        decoder = wire.Decoder(wire.MAX_FRAME_BYTES)
        return decoder.feed(b"".join(self.writes))


class Shell(Server):
    """A Server without journal on the running loop, with connections made by hand."""

    def __init__(self, **options: Any) -> None:
        counter = itertools.count(1)
        core = Core(lambda: f"scope-{next(counter)}")
        super().__init__(core, asyncio.get_running_loop(), **options)
        self._ports = itertools.count(50000)

    def connect(self, holder: str | None = None, host: str = "127.0.0.1") -> Connection:
        """A new connection (from ``host``), with HELLO fed if ``holder`` is given."""
        conn = self.protocol_factory()
        conn.connection_made(FakeTransport((host, next(self._ports))))  # type: ignore[arg-type]
        if holder is not None:
            conn.data_received(wire.request_frame(1, Op.HELLO, {"version": 1, "holder": holder}))
        return conn


def transport(conn: Connection) -> FakeTransport:
    assert isinstance(conn.transport, FakeTransport)
    return conn.transport


async def turn(count: int = 1) -> None:
    """Let ``count`` loop turns pass (the flush and resumes queued with call_soon run)."""
    for _ in range(count):
        await asyncio.sleep(0)
