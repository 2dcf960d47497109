"""The codec, tested whole, byte by byte, in random chunks and under a fuzzer.

A frame is a 4-byte big-endian body length followed by a msgpack body. Every input to
``Decoder.feed`` either yields a list of messages or raises FrameError: nothing else.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsproto import (
    HEADER_BYTES,
    MAX_FRAME_BYTES,
    Decoder,
    ErrorCode,
    FrameError,
    Kind,
    Op,
    Push,
    encode,
    error_frame,
    push_frame,
    reply_frame,
    request_frame,
)

FUZZ = settings(max_examples=300, deadline=None)
# Lease handles (bin, 16 bytes: id then random part), as the server sends them.
H1, H2, H3 = (n.to_bytes(8, "big") + bytes([0x5A] * 8) for n in (1, 2, 3))

SAMPLE_FRAMES: list[tuple[bytes, list[Any]]] = [
    (
        request_frame(7, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": 30}),
        [Kind.REQUEST, 7, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": 30}],
    ),
    (
        reply_frame(7, {"lease": H1, "generation": 1, "lease_seconds": 30}),
        [Kind.REPLY, 7, {"lease": H1, "generation": 1, "lease_seconds": 30}],
    ),
    (
        error_frame(8, ErrorCode.CLAIM_HELD, "held", {"holder": "a", "generation": 2}),
        [Kind.ERROR, 8, "CLAIM_HELD", "held", {"holder": "a", "generation": 2}],
    ),
    (
        error_frame(0, ErrorCode.PROTOCOL_ERROR, "bad frame"),
        [Kind.ERROR, 0, "PROTOCOL_ERROR", "bad frame", None],
    ),
    (
        push_frame(Push.LEASE_LOST, {"lease": H3, "reason": "expired"}),
        [Kind.PUSH, Push.LEASE_LOST, {"lease": H3, "reason": "expired"}],
    ),
    (
        request_frame(2**32, Op.LEASE_RENEW, {"leases": [H1, [H2, 60], [H3, 7.5]]}),
        [Kind.REQUEST, 2**32, Op.LEASE_RENEW, {"leases": [H1, [H2, 60], [H3, 7.5]]}],
    ),
    (
        reply_frame(9, {"blob": b"\x00\xff" * 100, "text": "\u00e9t\u00e9", "none": None}),
        [Kind.REPLY, 9, {"blob": b"\x00\xff" * 100, "text": "\u00e9t\u00e9", "none": None}],
    ),
]
STREAM = b"".join(frame for frame, _ in SAMPLE_FRAMES)
MESSAGES = [message for _, message in SAMPLE_FRAMES]


def framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def feed_in_chunks(data: bytes, sizes: list[int]) -> list[Any]:
    decoder = Decoder()
    out: list[Any] = []
    pos = 0
    for size in sizes:
        out += decoder.feed(data[pos : pos + size])
        pos += size
    out += decoder.feed(data[pos:])
    assert decoder.buffered == 0
    return out


# ---- frame builders ------------------------------------------------------------------


@pytest.mark.parametrize(("frame", "message"), SAMPLE_FRAMES)
def test_each_frame_builder_round_trips(frame: bytes, message: list[Any]) -> None:
    assert Decoder().feed(frame) == [message]


@pytest.mark.parametrize(("frame", "message"), SAMPLE_FRAMES)
def test_frame_header_is_the_big_endian_body_length(frame: bytes, message: list[Any]) -> None:
    (size,) = struct.unpack(">I", frame[:HEADER_BYTES])
    assert size == len(frame) - HEADER_BYTES
    assert msgpack.unpackb(frame[HEADER_BYTES:], raw=False) == message


def test_error_frame_carries_the_code_as_its_name() -> None:
    (message,) = Decoder().feed(error_frame(1, ErrorCode.STALE_CLAIM, "stale"))
    assert type(message[2]) is str
    assert message[2] == "STALE_CLAIM"


# ---- feeding -------------------------------------------------------------------------


def test_several_frames_in_one_feed_all_come_out_in_order() -> None:
    assert Decoder().feed(STREAM) == MESSAGES


def test_feeding_byte_by_byte_gives_the_same_messages() -> None:
    decoder = Decoder()
    out: list[Any] = []
    for i in range(len(STREAM)):
        out += decoder.feed(STREAM[i : i + 1])
    assert out == MESSAGES
    assert decoder.buffered == 0


@pytest.mark.parametrize("seed", range(20))
def test_feeding_random_chunks_gives_the_same_messages(seed: int) -> None:
    rng = random.Random(seed)
    sizes = []
    total = 0
    while total < len(STREAM):
        size = rng.choice([0, 1, 2, 3, 4, 5, rng.randint(1, 64), rng.randint(1, 400)])
        sizes.append(size)
        total += size
    assert feed_in_chunks(STREAM, sizes) == MESSAGES


def test_partial_frame_is_held_until_the_rest_arrives() -> None:
    frame, message = SAMPLE_FRAMES[0]
    decoder = Decoder()
    assert decoder.feed(frame[:-1]) == []
    assert decoder.buffered == len(frame) - 1
    assert decoder.feed(frame[-1:]) == [message]
    assert decoder.buffered == 0


def test_header_split_across_feeds_is_reassembled() -> None:
    frame, message = SAMPLE_FRAMES[1]
    decoder = Decoder()
    assert decoder.feed(frame[:2]) == []
    assert decoder.feed(frame[2:5]) == []
    assert decoder.feed(frame[5:]) == [message]


def test_complete_frames_come_out_and_the_tail_stays_buffered() -> None:
    first, first_message = SAMPLE_FRAMES[0]
    second, second_message = SAMPLE_FRAMES[1]
    decoder = Decoder()
    assert decoder.feed(first + second[:3]) == [first_message]
    assert decoder.buffered == 3
    assert decoder.feed(second[3:]) == [second_message]


def test_empty_feed_returns_nothing() -> None:
    decoder = Decoder()
    assert decoder.feed(b"") == []
    assert decoder.buffered == 0


def test_feed_accepts_bytearray_and_memoryview() -> None:
    assert Decoder().feed(bytearray(STREAM)) == MESSAGES
    assert Decoder().feed(memoryview(STREAM)) == MESSAGES


def test_decoded_messages_do_not_alias_the_fed_buffer() -> None:
    first, second = bytearray(reply_frame(1, b"abc")), bytearray(reply_frame(2, b"def"))
    decoder = Decoder()
    ((_, _, whole),) = decoder.feed(first)  # fed while nothing is buffered
    assert decoder.feed(second[:-1]) == []
    ((_, _, pieced),) = decoder.feed(second[-1:])
    first[:] = second[:] = b"\x00" * len(first)
    assert (whole, pieced) == (b"abc", b"def")


# ---- size limits ---------------------------------------------------------------------


def test_declared_length_above_max_is_refused_before_the_body_arrives() -> None:
    with pytest.raises(FrameError) as info:
        Decoder().feed(struct.pack(">I", MAX_FRAME_BYTES + 1))
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert str(MAX_FRAME_BYTES) in info.value.message


def test_declared_length_above_a_custom_max_is_refused() -> None:
    with pytest.raises(FrameError) as info:
        Decoder(max_frame=16).feed(framed(msgpack.packb("x" * 32)))
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE


def test_oversize_header_after_a_good_frame_is_refused() -> None:
    frame, _ = SAMPLE_FRAMES[0]
    decoder = Decoder(max_frame=64)
    decoder.feed(frame)
    with pytest.raises(FrameError) as info:
        decoder.feed(struct.pack(">I", 65))
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE


def test_body_of_exactly_the_max_size_is_encoded_and_decoded() -> None:
    # fixarray(1) header + bin32 header = 6 bytes of overhead around the payload
    payload = b"x" * (MAX_FRAME_BYTES - 6)
    frame = encode([payload])
    assert len(frame) == HEADER_BYTES + MAX_FRAME_BYTES
    assert Decoder().feed(frame) == [[payload]]


def test_encode_of_an_oversize_body_raises_frame_too_large() -> None:
    with pytest.raises(FrameError) as info:
        encode([b"x" * (MAX_FRAME_BYTES - 5)])
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE


def test_frame_builders_refuse_an_oversize_body() -> None:
    with pytest.raises(FrameError):
        reply_frame(1, "x" * MAX_FRAME_BYTES)


# ---- bad bodies ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",  # empty body: no value at all
        b"\xc1",  # the one byte msgpack never uses
        b"\x92\x01",  # array of two with only one element
        b"\x01\x02",  # two values in one body
        b"\xa3ab",  # str of 3 with only 2 bytes
        b"\xa2\xff\xfe",  # str that is not UTF-8
    ],
)
def test_body_that_is_not_one_msgpack_value_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(FrameError) as info:
        Decoder().feed(framed(body))
    assert info.value.code == ErrorCode.PROTOCOL_ERROR


def test_bad_body_after_good_frames_is_a_protocol_error() -> None:
    decoder = Decoder()
    with pytest.raises(FrameError) as info:
        decoder.feed(STREAM + framed(b"\xc1"))
    assert info.value.code == ErrorCode.PROTOCOL_ERROR


def test_frame_error_is_an_exception_with_code_and_message() -> None:
    error = FrameError(ErrorCode.PROTOCOL_ERROR, "nope")
    assert isinstance(error, Exception)
    assert (error.code, error.message, str(error)) == (ErrorCode.PROTOCOL_ERROR, "nope", "nope")


# ---- fuzzing -------------------------------------------------------------------------


def feed_never_fails_otherwise(decoder: Decoder, chunks: list[bytes]) -> None:
    for chunk in chunks:
        try:
            out = decoder.feed(chunk)
        except FrameError as exc:
            assert exc.code in (ErrorCode.FRAME_TOO_LARGE, ErrorCode.PROTOCOL_ERROR)
            return
        assert isinstance(out, list)


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_fuzz_arbitrary_bytes_give_a_list_or_frame_error(chunks: list[bytes]) -> None:
    feed_never_fails_otherwise(Decoder(), chunks)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=48), min_size=1, max_size=6), st.integers(0, 3))
def test_fuzz_well_framed_arbitrary_bodies_give_a_list_or_frame_error(
    bodies: list[bytes], cut: int
) -> None:
    # Correct headers around random bodies reach the msgpack layer most of the time.
    stream = b"".join(framed(body) for body in bodies)
    feed_never_fails_otherwise(Decoder(max_frame=64), [stream[:cut], stream[cut:]])


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
msgpack_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        # str keys only: the decoder keeps msgpack's default strict_map_key=True
        | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)


@settings(max_examples=80, deadline=None)
@given(st.lists(msgpack_values, max_size=3))
def test_fuzz_any_msgpack_value_round_trips(message: list[Any]) -> None:
    assert Decoder().feed(encode(message)) == [message]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(scalars, max_size=4), min_size=1, max_size=4), st.data())
def test_fuzz_any_chunking_of_a_stream_gives_the_same_messages(
    messages: list[list[Any]], data: st.DataObject
) -> None:
    stream = b"".join(encode(m) for m in messages)
    sizes = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    assert feed_in_chunks(stream, sizes) == messages
