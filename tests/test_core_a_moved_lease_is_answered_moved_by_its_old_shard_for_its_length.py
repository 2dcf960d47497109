"""A lease that left its shard with its run (a slot move's drop, transfer.py) is answered
MOVED there, not STALE_CLAIM, for one lease length from the drop (rsd/core/ground/
forwarded.py): a renewal item gets the outcome "MOVED" (one lease, a batch, a resize),
a release or settlement naming it is refused MOVED naming its run and changes nothing,
and its SDK takes it to the new shard. The table holds only the leases that moved, and
forgets each on the tick after its length; a handle it never had, or another tenant's,
is still STALE_CLAIM; a restart or a standby that replays the drop knows the same
handles; a lease whose run comes back is live there again, and stale after, never
MOVED."""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CoreDriver, handle
from support.twoshards import move, placed, shard, slot

from rsproto import ErrorCode, Op

RUN = placed("m")
LEASE = 30.0
MOVED, STALE = ErrorCode.MOVED.value, ErrorCode.STALE_CLAIM.value


def renew(core: CoreDriver, *leases: Any, conn: int = ALICE) -> list[str | None]:
    return core.call(Op.LEASE_RENEW, {"leases": list(leases)}, conn)["results"]


def moved_away(tenants: dict[int, tuple[str, bool]] | None = None) -> tuple[
        CoreDriver, CoreDriver, dict[str, Any]]:
    """Shard A with RUN holding a claim and a delivery (and a claim of run "s", which
    stays), moved to shard B; what was granted."""
    a = shard("a", 1, tenants=tenants)
    b = shard("b", 2, tenants=tenants)
    a.create_runs(RUN)
    got = {
        "claim": a.call(Op.CLAIM_ACQUIRE, {"scope": RUN, "key": "k", "lease_seconds": LEASE}),
        "stays": a.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": LEASE}),
    }
    a.call(Op.TASK_SUBMIT, {"scope": RUN, "mailbox": "jobs", "key": "t", "data": 1})
    got["delivery"] = a.call(Op.RECEIVE, {"scope": RUN, "mailbox": "jobs",
                                          "lease_seconds": LEASE})["delivery"]
    a.advance(5.0)
    move(a, b, slot(RUN))
    a.drop_slots(a.now, slot(RUN), slot(RUN))
    a.drain()
    return a, b, got


@pytest.fixture
def moved() -> tuple[CoreDriver, CoreDriver, dict[str, Any]]:
    return moved_away()


def test_a_renewal_of_a_moved_lease_is_moved_and_one_of_a_stale_one_still_stale(
    moved: Any,
) -> None:
    a, _, got = moved
    claim, delivery, stays = got["claim"]["lease"], got["delivery"]["lease"], got["stays"]
    never = handle(999)
    assert renew(a, claim) == [MOVED]  # one lease: the fast path's miss
    assert renew(a, never) == [STALE]
    assert renew(a, stays["lease"], claim, never, delivery) == [None, MOVED, STALE, MOVED]
    assert renew(a, [claim, 60], [never, None]) == [MOVED, STALE]  # the checked path
    assert not a.drain()  # nothing recorded, nobody told


def test_an_op_naming_a_moved_lease_is_refused_moved_naming_its_run_and_not_run(
    moved: Any,
) -> None:
    a, b, got = moved
    claim, delivery = got["claim"]["lease"], got["delivery"]["lease"]
    for op, args in [
        (Op.CLAIM_RELEASE, {"lease": claim}),
        (Op.DELIVERY_COMPLETE, {"lease": delivery, "outcome": "here"}),
        (Op.DELIVERY_RETRY, {"lease": delivery}),
        (Op.DELIVERY_RELEASE, {"lease": delivery}),
        (Op.DELIVERY_REJECT, {"lease": delivery, "reason": "no"}),
        (Op.POOL_RELEASE, {"lease": claim}),
    ]:
        refusal = a.refused(op, args)
        assert refusal.code == ErrorCode.MOVED, op
        assert refusal.details == {"scope": RUN}
    assert a.refused(Op.CLAIM_RELEASE, {"lease": handle(999)}).code == ErrorCode.STALE_CLAIM
    assert not a.drain()
    # on the new shard both work as before the move
    assert renew(b, claim, delivery) == [None, None]
    b.call(Op.DELIVERY_COMPLETE, {"lease": delivery, "outcome": "there"})
    b.call(Op.CLAIM_RELEASE, {"lease": claim})


def test_another_tenants_connection_gets_stale_claim_for_a_moved_lease() -> None:
    a, _, got = moved_away({BOB: ("other", True)})
    claim = got["claim"]["lease"]
    assert renew(a, claim, conn=BOB) == [STALE]
    assert a.refused(Op.CLAIM_RELEASE, {"lease": claim}, BOB).code == ErrorCode.STALE_CLAIM


def test_the_table_holds_the_moved_leases_for_their_length_then_forgets_them(
    moved: Any,
) -> None:
    a, _, got = moved
    claim = got["claim"]["lease"]
    assert len(a.tables.forwarded) == 2  # the claim and the delivery, not run "s"'s claim
    a.advance(LEASE - 0.5)
    assert renew(a, claim) == [MOVED]
    a.advance(1.0)  # one lease length since the drop: forgotten on the tick
    assert len(a.tables.forwarded) == 0
    assert renew(a, claim) == [STALE]


def test_a_replay_of_the_drop_knows_the_same_moved_leases(moved: Any) -> None:
    a, _, got = moved
    rebuilt = a.replay(now=a.now + 3.0)  # a restart, or a standby that takes over
    rebuilt.connected(ALICE, "alice")
    claim, delivery = got["claim"]["lease"], got["delivery"]["lease"]
    assert renew(rebuilt, claim, delivery) == [MOVED, MOVED]
    assert rebuilt.refused(Op.DELIVERY_COMPLETE, {"lease": delivery}).code == ErrorCode.MOVED
    rebuilt.now = a.now + 3.0
    rebuilt.advance(LEASE)  # a lease length from the replay, as every replayed lease
    assert renew(rebuilt, claim) == [STALE]


def test_a_lease_whose_run_comes_back_is_live_again_and_stale_after(moved: Any) -> None:
    a, b, got = moved
    claim = got["claim"]["lease"]
    b.advance(1.0)
    move(b, a, slot(RUN))  # the run comes back with its claim
    assert renew(a, claim) == [None]
    a.call(Op.CLAIM_RELEASE, {"lease": claim})
    assert renew(a, claim) == [STALE]
