"""The rsd wire protocol, version 1: the one codec shared by the SDK and the server.

Everything a peer must agree on lives here and only here: frame layout, frame kinds, op
codes, push events, error codes and limits. ``protocol.md`` states the same tables in
prose, and a test checks that the two agree.

The codec is pure: it turns bytes into messages and messages into bytes, and never
touches a socket or a clock. A frame is a 4-byte big-endian unsigned body length
followed by that many bytes of msgpack. The body is always an array whose first element
is the frame kind.
"""

from __future__ import annotations

import struct
from enum import IntEnum, StrEnum
from typing import Any

import msgpack

__all__ = [
    "HEADER_BYTES",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "Decoder",
    "ErrorCode",
    "FrameError",
    "Kind",
    "Limits",
    "Op",
    "Push",
    "encode",
    "error_frame",
    "pack_body",
    "pack_header",
    "push_frame",
    "reply_frame",
    "request_frame",
]

PROTOCOL_VERSION = 1
HEADER_BYTES = 4
MAX_FRAME_BYTES = 1 << 20  # largest body a peer may send; larger closes the connection

_HEADER = struct.Struct(">I")
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from


class Kind(IntEnum):
    """First element of every frame body."""

    REQUEST = 1  # [1, request_id, op, args]
    REPLY = 2  # [2, request_id, result]
    ERROR = 3  # [3, request_id, code, message, details]; request_id 0 = connection error
    PUSH = 4  # [4, event, body]


class Op(IntEnum):
    """Request op codes. Numbers are stable forever; new ops take new numbers."""

    HELLO = 1
    PING = 2
    CANCEL = 3
    SERVER_STATS = 4
    SCOPE_CREATE = 10
    CLAIM_ACQUIRE = 20
    LEASE_RENEW = 21
    CLAIM_RELEASE = 22
    CLAIM_INSPECT = 23
    SCOPE_CANCEL = 11
    MAILBOX_ENSURE = 30
    TASK_SUBMIT = 31
    MESSAGE_SEND = 32
    RECEIVE = 33
    DELIVERY_COMPLETE = 34
    DELIVERY_RETRY = 35
    DELIVERY_RELEASE = 36
    DELIVERY_REJECT = 37
    DEAD_LETTERS = 38
    QUEUE_INSPECT = 39
    TASK_STATUS = 40
    TASK_RESULT = 41
    TASK_JOIN = 42
    TASK_DETACH = 43
    TASK_CANCEL = 44


class Push(IntEnum):
    """Server-initiated events, sent as PUSH frames."""

    LEASE_LOST = 1


class ErrorCode(StrEnum):
    """The closed set of error codes. On the wire an error carries the name as a string."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    CLAIM_HELD = "CLAIM_HELD"
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    STALE_CLAIM = "STALE_CLAIM"
    WAIT_TIMEOUT = "WAIT_TIMEOUT"
    CANCELLED = "CANCELLED"
    SCOPE_CANCELLED = "SCOPE_CANCELLED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"
    UNKNOWN_OP = "UNKNOWN_OP"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    PROTOCOL_ERROR = "PROTOCOL_ERROR"
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    INTERNAL = "INTERNAL"


class Limits:
    """Validation limits the server enforces and announces in its HELLO reply."""

    MAX_FRAME_BYTES = MAX_FRAME_BYTES
    MAX_KEY_BYTES = 512
    MAX_SCOPE_ID_BYTES = 128
    MAX_HOLDER_BYTES = 256
    MIN_LEASE_SECONDS = 5
    MAX_LEASE_SECONDS = 600
    DEFAULT_LEASE_SECONDS = 30
    MAX_WAIT_TIMEOUT_MS = 3_600_000
    DEFAULT_WAIT_TIMEOUT_MS = 30_000
    MAX_RENEW_BATCH = 10_000
    MAX_WAITERS_PER_KEY = 10_000
    MAX_WAITS_PER_CONNECTION = 65_536
    MAX_PAYLOAD_BYTES = 256 * 1024
    MAX_PAYLOAD_DEPTH = 100
    MAX_MAILBOX_NAME_BYTES = 128
    MAX_SUBSCRIBER_ID_BYTES = 256
    MAX_REASON_BYTES = 1024
    DEFAULT_MAX_ATTEMPTS = 5
    MAX_ATTEMPTS = 100
    DEFAULT_RETRY_BACKOFF_MS = 1000
    MAX_RETRY_BACKOFF_MS = 3_600_000
    MAX_DEAD_LETTERS = 1000
    MAX_SUBSCRIBERS_PER_TASK = 1000
    HANDSHAKE_TIMEOUT_SECONDS = 10

    @classmethod
    def as_dict(cls) -> dict[str, int]:
        return {
            name.lower(): value
            for name, value in vars(cls).items()
            if name.isupper() and isinstance(value, int)
        }


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

# Plain ints for the hot paths (enum attribute access costs more than the packing).
REQUEST, REPLY, ERROR, PUSH = 1, 2, 3, 4


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
