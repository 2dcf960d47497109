"""The codec: bytes to messages and messages to bytes, and nothing else.

A frame is a 4-byte big-endian unsigned body length followed by that many bytes of
msgpack; the body is always an array whose first element is the frame kind. The codec
is pure: it never touches a socket or a clock, so it is tested whole, byte by byte and
under a fuzzer.

msgpack's work is done by two libraries, each where it is exact:
- what an rsd writes (replies and pushes on its hot path, journal records, the payload
  sizes it measures) is encoded by msgspec (``pack_from_rsd``), the same bytes
  msgpack-python's Packer writes (``use_bin_type``: str and bin apart, floats as float
  64, the shortest integer, tuples as arrays; Ext, msgpack's Timestamp and the
  subclasses of int, float, str and bytes through ``_as_msgpack_packs_it``), in half its
  time: an rsd writes only values it made or decoded;
- what a user made (a client's requests, ``encode`` and the frames built on it) is
  encoded by msgpack-python (``pack_body``): msgspec would also encode a set, a datetime,
  a UUID or a dataclass, which a client must refuse (protocol.md: what the wire cannot
  carry), and recurses only as deep as Python's recursion limit;
- what a client sends (``unpack_checked``) is decoded by msgspec, about twice as fast,
  when that gives msgpack-python's value, else by msgpack-python: msgspec decodes an
  array used as a map key as a tuple, where the protocol refuses the frame (a value
  holding a tuple is decoded again by msgpack-python, which refuses it), and a timestamp
  (ext -1) as a datetime, to the microsecond and between the years 1 and 9999, where the
  protocol stores and returns it as it came (a body with a byte 0xff goes to
  msgpack-python straight away); a body msgspec refuses gets msgpack-python's error;
- what an rsd wrote (its replies and pushes, read by a client; its journal, read back) is
  decoded by msgspec (``unpack_from_rsd``), about twice as fast: rsd never writes an
  array key (it decoded everything it stores with ``unpack_checked``), and a body that
  may hold a timestamp (any byte 0xff) goes to msgpack-python instead;
- an extension value decodes as ``Ext`` either way (msgpack-python's ExtType is a
  tuple, which msgspec would encode as an array; Ext equals it), a timestamp as
  msgpack's Timestamp, so a value decodes to the same object whichever library read it.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import msgspec

from .arraykeys import array_key_in
from .limits import MAX_FRAME_BYTES
from .vocabulary import ERROR, PUSH, REPLY, REQUEST, ErrorCode

__all__ = [
    "ENCODE_ERRORS",
    "HEADER_BYTES",
    "Decoder",
    "Ext",
    "FrameError",
    "encode",
    "error_frame",
    "pack_body",
    "pack_from_rsd",
    "pack_header",
    "push_frame",
    "reply_frame",
    "request_frame",
    "unpack_checked",
    "unpack_from_rsd",
]

HEADER_BYTES = 4

_HEADER = struct.Struct(">I")
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from


class FrameError(Exception):
    """The byte stream broke the framing rules; the connection cannot continue.

    ``decoded`` holds the messages that ``Decoder.feed`` decoded from the same call before
    the broken frame: they were well framed, so a server may still execute and answer them.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.decoded: list[Any] = []


class Ext:
    """An extension value (a payload may hold them; no protocol field does): its type and
    its bytes, as they came. Hashable (a map key may be one) and equal to msgpack-python's
    ExtType of the same type and bytes; not a tuple, as ExtType is, because msgspec would
    encode a tuple as an array."""

    __slots__ = ("code", "data")

    def __init__(self, code: int, data: bytes | bytearray | memoryview) -> None:
        self.code = code
        self.data = bytes(data)  # (msgspec hands over a view of the frame)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Ext | msgpack.ExtType):
            return self.code == other.code and self.data == other.data
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.code, self.data))

    def __repr__(self) -> str:
        return f"Ext(code={self.code}, data={self.data!r})"


# What ``pack_from_rsd`` may raise: a type msgpack has no form for (TypeError), an integer
# outside -2**63 .. 2**64-1 (OverflowError), nesting past the interpreter's recursion
# limit (RecursionError: msgspec recurses in C under Python's limit).
ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)


def _as_msgpack_packs_it(value: Any) -> Any:
    """msgspec's ``enc_hook``: the values msgpack-python's Packer encodes and msgspec does
    not (an Ext, a Timestamp, subclasses of int, float, str and bytes), as msgspec
    encodes them to the same bytes; any other value is refused as the Packer refused it."""
    if type(value) is Ext:
        return msgspec.msgpack.Ext(value.code, value.data)
    if type(value) is msgpack.Timestamp:
        return msgspec.msgpack.Ext(-1, value.to_bytes())
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return bytes(value)
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


def _ext_type(value: Any) -> Any:
    """msgpack-python's ``default``: an Ext as its ExtType; any other value refused."""
    if type(value) is Ext:
        return msgpack.ExtType(value.code, value.data)
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


# ``pack_body(value)``: any value a user made (a client's requests), by msgpack-python's
# Packer, which refuses what msgpack has no form for: msgspec would encode a set, a
# datetime, a UUID, a dataclass. One Packer reused: packing runs in C without releasing
# the GIL and resets its buffer on error, so it is safe to share between threads.
pack_body = msgpack.Packer(use_bin_type=True, default=_ext_type).pack
# ``pack_from_rsd(value)``: a value an rsd made or decoded (replies, pushes, journal
# records, payloads measured), by msgspec: the same bytes as ``pack_body`` for every such
# value (msgpack's types, Ext, Timestamp, NamedTuple records, IntEnum) in half its time.
# One encoder reused: it keeps no state between calls, so every caller and thread shares it.
pack_from_rsd = msgspec.msgpack.Encoder(enc_hook=_as_msgpack_packs_it).encode
pack_header = _pack_header

_unpackb = msgpack.unpackb
_fast_decode = msgspec.msgpack.Decoder(ext_hook=Ext).decode


def unpack_checked(body: Any) -> Any:
    """One msgpack value, decoded as the protocol says (any map key but an array or a map,
    extension values as Ext, timestamps as msgpack's Timestamp); raises on any body that
    is not exactly one valid value, as msgpack-python raises.

    msgspec decodes it when it can only give msgpack-python's value: a body with no byte
    0xff (no timestamp, an extension of type -1) that it decodes holding no tuple (an
    array used as a map key: ``array_key_in``). Anything else (a timestamp, an array key,
    a body msgspec refuses, nesting past its recursion limit) goes to msgpack-python,
    whose value or error is the answer. (msgpack-python's call: keywords passed as names,
    not a ``functools.partial``, which copies them into a new dict at every call.)"""
    if type(body) is memoryview:
        body = body.tobytes()  # (``in`` on a memoryview would iterate in Python)
    if 255 not in body:  # (a memchr)
        try:
            value = _fast_decode(body)
            if not array_key_in(value):
                return value
        except Exception:  # (msgpack-python's verdict, below; RecursionError included)
            pass
    return _unpackb(body, strict_map_key=False, ext_hook=Ext)


def unpack_from_rsd(body: Any) -> Any:
    """``unpack_checked(body)`` for a body an rsd encoded (it holds no array key): by
    msgspec, unless it may hold a timestamp. ``body``: bytes, bytearray or memoryview."""
    if type(body) is memoryview:
        body = body.tobytes()  # (``in`` on a memoryview would iterate in Python)
    if 255 in body:  # (a memchr; an extension value of type -1 holds this byte)
        return unpack_checked(body)
    return _fast_decode(body)


def _too_large(what: str, size: int, limit: int) -> FrameError:
    """The one message for a frame over the size limit, naming what the frame is (a
    client's is a "request": that is what its user sent, the word they know)."""
    return FrameError(
        ErrorCode.FRAME_TOO_LARGE,
        f"{what} of {size} bytes (encoded) is over the limit of {limit} bytes per {what}",
    )


def encode(message: list[Any], what: str = "frame") -> bytes:
    """One frame: header plus msgpack body. Raises FrameError if the body is too large
    (``what`` names the frame in that message)."""
    try:
        body = pack_body(message)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FrameError(ErrorCode.INVALID_ARGUMENT, f"cannot encode as msgpack: {exc}") from None
    if len(body) > MAX_FRAME_BYTES:
        raise _too_large(what, len(body), MAX_FRAME_BYTES)
    return _pack_header(len(body)) + body


def request_frame(request_id: int, op: int, args: dict[str, Any]) -> bytes:
    """A REQUEST frame: ``[0, request_id, op, args]``, length-prefixed."""
    return encode([REQUEST, request_id, op, args], "request")


def reply_frame(request_id: int, result: Any) -> bytes:
    """A REPLY frame: ``[1, request_id, result]``, length-prefixed."""
    return encode([REPLY, request_id, result], "reply")


def error_frame(
    request_id: int, code: str, message: str, details: dict[str, Any] | None = None
) -> bytes:
    """An ERROR frame: ``[2, request_id, {code, message, details}]``, length-prefixed."""
    return encode([ERROR, request_id, str(code), message, details])


def push_frame(event: int, body: dict[str, Any]) -> bytes:
    """A PUSH frame: ``[3, event, body]``, length-prefixed."""
    return encode([PUSH, event, body])


class Decoder:
    """Incremental frame decoder: ``feed(bytes)`` returns every complete message.

    Each message is the decoded msgpack body (any value; the caller checks its shape).
    A declared length above ``max_frame`` or a body that is not msgpack raises
    FrameError (carrying the messages decoded before it in ``decoded``); after that the
    stream is unusable and the connection must close. ``feed(data, limit)`` decodes at
    most ``limit`` messages and keeps the rest of the bytes; ``feed(b"", limit)`` goes on.

    What always holds: frames are decoded straight from the fed bytes when nothing is
    buffered; what is kept (an unfinished frame, or frames not yet asked for) lives in
    one bytearray that is appended to and consumed from the front, so a large frame
    arriving in many small reads costs O(its size) in all, never a re-copy per read.
    """

    __slots__ = ("_buf", "_max_frame", "_need", "_unpack", "_what")

    def __init__(
        self, max_frame: int = MAX_FRAME_BYTES, what: str = "frame", *, from_rsd: bool = False
    ) -> None:
        """``what``: the name of the frames in its errors (a server's: "request").
        ``from_rsd``: the stream is an rsd's (a client reading its server), decoded by
        ``unpack_from_rsd``; else by ``unpack_checked``, as a server reads a client's."""
        self._buf = bytearray()  # bytes received and not yet decoded
        self._need = HEADER_BYTES  # ``_buf`` must hold this much before a frame completes
        self._max_frame = max_frame
        self._what = what
        self._unpack = unpack_from_rsd if from_rsd else unpack_checked

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded (0: every frame fed has been returned)."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview, limit: int | None = None) -> list[Any]:
        """Take ``data`` and return every message completed by it (at most ``limit``;
        the rest stays buffered). A malformed frame raises FrameError."""
        out: list[Any] = []
        try:
            self._feed(data, out, limit)
        except FrameError as exc:
            exc.decoded = out
            raise
        return out

    def _feed(
        self, data: bytes | bytearray | memoryview, out: list[Any], limit: int | None
    ) -> None:
        buf = self._buf
        if buf:
            if data:
                buf += data  # amortised O(len(data)): a bytearray over-allocates
            if len(buf) < self._need:
                return  # the frame begun is still unfinished: nothing to look at
            source: Any = buf
        else:
            source = data
        pos = self._decode(source, out, limit)
        if source is not buf and pos < len(source):
            with memoryview(source) as view, view[pos:] as rest:
                buf += rest
        if source is buf and pos:
            del buf[:pos]  # O(1) in CPython: the bytearray moves its start
        if len(buf) < HEADER_BYTES:
            self._need = HEADER_BYTES
        else:
            self._need = HEADER_BYTES + self._size(buf, 0)

    def _decode(self, view: Any, out: list[Any], limit: int | None) -> int:
        """Decode complete frames from the start of ``view`` (bytes, a bytearray or a
        memoryview; each body is unpacked from a slice of it: for a small frame a copy
        costs less than a memoryview); the bytes consumed."""
        pos = 0
        end = len(view)
        count = len(out)
        if limit is None:
            limit = end  # no limit: a frame is at least a header
        max_frame = self._max_frame
        append = out.append
        unpack = self._unpack
        checked = unpack is unpack_checked  # a client's frames: see below
        while end - pos >= HEADER_BYTES and count < limit:
            # (the header check of ``_size`` inlined: this loop runs once per request)
            (size,) = _unpack_header(view, pos)
            if size > max_frame:
                self._size(view, pos)  # raises FrameError naming the limit
            start = pos + HEADER_BYTES
            stop = start + size
            if stop > end:
                break
            try:
                body = view[start:stop]
                if checked and type(body) is not memoryview and 255 not in body:
                    # ``unpack_checked``, inlined (one Python call less a request)
                    try:
                        value = _fast_decode(body)
                        if array_key_in(value):
                            value = _unpackb(body, strict_map_key=False, ext_hook=Ext)
                    except Exception:  # msgpack-python's verdict
                        value = _unpackb(body, strict_map_key=False, ext_hook=Ext)
                    append(value)
                else:
                    append(unpack(body))
            except Exception as exc:  # either library raises several unrelated types
                raise FrameError(
                    ErrorCode.PROTOCOL_ERROR, f"{self._what} is not valid msgpack: {exc}"
                ) from None
            count += 1
            pos = stop
        return pos

    def _size(self, header: Any, offset: int) -> int:
        size: int
        (size,) = _unpack_header(header, offset)
        if size > self._max_frame:
            raise _too_large(self._what, size, self._max_frame)  # as its header declares
        return size
