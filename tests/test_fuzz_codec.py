"""The decoder under hostile input: every byte stream decodes or is refused, and nothing
it is fed grows it beyond one frame.

Inputs: valid frames (requests of every op with right and wrong args, replies, errors,
pushes) with bytes flipped, overwritten, inserted and deleted, truncated, their lengths
forged, containers declaring 2**32 items put where a value was; well-framed bodies of the
wrong shape; msgpack of every type, ext types and timestamps included, nested past any
limit. What must hold for every one:

- ``Decoder.feed`` returns messages or raises ``FrameError`` with PROTOCOL_ERROR or
  FRAME_TOO_LARGE: never another exception (a server turns anything else into a crash of
  the connection's handler, not a protocol error frame);
- fed in any chunks, with or without a per-call message limit, the stream gives the same
  messages and the same refusal as fed whole: the server's chunked decoding never
  changes what a stream means;
- what the decoder keeps between calls is less than one frame (header plus
  ``max_frame``), whatever was declared; a declared size over the limit is refused at
  its header, before a byte of its body is awaited or kept.
"""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import msgpack
from hypothesis import given
from hypothesis import strategies as st
from support import fuzz
from support.fuzz import TALLY, Known

from rsproto import (
    HEADER_BYTES,
    MAX_FRAME_BYTES,
    Decoder,
    ErrorCode,
    FrameError,
    Op,
    Push,
    error_frame,
    push_frame,
    reply_frame,
)

REFUSALS = frozenset({ErrorCode.PROTOCOL_ERROR, ErrorCode.FRAME_TOO_LARGE})
FRAMES_PER_STREAM = 24
SMALL_FRAME = 4096  # a decoder with a small limit, so forged lengths often pass it


def valid_frames(rng: random.Random, known: Known, count: int) -> list[bytes]:
    """Frames a peer may rightly send: requests (right or wrong args), and what a server
    sends back (replies, errors, pushes), which a client's decoder reads."""
    frames = []
    for rid in range(1, count + 1):
        kind = rng.randrange(10)
        if kind < 7:
            op, args = fuzz.request(rng, known)
            frames.append(fuzz.encode_request(rid, op, args))
        elif kind == 7:
            frames.append(reply_frame(rid, {"lease": rid, "generation": 1, "x": fuzz.junk(rng)}))
        elif kind == 8:
            frames.append(error_frame(rid, ErrorCode.CLAIM_HELD, "held", {"holder": "a"}))
        else:
            frames.append(push_frame(Push.LEASE_LOST, {"lease": rid, "reason": "expired"}))
    return frames


def decode(stream: bytes, max_frame: int, chunks: list[int] | None = None,
           limit: int | None = None) -> tuple[list[Any], ErrorCode | None]:
    """Feed ``stream`` (whole, or cut at ``chunks``) to a fresh decoder; the messages and
    the refusal's code (None: no refusal). Anything but FrameError propagates."""
    decoder = Decoder(max_frame)
    cuts = sorted(chunks or [])
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    out: list[Any] = []
    try:
        for piece in pieces:
            got = decoder.feed(piece, limit)
            while limit is not None and got:
                out.extend(got)
                got = decoder.feed(b"", limit)
            out.extend(got)
            if limit is None:
                assert decoder.buffered < HEADER_BYTES + max_frame, (
                    f"the decoder keeps {decoder.buffered} bytes, more than one frame"
                )
    except FrameError as exc:
        assert exc.code in REFUSALS, f"refused with {exc.code}"
        return out + exc.decoded, exc.code
    return out, None


def check_stream(stream: bytes, rng: random.Random, max_frame: int) -> None:
    """The stream decodes, or is refused with a protocol error, the same way however it
    arrives."""
    try:
        whole = decode(stream, max_frame)
    except Exception:
        TALLY.unhandled += 1  # counted for the summary line; the test fails all the same
        raise
    cuts = [rng.randrange(len(stream) + 1) for _ in range(rng.randrange(1, 6))]
    # compared as text: a NaN is the same NaN, though never equal to itself
    assert repr(decode(stream, max_frame, cuts)) == repr(whole)
    assert repr(decode(stream, max_frame, cuts, limit=rng.randrange(1, 4))) == repr(whole)
    TALLY.inputs += 1
    if whole[1] is not None:
        TALLY.refusals[whole[1].value] += 1


@fuzz.fuzz_settings(400)
@given(seed=st.integers(0, 2**64 - 1), small=st.booleans())
def test_mutated_frames_decode_or_are_refused_with_a_protocol_error(
    seed: int, small: bool
) -> None:
    """A stream of valid frames, damaged, and each of its frames damaged on its own."""
    rng = random.Random(seed)
    frames = valid_frames(rng, Known(), FRAMES_PER_STREAM)
    max_frame = SMALL_FRAME if small else MAX_FRAME_BYTES
    check_stream(fuzz.mutated(rng, b"".join(frames)), rng, max_frame)
    for one in frames:
        check_stream(fuzz.mutated(rng, one), rng, max_frame)


@fuzz.fuzz_settings(300)
@given(seed=st.integers(0, 2**64 - 1))
def test_well_framed_bodies_of_any_shape_decode_or_are_refused(seed: int) -> None:
    """Right headers around wrong bodies: every body reaches msgpack."""
    rng = random.Random(seed)
    for _ in range(FRAMES_PER_STREAM):
        body = fuzz.hostile_body(rng, Known())
        check_stream(fuzz.frame(body), rng, MAX_FRAME_BYTES)


ext_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False) | st.text(max_size=12) | st.binary(max_size=12)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8))
    | st.builds(msgpack.Timestamp, st.integers(0, 2**34 - 1), st.integers(0, 10**9 - 1)),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.text(max_size=6) | st.integers(-5, 5) | st.binary(max_size=3) | st.none(),
        children, max_size=4),
    max_leaves=12,
)


@fuzz.fuzz_settings(150)
@given(message=st.lists(ext_values, max_size=5), data=st.data())
def test_any_msgpack_value_round_trips_and_survives_damage(
    message: list[Any], data: st.DataObject
) -> None:
    """Ext types, timestamps, non-string keys: decoded as sent; damaged, refused cleanly."""
    body = msgpack.packb(message, use_bin_type=True)
    assert decode(fuzz.frame(body), MAX_FRAME_BYTES) == ([message], None)
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    check_stream(fuzz.mutated(rng, fuzz.frame(body)), rng, MAX_FRAME_BYTES)


def test_a_declared_size_over_the_limit_is_refused_at_its_header() -> None:
    for size in (MAX_FRAME_BYTES + 1, 2**31, 2**32 - 1):
        decoder = Decoder()
        try:
            decoder.feed(size.to_bytes(4, "big"))
        except FrameError as exc:
            assert exc.code == ErrorCode.FRAME_TOO_LARGE
            assert str(MAX_FRAME_BYTES) in exc.message
        else:
            raise AssertionError(f"a header declaring {size} bytes was accepted")


def test_containers_declaring_more_than_the_frame_holds_allocate_nothing() -> None:
    """A 10-byte body that declares 2**32 items is refused before anything is made."""
    for header in fuzz.HUGE_HEADERS:
        tracemalloc.start()
        try:
            messages, code = decode(fuzz.frame(header + b"\x00" * 4), MAX_FRAME_BYTES)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert (messages, code) == ([], ErrorCode.PROTOCOL_ERROR)
        assert peak < 64 * 1024, f"{header!r}: {peak} bytes allocated for a 10-byte frame"


def test_the_largest_frame_of_the_smallest_objects_costs_memory_in_proportion() -> None:
    """The worst a frame can do to memory is a full frame of one-byte objects (empty
    maps): bounded by the frame limit times the size of an empty map, and freed after."""
    count = MAX_FRAME_BYTES - 16
    body = b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count
    tracemalloc.start()
    try:
        (messages, code) = decode(fuzz.frame(body), MAX_FRAME_BYTES)
        size = len(messages[0])
        del messages
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (size, code) == (count, None)
    assert peak < 100 * MAX_FRAME_BYTES, f"{peak} bytes for one frame"
    assert current < MAX_FRAME_BYTES, "the decoded frame was not freed"


def test_nesting_deeper_than_msgpack_allows_is_a_protocol_error() -> None:
    for prefix in (b"\x91", b"\x81\xa1k"):
        body = prefix * 100_000 + b"\xc0"
        assert decode(fuzz.frame(body), MAX_FRAME_BYTES) == ([], ErrorCode.PROTOCOL_ERROR)


def test_an_unfinished_frame_is_kept_once_however_it_arrives() -> None:
    """A frame trickling in one byte at a time is kept as its bytes, never re-copied into
    more: what the decoder holds is what it was given of the frame."""
    decoder = Decoder()
    data = fuzz.encode_request(1, Op.PING, {"pad": "p" * 50_000})
    for index in range(len(data) - 1):
        assert decoder.feed(data[index:index + 1]) == []
        assert decoder.buffered == index + 1
    assert len(decoder.feed(data[-1:])) == 1
    assert decoder.buffered == 0
