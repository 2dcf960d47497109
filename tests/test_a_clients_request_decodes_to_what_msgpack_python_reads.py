"""A client's request decodes to exactly what msgpack-python reads from it, or is refused
with exactly msgpack-python's error, whichever library decoded it.

rsproto's ``unpack_checked`` (the server's decoder of what a client sends) lets msgspec
decode a body when that can only give msgpack-python's value, and msgpack-python
otherwise (codec.py). What must hold, against msgpack-python called directly
(``unpackb(body, strict_map_key=False, ext_hook=Ext)``), for bodies valid and damaged:

- the same value, of the same types throughout (a timestamp a msgpack Timestamp, an
  extension value an Ext, bin as bytes), or an exception of the same type and message;
- an array used as a map key, at any depth, is refused as msgpack-python refuses it
  (msgspec alone would decode it as a tuple);
- nesting near and past either library's limit (msgpack-python's 1,024 levels,
  msgspec's recursion limit) decodes or is refused as msgpack-python does;
- through the server's frame decoder (``Decoder``, which inlines ``unpack_checked``), the
  same value, or PROTOCOL_ERROR with msgpack-python's message, for every body above.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from rsproto import Decoder, Ext, FrameError, unpack_checked
from rsproto.arraykeys import array_key_in
from rsproto.codec import pack_header


def _msgpack_python(body: bytes) -> Any:
    return msgpack.unpackb(body, strict_map_key=False, ext_hook=Ext)


def _flat(value: Any) -> list[str]:
    """``value`` as a flat list of type names and reprs (without recursion: a value may
    nest a thousand levels), so that equal lists mean equal values of equal types."""
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        out.append(type(item).__name__)
        if type(item) is list:
            out.append(str(len(item)))
            stack.extend(item)
        elif type(item) is dict:
            out.append(str(len(item)))
            for key, nested in item.items():
                out.append(f"{type(key).__name__}:{key!r}")
                stack.append(nested)
        else:
            out.append(repr(item))
    return out


def _outcome(decode: Any, body: bytes) -> tuple[Any, ...]:
    try:
        return ("value", _flat(decode(body)))
    except Exception as exc:  # (the type and message are compared)
        return ("error", type(exc), str(exc))


def _through_the_servers_decoder(body: bytes) -> Any:
    """``body`` as one frame fed to a server's frame decoder (which inlines
    ``unpack_checked``); its refusal as the exception msgpack-python's would be."""
    try:
        [value] = Decoder(what="request").feed(pack_header(len(body)) + body)
    except FrameError as exc:
        assert exc.code == "PROTOCOL_ERROR"
        raise ValueError(exc.message.removeprefix("request is not valid msgpack: ")) from None
    return value


def _refused_as_the_servers_decoder_says(body: bytes) -> Any:
    try:
        return _msgpack_python(body)
    except Exception as exc:  # (as the server's decoder words it)
        raise ValueError(str(exc)) from None


def _assert_same(body: bytes) -> None:
    assert _outcome(unpack_checked, body) == _outcome(_msgpack_python, body), body
    assert _outcome(_through_the_servers_decoder, body) == _outcome(
        _refused_as_the_servers_decoder_says, body
    ), body


_SCALARS: list[Any] = [
    None, True, False, 0, -1, 127, 128, 255, 256, -33, 2**63 - 1, -(2**63), 2**64 - 1,
    1.5, float("inf"), "", "key", "é\u00ff", "\U0001f600", b"", b"\x00\xff\x90",
    msgpack.ExtType(5, b"xy"), msgpack.ExtType(127, b""), msgpack.Timestamp(1, 5),
    msgpack.Timestamp(2**34, 999_999_999),
]
_KEYS: list[Any] = [
    "k", "scope", 1, -7, b"b", 2.5, None, True, ("tup", 1), (), ((1,), 2),
    msgpack.ExtType(3, b"k"),
]


def _value(rng: random.Random, depth: int) -> Any:
    roll = rng.random()
    if depth > 4 or roll < 0.5:
        return rng.choice(_SCALARS)
    if roll < 0.75:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(_KEYS): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def test_any_value_and_any_damaged_body_decode_as_msgpack_python_decodes_them() -> None:
    rng = random.Random(33)
    for _ in range(3000):
        body = msgpack.packb(_value(rng, 0), use_bin_type=True)
        _assert_same(body)
        _assert_same(body[: rng.randrange(len(body) + 1)])  # cut short
        _assert_same(body + b"\x01")  # one value and more
        damaged = bytearray(body)
        damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        _assert_same(bytes(damaged))


def test_a_request_with_an_array_key_is_refused_at_any_depth() -> None:
    for args in (
        {(1, 2): 1},
        {"data": {"n": {(): "x"}}},
        {"data": [1, [2, {("a",): None}]]},
        {"scope": "run", "outcome": {((1,), 2): b"\x00"}},
    ):
        body = msgpack.packb([0, 7, 30, args], use_bin_type=True)
        with pytest.raises(TypeError, match="unhashable type: 'list'"):
            unpack_checked(body)
        _assert_same(body)
    assert not array_key_in([0, 7, 30, {"data": {"n": [1, {"k": 2}]}}])
    assert array_key_in([{1: {(1,): 2}}])


def test_a_key_given_twice_keeps_the_last_value_as_the_spec_says() -> None:
    """protocol.md: a map that holds a key twice keeps the last. Also keys Python holds
    equal (1, True, 1.0): one key, the first's type, the last's value, either way."""
    twice = b"\x82\xa1a\x01\xa1a\x02"  # {"a": 1, "a": 2}
    assert unpack_checked(twice) == {"a": 2}
    _assert_same(twice)
    one_as_a_double = b"\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00"
    alike = b"\x83\x01\xa1x\xc3\xa1y" + one_as_a_double + b"\xa1z"  # {1: x, True: y, 1.0: z}
    value = unpack_checked(alike)
    assert value == {1: "z"} and type(next(iter(value))) is int
    _assert_same(alike)


def test_timestamps_keep_their_nanoseconds_and_range() -> None:
    for stamp in (msgpack.Timestamp(0, 1), msgpack.Timestamp(2**40, 999_999_999)):
        body = msgpack.packb([0, 1, 30, {"data": stamp}], use_bin_type=True)
        assert unpack_checked(body)[3]["data"] == stamp
        _assert_same(body)


@pytest.mark.parametrize("depth", [10, 500, 900, 990, 1000, 1010, 1023, 1024, 1025, 3000])
def test_nesting_near_either_librarys_limit_decodes_as_msgpack_python_decodes_it(
    depth: int,
) -> None:
    _assert_same(b"\x91" * depth + b"\x01")
    _assert_same(b"\x81\xa1k" * depth + b"\x01")
    _assert_same(b"\x81\xa1k" * depth + b"\x81\x91\x01\x02")  # an array key, deep down


def test_the_servers_decoder_refuses_what_msgpack_python_refuses_with_its_message() -> None:
    good = msgpack.packb([0, 1, 30, {"scope": "run", "data": {"n": 1}}], use_bin_type=True)
    bad = msgpack.packb([0, 2, 30, {"data": {(1,): 2}}], use_bin_type=True)
    decoder = Decoder(what="request")
    with pytest.raises(FrameError) as caught:
        decoder.feed(pack_header(len(good)) + good + pack_header(len(bad)) + bad)
    assert caught.value.message == "request is not valid msgpack: unhashable type: 'list'"
    assert caught.value.decoded == [[0, 1, 30, {"scope": "run", "data": {"n": 1}}]]
