"""A held claim costs one object and a few shared pointers (issue 12: 1M held claims in
at most 400 MB of server memory), and no request pattern makes the wheel keep what
ended leases left behind.
"""

from __future__ import annotations

import gc
import tracemalloc

import msgpack
import pytest
from support.build import compiled
from support.core import ALICE, BOB, CoreDriver, handle, wheel_but_quiet_runs

from rsd.core import Rec
from rsd.core.run import claim as claim_module
from rsd.core.run.claim import Claim
from rsproto import ErrorCode, Op

# Bytes one held claim adds to the core, as tracemalloc counts them: the claim (its own
# lease), its entries in the run's claims, the lease table and the run's paged index,
# its wheel row slot, its 16-byte handle, and its key's string ("key-00000000"): 245
# measured for 20,000 claims. Was ~360 with a Claim and a Lease apart, a wheel bucket
# entry, and an expiry float and a length object per lease.
MAX_BYTES_PER_HELD_CLAIM = 300


def acquire(core: CoreDriver, key: str, conn: int = ALICE, **more: object) -> dict:
    return core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": key, **more}, conn)


def test_a_held_claim_is_its_own_lease_and_each_grant_gets_a_new_handle() -> None:
    core = CoreDriver()
    first = acquire(core, "k")["lease"]
    claim = core.scopes[("default", "s")].claims["k"]
    assert type(claim) is Claim and core.leases.get(first) is claim
    assert claim.lease is claim and claim.owner is claim
    acquire(core, "k", BOB, wait=True)
    core.call(Op.CLAIM_RELEASE, {"lease": first})  # bob, waiting, is granted at once
    assert core.scopes[("default", "s")].claims["k"] is claim and claim.holder == "bob"
    assert core.leases.get(first) is None  # the earlier grant's handle finds nothing
    assert claim.handle != first and core.leases.get(claim.handle) is claim
    stale = ErrorCode.STALE_CLAIM.value
    assert core.call(Op.LEASE_RENEW, {"leases": [first]})["results"] == [stale]
    assert core.refused(Op.CLAIM_RELEASE, {"lease": first}).code == ErrorCode.STALE_CLAIM
    assert core.call(Op.LEASE_RENEW, {"leases": [claim.handle]}, BOB)["results"] == [None]


@pytest.mark.at_scale
def test_held_claims_cost_at_most_their_byte_budget() -> None:
    core = CoreDriver()
    acquire(core, "warm-up", lease_seconds=600)
    core.drain()
    core.records.clear()
    count = 20_000
    # As the server gets them: decoded from msgpack, so nothing is shared by accident.
    requests = [
        msgpack.unpackb(msgpack.packb({"scope": "s", "key": f"key-{n:08d}", "lease_seconds": 600}))
        for n in range(count)
    ]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n, args in enumerate(requests):
            core.handle(core.now, ALICE, 10 + n, Op.CLAIM_ACQUIRE, args)
            if n % 128 == 127:  # a batch: the shell sends its records and replies away
                core.drain()
                core.records.clear()
                core.now += 0.001
        core.drain()
        core.records.clear()
        del requests  # the keys stay, in the claims
        gc.collect()
        per_claim = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    assert core.stats()["claims"] == count + 1
    assert per_claim <= MAX_BYTES_PER_HELD_CLAIM, per_claim


@pytest.mark.skipif(
    compiled(claim_module), reason="compiled, a claim stores its floats unboxed: no object"
)
def test_leases_share_their_length_and_a_batch_shares_its_instant() -> None:
    core = CoreDriver()
    for n in range(100):
        acquire(core, f"k{n}", lease_seconds=float(msgpack.unpackb(msgpack.packb(30.0))))
    claims = list(core.scopes[("default", "s")].claims.values())
    assert len({id(claim.length) for claim in claims}) == 1
    now = core.now + 1.0
    core.handle(now, ALICE, 5, Op.LEASE_RENEW, {"leases": [c.handle for c in claims]})
    assert all(claim.renewed_at is now for claim in claims)  # nothing allocated per lease


def test_a_thousand_distinct_lengths_keep_a_bounded_table_of_shared_ones() -> None:
    core = CoreDriver()
    for n in range(1000):
        acquire(core, f"k{n}", lease_seconds=5 + n / 10)
    assert len(core.leases._lengths) <= 64
    assert [c.length for c in core.scopes[("default", "s")].claims.values()] == [
        5 + n / 10 for n in range(1000)
    ]


@pytest.mark.at_scale
def test_a_key_released_and_granted_again_50000_times_at_one_instant_keeps_the_wheel_short(
) -> None:
    """Each grant of the same claim object lands in the same wheel row: the entries of
    the grants that ended are rebuilt away, the row stays O(live leases)."""
    core = CoreDriver()
    lease = acquire(core, "k")["lease"]
    for n in range(50_000):
        acquire(core, "k", BOB, wait=True)
        core.call(Op.CLAIM_RELEASE, {"lease": lease})
        lease = core.scopes[("default", "s")].claims["k"].handle
        assert sum(len(row) for row in core.wheel._rows.values()) <= 2 + 16 + 1, n
        core.drain()
        core.records.clear()
    assert wheel_but_quiet_runs(core) == 1
    core.advance(31.0)  # its one entry fires once: the key expires and is freed
    assert core.stats()["claims"] == 0 and wheel_but_quiet_runs(core) == 0


def test_a_grant_replayed_over_a_live_one_ends_it_and_keeps_generations_above_it() -> None:
    """No journal is written so, but a claim is one object: a second grant of a held key
    replaces the first one's handle (the first finds nothing) and the floor keeps the
    first's generation."""
    core = CoreDriver(mailbox=None)
    core.apply((Rec.CLAIM_GRANTED, "s", "k", handle(7), 3, "alice", 30, "default"), 10.0)
    core.apply((Rec.CLAIM_GRANTED, "s", "k", handle(8), 4, "bob", 30, "default"), 10.0)
    claim = core.scopes[("default", "s")].claims["k"]
    assert core.leases.get(handle(7)) is None and core.leases.get(handle(8)) is claim
    assert (claim.holder, claim.generation, core.ids.generation_floor) == ("bob", 4, 3)
    assert core.scopes[("default", "s")].held_claims == 1 and wheel_but_quiet_runs(core) == 1
    core.tick(40.0 + 0.01)  # one entry: expires once, the key is freed
    assert core.stats()["claims"] == 0 and wheel_but_quiet_runs(core) == 0
