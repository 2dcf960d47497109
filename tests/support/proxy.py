"""A TCP proxy the test controls, for cutting one process off from another.

``Proxy(target_host, target_port)`` listens on a loopback port of its own and forwards
every connection to the target, both ways, until ``cut()``: from then on it drops what
either side sends and makes no new connection (a black hole, as a network partition is:
nothing is refused, nothing arrives), until ``heal()``. ``cut(replication_only=True)``
cuts only the connections of standbys following an rsd primary (their HELLO, the first
thing the client side sends, asks to ``replicate``): the primary cut off from its
standbys, not from its clients. It runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib


class Proxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.cut_off = False
        self.replication_only = False
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Proxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def cut(self, replication_only: bool = False) -> None:
        self.cut_off = True
        self.replication_only = replication_only

    def heal(self) -> None:
        self.cut_off = False

    def _cuts(self, replica: bool) -> bool:
        return self.cut_off and (replica or not self.replication_only)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        first = b""
        with contextlib.suppress(Exception):
            first = await reader.read(1 << 16)  # (the client side speaks first)
        replica = b"replicate" in first
        if self._cuts(replica):  # a black hole: hold the connection, answer nothing
            with contextlib.suppress(Exception):
                while await reader.read(1 << 16):
                    pass
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        up_writer.write(first)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.get_running_loop().create_task(self._pipe(source, sink, replica))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                    replica: bool) -> None:
        with contextlib.suppress(Exception):
            while data := await source.read(1 << 16):
                if not self._cuts(replica):
                    sink.write(data)
                    await sink.drain()
        sink.close()
