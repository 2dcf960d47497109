"""The slot of a run id, a pool's or a quota's name is the CRC-32 (ISO-HDLC) of its hash
tag modulo the cluster's slots: every client computes it alike to route without asking,
so the test vectors (protocol.md lists them; both SDKs are tested on them) are frozen
here, and computed again by a plain bitwise CRC-32 that shares no code with zlib."""

from __future__ import annotations

import re

import pytest

from rsproto.slots import SLOT_VECTORS, hash_tag, placed_id, slot_of

FROZEN = (
    ("123456789", 1024, 294), ("123456789", 16384, 14630), ("", 1024, 0), ("a", 1024, 579),
    ("4f2a9c1e7b3d5a6f8e0c2b1d", 1024, 392), ("{acme}4f2a9c1e7b3d5a6f8e0c2b1d", 1024, 574),
    ("acme", 1024, 574), ("{acme}gpu", 1024, 574), ("{}acme", 1024, 509),
    ("{acme", 1024, 993), ("acme}{", 1024, 475), ("x{acme}y{other}", 1024, 574),
    ("räksmörgås", 1024, 194), ("ünïcødé{τag}", 1024, 13), ("run-42", 2, 0),
    ("run-42", 1, 0), ("run-42", 16384, 5410),
)


def crc32_bitwise(data: bytes) -> int:
    """CRC-32/ISO-HDLC, one bit at a time: reflected polynomial 0xEDB88320, initial and
    final XOR 0xFFFFFFFF."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def tag_by_rule(key: str) -> str:
    """The hash tag as protocol.md words it: between the first '{' and the first '}'
    after it, if not empty; else the whole key."""
    found = re.match(r"[^{]*\{([^}]+)\}", key)
    if found is None or key.find("}", key.find("{") + 1) == key.find("{") + 1:
        return key
    return found.group(1)


def test_the_vectors_are_frozen() -> None:
    assert crc32_bitwise(b"123456789") == 0xCBF43926  # the CRC's own check value
    assert SLOT_VECTORS == FROZEN


@pytest.mark.parametrize(("key", "slots", "slot"), FROZEN)
def test_each_vector_is_the_crc32_of_the_hash_tag_modulo_the_slots(
    key: str, slots: int, slot: int
) -> None:
    assert hash_tag(key) == tag_by_rule(key).encode()
    assert crc32_bitwise(tag_by_rule(key).encode()) % slots == slot == slot_of(key, slots)


@pytest.mark.parametrize("placement", ["acme", "räksmörgås", "x" * 64, "a b"])
def test_a_placed_run_is_in_the_slot_of_its_placement(placement: str) -> None:
    run = placed_id(placement, "4f2a9c1e7b3d5a6f8e0c2b1d")
    assert run == "{" + placement + "}4f2a9c1e7b3d5a6f8e0c2b1d"
    for slots in (1, 2, 1024, 16384):
        assert slot_of(run, slots) == slot_of(placement, slots) == slot_of(
            "{" + placement + "}pool", slots)
