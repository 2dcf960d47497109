"""Connections flooding costly requests cannot stall a polite one.

Three connections send TASK_SUBMIT_MANY frames of 256 tiny tasks back to back, as fast as
rsd takes them, and read their answers. Each of them gets its share of a loop turn
(rsd/wire/turns.py) and is cut after the request that used it up, so a bystander's PING waits
at most about one share of each: it is answered within ``PING_BOUND`` (generous for a
loaded 2-core machine; ``python -m bench.fairness`` measures tighter), and the flooders
are still served meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from support.process import Rsd

from rsclient import wire
from rsproto import Op

RawConnect = Callable[[str], Awaitable[Any]]

FLOODERS = 3
FLOOD_SECONDS = 1.5
PING_EVERY = 0.01
PING_BOUND = 0.5  # seconds: the slowest bystander PING while the flood runs
_HEADER = struct.Struct(">I")


class Flooder:
    """One connection sending pre-encoded submit frames round and round, counting the
    answers it reads (by their headers: the test process stays cheap)."""

    def __init__(self, raw: Any, frames: bytes) -> None:
        self.raw = raw
        self.frames = frames
        self.answered = 0

    async def send(self) -> None:
        while True:
            self.raw.writer.write(self.frames)
            await self.raw.writer.drain()

    async def read(self) -> None:
        buffer = bytearray()
        while data := await self.raw.reader.read(1 << 20):
            buffer += data
            at = 0
            while len(buffer) - at >= 4:
                size = _HEADER.unpack_from(buffer, at)[0]
                if len(buffer) - at - 4 < size:
                    break
                self.answered += 1
                at += 4 + size
            del buffer[:at]


async def flooder(rsd: Rsd, raw_connect: RawConnect, n: int) -> Flooder:
    raw = await raw_connect(rsd.address)
    await raw.hello(f"flooder{n}")
    await raw.ok(Op.MAILBOX_ENSURE, {"name": "jobs"})
    scope = (await raw.ok(Op.SCOPE_CREATE, {}))["scope"]
    frames = b"".join(
        raw.frame(Op.TASK_SUBMIT_MANY, {
            "scope": scope, "mailbox": "jobs", "slim": True,
            "items": [{"key": f"{f}-{i}", "data": None} for i in range(256)],
        })[1]
        for f in range(40)
    )
    return Flooder(raw, frames)


async def test_a_bystanders_ping_is_answered_while_three_connections_flood_submits(
    rsd: Rsd, raw_connect: RawConnect
) -> None:
    bystander = await raw_connect(rsd.address)
    await bystander.hello("bystander")
    flooders = [await flooder(rsd, raw_connect, n) for n in range(FLOODERS)]
    jobs = [asyncio.ensure_future(job()) for f in flooders for job in (f.send, f.read)]
    try:
        await asyncio.sleep(0.2)  # the flood is under way
        before = [f.answered for f in flooders]
        slowest = 0.0
        pings = 0
        ends = time.monotonic() + FLOOD_SECONDS
        while time.monotonic() < ends:
            started = time.monotonic()
            msg = await bystander.call(Op.PING, {}, timeout=10)
            assert msg[0] == wire.Kind.REPLY
            slowest = max(slowest, time.monotonic() - started)
            pings += 1
            await asyncio.sleep(PING_EVERY)
        served = [f.answered - b for f, b in zip(flooders, before, strict=True)]
    finally:
        for job in jobs:
            job.cancel()
        for job in jobs:
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await job
    assert slowest < PING_BOUND, f"a PING took {slowest * 1000:.0f} ms during the flood"
    assert pings >= 3
    assert all(count > 0 for count in served), f"a flooder was starved: {served}"
