"""A payload measured without a digest (an outcome, a message without a work_key) is
encoded first and walked for its nesting only when it is larger than
MAX_PAYLOAD_DEPTH bytes (each level takes a byte at least). These tests pin the edges
of that shortcut: the smallest value one level too deep is refused, the largest
allowed depth in the fewest bytes passes, and nesting past the msgpack packer's own
limit is still named as too deep, not as unencodable."""

from __future__ import annotations

from typing import Any

import pytest

from rsd.core.ground.errors import CoreError
from rsd.core.ground.payloads import measured_payload
from rsproto import ErrorCode, Limits


def _nested(levels: int) -> Any:
    """``levels`` nested empty lists: ``levels`` deep in exactly ``levels`` bytes."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_the_smallest_value_one_level_too_deep_is_refused() -> None:
    value = _nested(Limits.MAX_PAYLOAD_DEPTH + 1)
    with pytest.raises(CoreError) as caught:
        measured_payload("outcome", value)
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT
    assert "nests maps and arrays more than" in caught.value.message


def test_the_deepest_allowed_value_in_the_fewest_bytes_passes() -> None:
    digest, size = measured_payload("outcome", _nested(Limits.MAX_PAYLOAD_DEPTH))
    assert digest is None
    assert size == Limits.MAX_PAYLOAD_DEPTH


def test_a_deep_map_beside_small_data_is_refused() -> None:
    deep: Any = {"a": 1}
    for _ in range(Limits.MAX_PAYLOAD_DEPTH):
        deep = {"k": deep}
    with pytest.raises(CoreError) as caught:
        measured_payload("data", {"x": 1, "y": deep})
    assert "nests maps and arrays more than" in caught.value.message


def test_nesting_past_the_packers_own_limit_is_named_too_deep() -> None:
    with pytest.raises(CoreError) as caught:
        measured_payload("outcome", _nested(2000))
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT
    assert "nests maps and arrays more than" in caught.value.message


def test_an_unencodable_shallow_value_is_named_unencodable() -> None:
    with pytest.raises(CoreError) as caught:
        measured_payload("outcome", {"x": object()})
    assert "cannot be encoded" in caught.value.message
