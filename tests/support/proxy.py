"""A TCP proxy the test controls, for cutting one process off from another, or for
putting it far away.

``Proxy(target_host, target_port)`` listens on a loopback port of its own and forwards
every connection to the target, both ways, until ``cut()``: from then on it drops what
either side sends and makes no new connection (a black hole, as a network partition is:
nothing is refused, nothing arrives), until ``heal()``. ``cut(replication_only=True)``
cuts only the connections of standbys following an rsd primary (their HELLO, the first
thing the client side sends, asks to ``replicate``): the primary cut off from its
standbys, not from its clients. With ``delay`` (seconds, settable at any time), every
byte arrives that long after it was sent, each way, in order: a far peer (a round trip
of twice the delay), not a slow link (what is sent meanwhile is not held back by it).
It runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class Proxy:
    def __init__(self, target_host: str, target_port: int, delay: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.delay = delay
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

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        loop = asyncio.get_running_loop()
        first = b""
        with contextlib.suppress(Exception):
            first = await reader.read(1 << 16)  # (the client side speaks first)
        sent = loop.time()
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
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            in_flight: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
            if source is reader and first:
                in_flight.put_nowait((sent + self.delay, first))
            self._spawn(self._pipe(source, in_flight, replica))
            self._spawn(self._deliver(in_flight, sink, replica))

    async def _pipe(self, source: asyncio.StreamReader,
                    in_flight: asyncio.Queue[tuple[float, bytes]], replica: bool) -> None:
        """What ``source`` sends, each piece with the time it is due (b"": the end)."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):
            while data := await source.read(1 << 16):
                if not self._cuts(replica):
                    in_flight.put_nowait((loop.time() + self.delay, data))
        in_flight.put_nowait((loop.time() + self.delay, b""))

    async def _deliver(self, in_flight: asyncio.Queue[tuple[float, bytes]],
                       sink: asyncio.StreamWriter, replica: bool) -> None:
        """Write each piece when it is due, in order; close ``sink`` at the end."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):
            while True:
                due, data = await in_flight.get()
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                if not data:
                    break
                if not self._cuts(replica):  # lost on the way when cut meanwhile
                    sink.write(data)
                    await sink.drain()
        sink.close()
