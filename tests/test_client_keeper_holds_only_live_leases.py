"""The lease keeper's memory follows the leases held, not the leases ever acquired: a
client that acquires and releases quickly does not keep each released lease (and its
heap entry) alive until the renewal time it would have had."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable

from rsclient import AsyncRunstate

MakeClient = Callable[..., AsyncRunstate]


async def test_released_leases_do_not_pile_up_in_the_keeper(clients: MakeClient) -> None:
    rs = clients("alice")
    run = await rs.scopes.create()
    kept = await run.claim("kept").acquire()  # one live lease throughout
    released: list[weakref.ref[object]] = []

    async def churn(i: int) -> None:
        claim = run.claim(f"k{i}")
        for _ in range(200):
            lease = await claim.acquire()
            released.append(weakref.ref(lease))
            await lease.release()

    await asyncio.gather(*(churn(i) for i in range(16)))  # 3,200 pairs
    keeper = rs._keeper
    assert len(keeper) == 1
    assert len(keeper._heap) <= 2 * 1 + 1024 + 1, len(keeper._heap)
    gc.collect()
    alive = sum(1 for ref in released if ref() is not None)
    assert alive <= 1024 + 16, f"{alive} released leases still referenced"
    assert not kept.is_lost
    await kept.release()
