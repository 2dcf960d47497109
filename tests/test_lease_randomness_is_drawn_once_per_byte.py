"""Lease handles' random part comes from the kernel's CSPRNG through a pool that draws a
block at a time (rsd/randomness.py): each byte is handed out once, and a request larger
than a block is drawn on its own."""

from __future__ import annotations

import os

import pytest

from rsd.randomness import RandomPool


def test_each_drawn_byte_is_handed_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks: list[bytes] = []

    def urandom(n: int) -> bytes:
        block = bytes((len(blocks) * 64 + i) % 256 for i in range(n))
        blocks.append(block)
        return block

    monkeypatch.setattr(os, "urandom", urandom)
    pool = RandomPool(block=64)
    got = [pool(8) for _ in range(20)]  # 160 bytes: three blocks, the last half used
    assert all(len(part) == 8 for part in got)
    assert len(blocks) == 3
    assert b"".join(got) == (blocks[0] + blocks[1] + blocks[2])[:160]
    big = pool(100)  # over a block: drawn on its own, the pool's rest kept
    assert len(big) == 100 and len(blocks) == 4
    assert pool(8) == blocks[2][32:40]


def test_a_block_not_a_multiple_of_the_request_never_hands_out_short_slices() -> None:
    pool = RandomPool(block=20)
    assert {len(pool(8)) for _ in range(100)} == {8}


def test_handles_drawn_from_the_pool_do_not_repeat() -> None:
    pool = RandomPool()
    drawn = [pool(8) for _ in range(5000)]
    assert len(set(drawn)) == len(drawn)
