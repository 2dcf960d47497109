"""A connection closed for a protocol error first gets every answer it is owed.

The requests rsd executed before the error (including those decoded from the same read
before the broken frame, and those whose replies wait for an fsync) are answered, then
comes the connection-level error frame (request id 0), then end-of-stream: never a reset.
A frame over ``max_frame_bytes`` sent with its body gets FRAME_TOO_LARGE the same way.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.process import Rsd

from rsclient import wire
from rsproto import Decoder, ErrorCode, FrameError, Kind, Op, request_frame

RawConnect = Callable[[str], Awaitable[Any]]

MAX = wire.MAX_FRAME_BYTES
ACQUIRES = 20
TRIALS = 30
GARBAGE = struct.pack(">I", 3) + b"\xc1\xc1\xc1"  # well framed, not msgpack
OVERSIZE_HEADER = struct.pack(">I", MAX + 1)


def acquires(raw: Any, trial: int) -> tuple[list[int], bytes]:
    frames = [
        raw.frame(Op.CLAIM_ACQUIRE, {"scope": "s", "key": f"t{trial}-k{n}"})
        for n in range(ACQUIRES)
    ]
    return [rid for rid, _ in frames], b"".join(data for _, data in frames)


async def create_run(raw_connect: RawConnect, address: str, scope: str = "s") -> None:
    """Create the run the acquires name (runs must exist), on a connection of its own."""
    setup = await raw_connect(address)
    await setup.hello("setup")
    await setup.ok(Op.SCOPE_CREATE, {"scope": scope})
    setup.close()


def granted(messages: list[Any], ids: list[int]) -> None:
    """``messages`` are exactly the grants for ``ids``, in order."""
    assert [msg[1] for msg in messages] == ids, messages
    assert all(msg[0] == Kind.REPLY and msg[2]["generation"] >= 1 for msg in messages)


@pytest.mark.parametrize("fsync", ["always", "no"])
@pytest.mark.parametrize("broken", ["garbage", "oversize header"])
async def test_requests_in_the_same_write_as_a_broken_frame_are_answered_first(
    rsd_factory: Callable[..., Rsd], raw_connect: RawConnect, fsync: str, broken: str
) -> None:
    server = rsd_factory("--fsync", fsync)
    tail, code = {
        "garbage": (GARBAGE, ErrorCode.PROTOCOL_ERROR),
        "oversize header": (OVERSIZE_HEADER, ErrorCode.FRAME_TOO_LARGE),
    }[broken]
    await create_run(raw_connect, server.address)
    for trial in range(TRIALS):
        raw = await raw_connect(server.address)
        hello_id, hello = raw.frame(Op.HELLO, {"version": wire.PROTOCOL_VERSION, "holder": "r"})
        ids, data = acquires(raw, trial)
        await raw.send(hello + data + tail)  # one write
        before, _ = await raw.closed_with(code)
        assert before[0][:2] == [Kind.REPLY, hello_id]
        granted(before[1:], ids)
        raw.close()


async def test_replies_held_for_an_fsync_come_before_the_error_frame(
    rsd: Rsd, raw_connect: RawConnect
) -> None:
    """Under ``--fsync always`` (the fixture's policy) the acquires' replies wait for the
    fsync while the garbage that follows, in a write of its own, fails the connection."""
    await create_run(raw_connect, rsd.address)
    for trial in range(TRIALS):
        raw = await raw_connect(rsd.address)
        await raw.hello()
        ids, data = acquires(raw, trial)
        raw.writer.write(data)
        raw.writer.write(GARBAGE)
        await raw.writer.drain()
        before, _ = await raw.closed_with(ErrorCode.PROTOCOL_ERROR)
        granted(before, ids)
        raw.close()


async def test_an_oversize_frame_sent_with_its_body_gets_frame_too_large_not_a_reset(
    rsd: Rsd, raw_connect: RawConnect
) -> None:
    for size in (MAX + 1, 4 * MAX):
        raw = await raw_connect(rsd.address)
        await raw.hello()
        rid, ping = raw.frame(Op.PING, {})
        await raw.send(ping + struct.pack(">I", size) + b"\x00" * size)
        before, message = await raw.closed_with(ErrorCode.FRAME_TOO_LARGE)
        assert [msg[1] for msg in before] == [rid]
        assert str(MAX) in message
        raw.close()
    raw = await raw_connect(rsd.address)  # and rsd serves on
    await raw.hello()
    assert "time" in await raw.ok(Op.PING, {})


def test_a_frame_error_carries_the_messages_decoded_before_it() -> None:
    good = [request_frame(n, Op.PING, {}) for n in (1, 2, 3)]
    for tail, code in ((GARBAGE, ErrorCode.PROTOCOL_ERROR),
                       (OVERSIZE_HEADER, ErrorCode.FRAME_TOO_LARGE)):
        for split in (0, 5, len(good[0]) + 2):  # the first frame fed whole or in parts
            decoder = Decoder()
            stream = b"".join(good) + tail
            head = decoder.feed(stream[:split])
            with pytest.raises(FrameError) as info:
                decoder.feed(stream[split:])
            assert info.value.code == code
            assert [msg[1] for msg in head + info.value.decoded] == [1, 2, 3]
