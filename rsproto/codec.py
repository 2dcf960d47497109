"""The codec: bytes to messages and messages to bytes, and nothing else.

A frame is a 4-byte big-endian unsigned body length followed by that many bytes of
msgpack; the body is always an array whose first element is the frame kind. The codec
is pure: it never touches a socket or a clock, so it is tested whole, byte by byte and
under a fuzzer.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from .limits import MAX_FRAME_BYTES
from .vocabulary import ERROR, PUSH, REPLY, REQUEST, ErrorCode

__all__ = [
    "HEADER_BYTES",
    "Decoder",
    "FrameError",
    "encode",
    "error_frame",
    "pack_body",
    "pack_header",
    "push_frame",
    "reply_frame",
    "request_frame",
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


# One packer reused: packing runs in C without releasing the GIL and resets its buffer
# on error, so it is safe to share between threads and saves a packer per frame.
_pack = msgpack.Packer(use_bin_type=True).pack
pack_body = _pack  # for a caller that writes header and body itself (the server's hot path)
pack_header = _pack_header

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
        body = _pack(message)
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

    __slots__ = ("_buf", "_max_frame", "_need", "_what")

    def __init__(self, max_frame: int = MAX_FRAME_BYTES, what: str = "frame") -> None:
        """``what``: the name of the frames in its errors (a server's: "request")."""
        self._buf = bytearray()  # bytes received and not yet decoded
        self._need = HEADER_BYTES  # ``_buf`` must hold this much before a frame completes
        self._max_frame = max_frame
        self._what = what

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
        unpackb = msgpack.unpackb
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
                append(unpackb(view[start:stop], raw=False, strict_map_key=False))
            except Exception as exc:  # msgpack raises several unrelated types
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
