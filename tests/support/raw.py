"""A bare connection to rsd, for what the SDK would never send: any bytes, any frame.

Frames are built with ``rsclient.wire``; what rsd sends back is decoded with the same
codec, so a test reads messages, never bytes. A connection-level error (request id 0)
followed by EOF is how rsd ends a connection it will not serve (``closed_with``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from typing import Any

from rsclient import wire


async def raw_connect(address: str, tls: ssl.SSLContext | None = None) -> RawConn:
    """Open a ``RawConn`` to ``HOST:PORT`` (over TLS with ``tls``)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(
        host, int(port), ssl=tls, server_hostname=host if tls is not None else None
    )
    return RawConn(reader, writer)


class RawConn:
    """A bare connection to rsd: send any bytes or frames, read decoded messages back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = wire.Decoder(wire.MAX_FRAME_BYTES)
        self.inbox: deque[Any] = deque()
        self.next_id = 1
        self.eof = False

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def frame(self, op: int, args: Any, rid: int | None = None) -> tuple[int, bytes]:
        """A request frame (args may be anything msgpack can carry); returns (id, bytes)."""
        if rid is None:
            rid = self.next_id
            self.next_id += 1
        return rid, wire.encode([wire.Kind.REQUEST, rid, op, args])

    async def request(self, op: int, args: Any) -> int:
        rid, data = self.frame(op, args)
        await self.send(data)
        return rid

    async def _fill(self, timeout: float) -> None:
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            raise EOFError("rsd closed the connection")
        self.inbox.extend(self.decoder.feed(data))

    async def recv(self, timeout: float = 5.0) -> Any:
        """The next message from rsd; EOFError if it closed the connection first."""
        while not self.inbox:
            await self._fill(timeout)
        return self.inbox.popleft()

    async def call(self, op: int, args: Any, timeout: float = 5.0) -> Any:
        """Send one request and return its answer ([2, id, result] or [3, id, code, ...])."""
        rid = await self.request(op, args)
        msg = await self.recv(timeout)
        assert msg[1] == rid, f"answer to request {msg[1]}, expected {rid}: {msg!r}"
        return msg

    async def ok(self, op: int, args: Any) -> Any:
        msg = await self.call(op, args)
        assert msg[0] == wire.Kind.REPLY, f"expected a reply, got {msg!r}"
        return msg[2]

    async def error(self, op: int, args: Any) -> tuple[str, str, Any]:
        """Send a request that must be refused; return (code, message, details)."""
        msg = await self.call(op, args)
        assert msg[0] == wire.Kind.ERROR, f"expected an error, got {msg!r}"
        return msg[2], msg[3], msg[4]

    async def hello(self, holder: str = "raw", **extra: Any) -> dict[str, Any]:
        """A HELLO that must succeed; ``extra`` adds fields (``token=...``)."""
        reply: dict[str, Any] = await self.ok(
            wire.Op.HELLO, {"version": wire.PROTOCOL_VERSION, "holder": holder, **extra}
        )
        return reply

    async def closed_with(self, code: str, timeout: float = 5.0) -> tuple[list[Any], str]:
        """Read to EOF; the last message must be a connection error (id 0) with ``code``.

        Returns the messages before it and the error's message text.
        """
        msgs: list[Any] = []
        with contextlib.suppress(EOFError):
            while True:
                msgs.append(await self.recv(timeout))
        assert msgs, "rsd closed the connection without an error frame"
        last = msgs.pop()
        assert last[:3] == [wire.Kind.ERROR, 0, code], f"expected {code} error frame: {last!r}"
        return msgs, last[3]

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
