"""Lease handles are unguessable: knowing or guessing a lease id is no capability.

A client of the same tenant that knows nothing scans every small lease id, each with
random random-parts (and the all-zero one), as renewals, releases and every settlement.
Every attempt is refused exactly like a stale lease (STALE_CLAIM), and nobody's lease is
touched: no expiry moves, no record is written, no push or reply goes to anyone else,
and the owners still renew, release and settle with their own handles.
"""

from __future__ import annotations

import random

from support.core import ALICE, BOB, CoreDriver, handle, lease_id

from rsproto import LEASE_HANDLE_BYTES, ErrorCode, Op

BOX = {"scope": "s", "mailbox": "jobs"}
SCAN = 300  # ids 0..SCAN-1: every lease this test makes has a smaller id


def leases_state(core: CoreDriver) -> list[tuple[bytes, float, float, int]]:
    return sorted(
        (lease.handle, lease.expires_at, lease.length, lease.conn) for lease in core.leases.all()
    )


def guesses(rng: random.Random) -> list[bytes]:
    out = []
    for n in range(SCAN):
        out.append(handle(n, bytes(8)))
        out.append(handle(n, rng.randbytes(8)))
    return out


def test_a_scan_of_lease_ids_is_refused_and_touches_no_lease() -> None:
    core = CoreDriver()
    claims = [core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": f"k{i}"})["lease"]
              for i in range(20)]
    for i in range(5):
        core.call(Op.TASK_SUBMIT, {**BOX, "data": i, "key": f"t{i}"})
    deliveries = [core.call(Op.RECEIVE, BOX)["delivery"]["lease"] for _ in range(5)]
    assert max(lease_id(h) for h in claims + deliveries) < SCAN
    assert all(len(h) == LEASE_HANDLE_BYTES for h in claims + deliveries)
    core.drain()
    core.now = 10.0
    before = leases_state(core)
    records = len(core.records)
    rng = random.Random(5)
    scan = guesses(rng)
    assert not set(scan) & set(claims + deliveries)

    for start in range(0, len(scan), 100):
        batch = scan[start : start + 100]
        got = core.call(Op.LEASE_RENEW, {"leases": batch}, BOB)["results"]
        assert got == ["STALE_CLAIM"] * len(batch)
        got = core.call(Op.LEASE_RENEW, {"leases": [[h, 600] for h in batch]}, BOB)["results"]
        assert got == ["STALE_CLAIM"] * len(batch)
    for guess in scan:
        for op, extra in (
            (Op.CLAIM_RELEASE, {}),
            (Op.DELIVERY_COMPLETE, {"outcome": "forged"}),
            (Op.DELIVERY_RETRY, {}),
            (Op.DELIVERY_RELEASE, {}),
            (Op.DELIVERY_REJECT, {}),
        ):
            error = core.refused(op, {"lease": guess, **extra}, BOB)
            assert error.code == ErrorCode.STALE_CLAIM
            assert guess.hex() in error.message and "is not current" in error.message

    assert leases_state(core) == before, "a guessed handle moved someone's lease"
    assert core.drain() == [], "a guessed handle sent a push or reply to someone"
    assert len(core.records) == records, "a guessed handle wrote a record"
    # The owners are unaffected: their own handles renew, settle and release.
    assert core.call(Op.LEASE_RENEW, {"leases": claims + deliveries})["results"] == [None] * 25
    for lease in deliveries:
        core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": "real"})
    for lease in claims:
        assert core.call(Op.CLAIM_RELEASE, {"lease": lease}) == {}


def test_the_right_id_with_a_wrong_random_part_is_stale_like_an_ended_lease() -> None:
    core = CoreDriver()
    lease = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})["lease"]
    forged = lease[:8] + bytes(b ^ 1 for b in lease[8:])
    ended = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "gone"})["lease"]
    core.call(Op.CLAIM_RELEASE, {"lease": ended})
    assert core.call(Op.LEASE_RENEW, {"leases": [forged, ended, lease]}, BOB)["results"] == [
        "STALE_CLAIM", "STALE_CLAIM", None
    ]
    forged_error = core.refused(Op.CLAIM_RELEASE, {"lease": forged}, BOB)
    ended_error = core.refused(Op.CLAIM_RELEASE, {"lease": ended}, BOB)
    assert forged_error.code == ended_error.code == ErrorCode.STALE_CLAIM
    assert forged_error.message.replace(forged.hex(), "H") == ended_error.message.replace(
        ended.hex(), "H"
    )
    assert core.call(Op.CLAIM_INSPECT, {"scope": "s", "key": "k"})["held"] is True


def test_handles_are_journaled_whole_so_a_replay_accepts_exactly_the_same_ones() -> None:
    core = CoreDriver()
    lease = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})["lease"]
    core.call(Op.TASK_SUBMIT, {**BOX, "data": 1})
    delivery = core.call(Op.RECEIVE, BOX)["delivery"]["lease"]
    core.drain()
    rebuilt = core.replay()
    rebuilt.connected(ALICE, "alice")
    forged = lease[:8] + bytes(8)
    assert rebuilt.call(Op.LEASE_RENEW, {"leases": [lease, delivery, forged]})["results"] == [
        None, None, "STALE_CLAIM"
    ]


def test_two_grants_draw_different_random_parts() -> None:
    core = CoreDriver()
    handles = [core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": f"k{i}"})["lease"]
               for i in range(200)]
    assert len({h[8:] for h in handles}) == 200
    assert [lease_id(h) for h in handles] == sorted(lease_id(h) for h in handles)
