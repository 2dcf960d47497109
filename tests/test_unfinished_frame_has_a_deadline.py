"""A frame begun must be finished in time, and holding it costs no more than its bytes.

rsd closes a connection whose unfinished frame began more than ``--frame-timeout``
seconds ago (default 30) with a connection-level PROTOCOL_ERROR, however slowly bytes
keep coming: the clock runs from the frame's first byte. The Decoder keeps an unfinished
frame in one buffer it appends to, so a large frame arriving in many small reads costs
O(its size), not a copy of everything so far on every read.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from support.process import Rsd

from rsclient import wire
from rsproto import Decoder, ErrorCode, Op, encode

RawConnect = Callable[[str], Awaitable[Any]]

DEADLINE = 0.5


async def test_a_frame_never_finished_is_closed_after_its_deadline(
    rsd_factory: Callable[..., Rsd], raw_connect: RawConnect
) -> None:
    server = rsd_factory("--frame-timeout", str(DEADLINE))
    bystander = await raw_connect(server.address)
    await bystander.hello("bystander")
    silent, dribbling = await raw_connect(server.address), await raw_connect(server.address)
    for raw in (silent, dribbling):
        await raw.hello()
    started = time.monotonic()
    await silent.send(struct.pack(">I", wire.MAX_FRAME_BYTES) + b"\x00" * 1000)
    await dribbling.send(struct.pack(">I", wire.MAX_FRAME_BYTES))

    async def dribble() -> None:
        for _ in range(100):  # a byte every 20 ms keeps it busy, never finishes
            await dribbling.send(b"\x00")
            await asyncio.sleep(0.02)

    feeding = asyncio.create_task(dribble())
    for raw in (silent, dribbling):
        before, message = await raw.closed_with(ErrorCode.PROTOCOL_ERROR, timeout=5)
        assert before == []
        assert "frame not completed" in message
    elapsed = time.monotonic() - started
    feeding.cancel()
    assert DEADLINE <= elapsed < DEADLINE + 1.5, elapsed
    assert "time" in await bystander.ok(Op.PING, {})  # idle without a partial frame: kept
    stats = await bystander.ok(Op.SERVER_STATS, {})
    assert stats["loop"]["unfinished_frames"] == 0


async def test_a_frame_finished_in_time_from_many_pieces_is_served(
    rsd_factory: Callable[..., Rsd], raw_connect: RawConnect
) -> None:
    server = rsd_factory("--frame-timeout", "5")
    raw = await raw_connect(server.address)
    await raw.hello()
    rid, frame = raw.frame(Op.PING, {"pad": b"p" * 100_000})
    for start in range(0, len(frame), 10_000):
        await raw.send(frame[start : start + 10_000])
        await asyncio.sleep(0.01)
    assert (await raw.recv())[1] == rid
    await asyncio.sleep(0.3)
    assert "time" in await raw.ok(Op.PING, {})  # idle between frames is no offence


def _feed_in_pieces(size: int, piece: int = 16) -> float:
    """CPU seconds of this thread (best of 3) to decode one frame of ``size`` payload bytes
    fed ``piece`` bytes at a time; checks what comes out. CPU time, not wall time: on a
    loaded machine a preempted run measured 0.4 s of wall time for 0.03 s of work."""
    payload = b"q" * size
    frame = encode([payload])
    best = float("inf")
    for _ in range(3):
        decoder = Decoder()
        started = time.thread_time()
        out = []
        for start in range(0, len(frame), piece):
            out += decoder.feed(frame[start : start + piece])
            assert decoder.buffered == (start + len(frame[start : start + piece])) % len(frame)
        best = min(best, time.thread_time() - started)
        assert out == [[payload]]
    return best


def test_a_large_frame_in_small_pieces_is_not_recopied_per_read() -> None:
    """A frame 16 times larger, in as small pieces, costs about 16 times as much (linear),
    not 256 times (a copy of all that is buffered on every read: quadratic)."""
    small = _feed_in_pieces(64 << 10)
    large = _feed_in_pieces(wire.MAX_FRAME_BYTES - 16)
    assert large < 64 * small, f"{large / small:.0f} times the cost for 16 times the bytes"
