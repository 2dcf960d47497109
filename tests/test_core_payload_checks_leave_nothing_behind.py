"""The payload checks share one msgpack packer: a payload that fails to encode (part
way through) must leave nothing in it for the next payload's size or digest."""

from __future__ import annotations

import msgpack
import pytest

from rsd.core.ground.errors import CoreError
from rsd.core.ground.payloads import canonical_digest, checked_payload, payload_size


@pytest.mark.parametrize("bad", [{"a": 1, "b": object()}, [1, "x" * 100, 2**70]])
def test_a_payload_that_cannot_be_encoded_leaves_nothing_for_the_next(bad: object) -> None:
    good = {"n": 1, "text": "y" * 40}
    size, digest = payload_size(good), canonical_digest(good)
    with pytest.raises(CoreError):
        checked_payload("data", bad)
    with pytest.raises(CoreError):
        checked_payload("data", bad, salt="box")
    assert payload_size(good) == size == len(msgpack.packb(good, use_bin_type=True))
    assert canonical_digest(good) == digest
