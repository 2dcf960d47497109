"""The canonical digest of a task's input is persisted (journal records, snapshots) and
compared with every later submission under the same key: a digest that changed between
versions would refuse a resubmission of the very same input after an upgrade
(IDEMPOTENCY_CONFLICT). These values were computed by the first implementation; any
rewrite of payloads.py (they were, for speed) must give exactly them."""

from __future__ import annotations

from typing import Any

import pytest

from rsd.core import CoreError
from rsd.core.ground.payloads import canonical_digest, checked_payload
from rsproto import Limits

PINNED: list[tuple[Any, str, int]] = [
    (None, "c1de3d73264f36d9026974cadce17083", 1),
    (1, "3275df1f2639cdaab6170e62b4abb155", 1),
    ("x", "2e7217d9891a0f3fb638ecb15b2de411", 2),
    ({"n": 1}, "678c987b399cd13ba0d15de77baccd22", 4),
    ({"b": 1, "a": [1, {"z": 2, "y": (3, 4)}]}, "f6d6b9a91b15c63381ae155d1094e734", 17),
    ({1: "i", "1": "s", 2.5: "f", b"k": "b"}, "c3eac8507645907bd01985195dec0fbf", 24),
    ([[[]]], "02d79ac257ff581bd8420afd50788aa9", 3),
]


@pytest.mark.parametrize(("value", "digest", "size"), PINNED)
def test_input_digest_is_the_same_in_every_version(value: Any, digest: str, size: int) -> None:
    assert canonical_digest(value, "jobs") == (bytes.fromhex(digest), size)


def test_digest_ignores_key_order_at_every_level() -> None:
    one = {"a": 1, "b": {"x": [1, {"p": 1, "q": 2}], "y": 2}}
    other = {"b": {"y": 2, "x": [1, {"q": 2, "p": 1}]}, "a": 1}
    assert canonical_digest(one, "s") == canonical_digest(other, "s")


def nested(levels: int) -> Any:
    """Maps and arrays, alternating, ``levels`` deep."""
    value: Any = 1
    for level in range(levels):
        value = {"k": value} if level % 2 else [value]
    return value


@pytest.mark.parametrize("salt", [None, "jobs"])
def test_depth_limit_is_checked_in_the_same_walk_as_the_digest(salt: str | None) -> None:
    checked_payload("data", nested(Limits.MAX_PAYLOAD_DEPTH), salt)  # at the limit: fine
    with pytest.raises(CoreError) as info:
        checked_payload("data", nested(Limits.MAX_PAYLOAD_DEPTH + 1), salt)
    assert f"more than {Limits.MAX_PAYLOAD_DEPTH} levels deep" in info.value.message
    with pytest.raises(CoreError):  # far too deep: refused, never a RecursionError
        checked_payload("data", nested(100_000), salt)
