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
    """The byte stream broke the framing rules; the connection cannot continue."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# One packer reused: packing runs in C without releasing the GIL and resets its buffer
# on error, so it is safe to share between threads and saves a packer per frame.
_pack = msgpack.Packer(use_bin_type=True).pack
pack_body = _pack  # for a caller that writes header and body itself (the server's hot path)
pack_header = _pack_header

def encode(message: list[Any]) -> bytes:
    """One frame: header plus msgpack body. Raises FrameError if the body is too large."""
    try:
        body = _pack(message)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FrameError(ErrorCode.INVALID_ARGUMENT, f"cannot encode as msgpack: {exc}") from None
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(
            ErrorCode.FRAME_TOO_LARGE,
            f"frame body of {len(body)} bytes exceeds the limit of {MAX_FRAME_BYTES} bytes",
        )
    return _pack_header(len(body)) + body


def request_frame(request_id: int, op: int, args: dict[str, Any]) -> bytes:
    return encode([REQUEST, request_id, op, args])


def reply_frame(request_id: int, result: Any) -> bytes:
    return encode([REPLY, request_id, result])


def error_frame(
    request_id: int, code: str, message: str, details: dict[str, Any] | None = None
) -> bytes:
    return encode([ERROR, request_id, str(code), message, details])


def push_frame(event: int, body: dict[str, Any]) -> bytes:
    return encode([PUSH, event, body])


class Decoder:
    """Incremental frame decoder: ``feed(bytes)`` returns every complete message.

    Each message is the decoded msgpack body (any value; the caller checks its shape).
    A declared length above ``max_frame`` or a body that is not msgpack raises
    FrameError; after that the stream is unusable and the connection must close.
    """

    __slots__ = ("_buf", "_max_frame")

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max_frame = max_frame

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Any]:
        buf = self._buf
        if buf:
            buf += data
            view = memoryview(buf)
        else:
            view = memoryview(data)
        out: list[Any] = []
        pos = 0
        end = len(view)
        max_frame = self._max_frame
        try:
            while end - pos >= HEADER_BYTES:
                (size,) = _unpack_header(view, pos)
                if size > max_frame:
                    raise FrameError(
                        ErrorCode.FRAME_TOO_LARGE,
                        f"declared frame body of {size} bytes exceeds the limit of "
                        f"{max_frame} bytes",
                    )
                start = pos + HEADER_BYTES
                stop = start + size
                if stop > end:
                    break
                try:
                    out.append(
                        msgpack.unpackb(view[start:stop], raw=False, strict_map_key=False)
                    )
                except Exception as exc:  # msgpack raises several unrelated types
                    raise FrameError(
                        ErrorCode.PROTOCOL_ERROR, f"frame body is not valid msgpack: {exc}"
                    ) from None
                pos = stop
            rest = view[pos:].tobytes() if pos < end else b""
        finally:
            view.release()
        if buf:
            buf.clear()
        if rest:
            buf += rest
        return out
