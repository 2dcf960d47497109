"""The lease keeper's bookkeeping, without a server: what it does with each renewal
outcome, and that a batch larger than the server's limit is split."""

from __future__ import annotations

import asyncio
from typing import Any

from rsclient.keeper import LeaseKeeper
from rsclient.leases import Lease


class FakeConnection:
    """Records LEASE_RENEW requests; answers each lease with ``outcome``."""

    def __init__(self, outcome: str | None = None, batch_limit: int = 10_000) -> None:
        self.outcome = outcome
        self.server_info: dict[str, Any] = {"limits": {"max_renew_batch": batch_limit}}
        self.requests: list[list[int]] = []

    def on_push(self, event: int, handler: Any) -> None:
        pass

    async def request(self, op: int, args: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(args["leases"])
        return {"results": [self.outcome] * len(args["leases"])}


def lease(keeper: LeaseKeeper, lease_id: int, seconds: float = 30.0) -> Lease:
    now = asyncio.get_running_loop().time()
    made = Lease(keeper, lease_id, scope="s", key=f"k{lease_id}", generation=1,
                 lease_seconds=seconds, confirmed_at=now)
    keeper.track(made)
    return made


async def test_an_unknown_renewal_outcome_is_retried_not_forgotten() -> None:
    keeper = LeaseKeeper(FakeConnection())  # type: ignore[arg-type]
    held = lease(keeper, 1)
    sent_at = asyncio.get_running_loop().time()
    keeper._settle([held], {"results": ["SOMETHING_NEW"]}, sent_at, None)
    assert not held.is_lost
    assert held.renew_at <= sent_at + 0.25  # tried again soon, not left without a timer
    keeper.close()


async def test_stale_claim_marks_the_lease_lost() -> None:
    keeper = LeaseKeeper(FakeConnection())  # type: ignore[arg-type]
    held = lease(keeper, 1)
    keeper._settle([held], {"results": ["STALE_CLAIM"]}, 0.0, None)
    assert held.is_lost
    assert len(keeper) == 0


async def test_a_renewal_round_is_split_at_the_servers_batch_limit() -> None:
    conn = FakeConnection(batch_limit=3)
    keeper = LeaseKeeper(conn)  # type: ignore[arg-type]
    leases = [lease(keeper, i) for i in range(1, 8)]
    await keeper._renew_batch(leases, asyncio.get_running_loop().time())
    assert sorted(len(ids) for ids in conn.requests) == [1, 3, 3]
    assert sorted(i for ids in conn.requests for i in ids) == list(range(1, 8))
    keeper.close()
