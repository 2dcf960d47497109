"""The frame loop sends the reply to a one-lease renewal that succeeded pre-encoded: the
bytes must be exactly what packing the reply would give, for every size of request id."""

from __future__ import annotations

import pytest

import rsproto as wire
from rsd.core.machine import RENEWED_ONE
from rsd.wire import batches


@pytest.mark.parametrize(
    "rid", [1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1]
)
def test_the_pre_encoded_renewal_reply_is_the_packed_reply(rid: int) -> None:
    packed = wire.pack_body(rid)
    frame = batches._RENEWED_HEADS[len(packed)] + packed + batches._RENEWED_TAIL
    assert frame == wire.encode([wire.REPLY, rid, {"results": [None]}])
    assert RENEWED_ONE == {"results": [None]}  # shared: nobody may have changed it
