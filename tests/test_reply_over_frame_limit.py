"""A reply over the frame limit is refused with one answer, deferred or not.

An immediate reply and a deferred one (a parked wait served later) go out through two
paths in the server; both must refuse an over-size reply with RESOURCE_EXHAUSTED naming
its size, so a client sees one error code for one condition.
"""

from __future__ import annotations

import rsproto as wire
from rsd.server import Server
from rsproto import ErrorCode, Kind


def _decode_one(frame: bytes) -> list[object]:
    (message,) = wire.Decoder().feed(frame)
    return message


def test_a_deferred_reply_over_the_frame_limit_is_resource_exhausted() -> None:
    huge = "x" * (wire.MAX_FRAME_BYTES + 1)
    message = _decode_one(Server._encode([int(Kind.REPLY), 7, {"outcome": huge}]))
    assert message[:3] == [Kind.ERROR, 7, ErrorCode.RESOURCE_EXHAUSTED]
    assert "over the frame limit" in str(message[3])


def test_a_push_over_the_frame_limit_is_dropped_not_sent() -> None:
    huge = "x" * (wire.MAX_FRAME_BYTES + 1)
    assert Server._encode([int(Kind.PUSH), 1, {"x": huge}]) == b""


def test_a_deferred_reply_within_the_limit_is_sent_as_is() -> None:
    message = _decode_one(Server._encode([int(Kind.REPLY), 8, {"ok": True}]))
    assert message == [Kind.REPLY, 8, {"ok": True}]
