"""Claims in the pure core, driven by a fake clock: ``now`` is a float we pass in.

The core is a ``CoreDriver`` (support/core.py): connections 1..4 said HELLO as alice,
bob, carol and dave; the core's wall clock is ``now + WALL``. Every test starts from a
fresh core; nothing sleeps.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from support.core import ALICE, BOB, CAROL, DAVE, WALL, CoreDriver, call, handle, lease_id

from rsd.core import DEFERRED, Core, CoreError, Rec
from rsproto import LEASE_HANDLE_BYTES, ErrorCode, Kind, Limits, Op, Push

H7 = handle(7)  # a lease handle for records made by hand
TICK = 0.005  # the Core's wheel tick; checked by test_core_wheel_tick_is_what_tests_assume
_rids = itertools.count(1000)


@pytest.fixture
def core() -> CoreDriver:
    return CoreDriver(mailbox=None)


def acquire(
    core: Core,
    now: float,
    conn: int = ALICE,
    key: str = "k",
    scope: str = "s",
    rid: int | None = None,
    **extra: Any,
) -> Any:
    rid = next(_rids) if rid is None else rid
    return core.handle(now, conn, rid, Op.CLAIM_ACQUIRE, {"scope": scope, "key": key, **extra})


def release(core: Core, now: float, lease: int, conn: int = ALICE) -> Any:
    return core.handle(now, conn, next(_rids), Op.CLAIM_RELEASE, {"lease": lease})


def renew(core: Core, now: float, leases: list[Any], conn: int = ALICE) -> list[Any]:
    return core.handle(now, conn, next(_rids), Op.LEASE_RENEW, {"leases": leases})["results"]


def inspect(core: Core, key: str = "k", scope: str = "s") -> dict[str, Any]:
    return core.handle(0.0, ALICE, next(_rids), Op.CLAIM_INSPECT, {"scope": scope, "key": key})


def cancel(core: Core, conn: int, request: int) -> Any:
    return core.handle(0.0, conn, next(_rids), Op.CANCEL, {"request": request})


def held_by(core: Core, key: str = "k", scope: str = "s") -> str | None:
    return inspect(core, key, scope)["holder"]


def grant_reply(
    conn: int, rid: int, lease: int, generation: int, seconds: float = 30, waited: float = 0.0
):
    body = {
        "lease": lease,
        "generation": generation,
        "lease_seconds": seconds,
        "waited_ms": int(waited * 1000),
    }
    return (conn, [Kind.REPLY, rid, body])


def test_core_wheel_tick_is_what_tests_assume(core: Core) -> None:
    assert core.wheel.tick == TICK


# ---- grant -----------------------------------------------------------------------------


def test_acquire_of_a_free_key_grants_lease_generation_one_and_default_length(
    core: Core,
) -> None:
    reply = acquire(core, 0.0)
    assert set(reply) == {"lease", "generation", "lease_seconds", "waited_ms"}
    assert reply["waited_ms"] == 0
    assert type(reply["lease"]) is bytes and len(reply["lease"]) == LEASE_HANDLE_BYTES
    assert reply["generation"] == 1
    assert reply["lease_seconds"] == Limits.DEFAULT_LEASE_SECONDS


def test_acquire_grants_the_requested_lease_seconds(core: Core) -> None:
    assert acquire(core, 0.0, lease_seconds=12.5)["lease_seconds"] == 12.5


def test_grant_holder_is_the_name_from_the_connections_hello(core: Core) -> None:
    acquire(core, 0.0, conn=BOB)
    assert inspect(core) == {"held": True, "generation": 1, "holder": "bob", "waiters": 0}


def test_grant_sends_no_other_messages(core: Core) -> None:
    acquire(core, 0.0)
    assert core.effects.take_messages() == []


def test_second_acquire_without_wait_is_claim_held_with_holder_and_generation(
    core: Core,
) -> None:
    acquire(core, 0.0, conn=ALICE)
    with pytest.raises(CoreError) as info:
        acquire(core, 1.0, conn=BOB)
    assert info.value.code == ErrorCode.CLAIM_HELD
    assert info.value.details == {"holder": "alice", "generation": 1}


def test_second_acquire_by_the_same_holder_is_also_claim_held(core: Core) -> None:
    acquire(core, 0.0)
    with pytest.raises(CoreError) as info:
        acquire(core, 1.0)
    assert info.value.code == ErrorCode.CLAIM_HELD


def test_claim_held_refusal_writes_no_record_and_keeps_the_holder(core: Core) -> None:
    acquire(core, 0.0)
    core.drain()
    with pytest.raises(CoreError):
        acquire(core, 1.0, conn=BOB)
    assert core.effects.take_records() == []
    assert held_by(core) == "alice"


# ---- generation ------------------------------------------------------------------------


def test_generation_grows_by_one_per_new_owner_across_releases(core: Core) -> None:
    generations = []
    for conn in (ALICE, BOB, CAROL, ALICE):
        reply = acquire(core, 0.0, conn=conn)
        generations.append(reply["generation"])
        release(core, 0.0, reply["lease"], conn=conn)
    assert generations == [1, 2, 3, 4]


def test_generation_grows_after_expiry(core: Core) -> None:
    acquire(core, 0.0, lease_seconds=5)
    core.tick(5.0 + TICK)
    assert acquire(core, 6.0, conn=BOB)["generation"] == 2


def test_released_key_keeps_its_generation(core: Core) -> None:
    for _ in range(3):
        release(core, 0.0, acquire(core, 0.0)["lease"])
    assert inspect(core) == {"held": False, "generation": 3, "holder": None, "waiters": 0}


def test_a_key_never_granted_starts_above_every_generation_that_ended(core: Core) -> None:
    """Released keys are freed, so a key the server does not hold is not told from one
    it never saw: both start above every generation that ended (the floor). Holding one
    key never blocks another."""
    release(core, 0.0, acquire(core, 0.0, key="a")["lease"])
    assert acquire(core, 0.0, key="a")["generation"] == 2
    assert acquire(core, 0.0, key="b")["generation"] > 1
    assert inspect(core, key="a")["held"] and inspect(core, key="b")["held"]


# ---- fencing token (lease id) ----------------------------------------------------------


def test_lease_ids_are_unique_across_keys_scopes_and_grants(core: Core) -> None:
    ids = []
    core.create_runs("s1", "s2")
    for scope in ("s1", "s2"):
        for key in ("a", "b"):
            for _ in range(3):
                lease = acquire(core, 0.0, scope=scope, key=key)["lease"]
                ids.append(lease)
                release(core, 0.0, lease)
    assert len(set(ids)) == len(ids) == 12


def test_lease_ids_only_grow(core: Core) -> None:
    ids = [acquire(core, 0.0, key=f"k{i}")["lease"] for i in range(5)]
    assert ids == sorted(ids)


def test_lease_id_of_an_expired_lease_is_not_reused(core: Core) -> None:
    first = acquire(core, 0.0, lease_seconds=5)["lease"]
    core.tick(10.0)
    assert acquire(core, 10.0)["lease"] != first


# ---- renew -----------------------------------------------------------------------------


def test_renew_of_live_leases_returns_none_in_each_slot(core: Core) -> None:
    a = acquire(core, 0.0, key="a")["lease"]
    b = acquire(core, 0.0, key="b")["lease"]
    assert renew(core, 1.0, [a, [b, 60]]) == [None, None]


def test_renewed_lease_survives_past_its_original_deadline(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=10)["lease"]
    renew(core, 8.0, [lease])
    core.tick(10.0 + TICK)
    core.tick(17.9)
    assert held_by(core) == "alice"


def test_renewed_lease_expires_one_length_after_the_renewal(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=10)["lease"]
    renew(core, 8.0, [lease])
    core.tick(10.0 + TICK)  # the original wheel entry fires and is re-armed
    core.tick(18.0 + TICK)
    assert held_by(core) is None


def test_renew_with_seconds_sets_the_new_length(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=10)["lease"]
    renew(core, 1.0, [[lease, 60]])
    core.tick(60.9)
    assert held_by(core) == "alice"
    core.tick(61.0 + TICK)
    assert held_by(core) is None


def test_renew_with_shorter_seconds_expires_sooner(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=600)["lease"]
    renew(core, 1.0, [[lease, 5]])
    core.tick(6.0 + TICK)
    assert held_by(core) is None


def test_later_plain_renewals_keep_the_changed_length(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=10)["lease"]
    renew(core, 1.0, [[lease, 60]])
    renew(core, 2.0, [lease])
    core.tick(61.9)
    assert held_by(core) == "alice"


def test_renew_of_unknown_or_ended_lease_gets_stale_claim_in_its_slot(core: Core) -> None:
    live = acquire(core, 0.0, key="a")["lease"]
    ended = acquire(core, 0.0, key="b")["lease"]
    release(core, 0.0, ended)
    assert renew(core, 1.0, [ended, live, handle(987654), [ended, 30]]) == [
        "STALE_CLAIM",
        None,
        "STALE_CLAIM",
        "STALE_CLAIM",
    ]


def test_renew_of_an_expired_lease_is_stale_and_does_not_revive_it(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=5)["lease"]
    core.tick(5.0 + TICK)
    assert renew(core, 6.0, [lease]) == ["STALE_CLAIM"]
    assert held_by(core) is None


def test_renew_of_an_empty_batch_returns_no_results(core: Core) -> None:
    assert renew(core, 0.0, []) == []


def test_malformed_item_refuses_the_whole_renew_batch(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=10)["lease"]
    with pytest.raises(CoreError) as info:
        renew(core, 8.0, [lease, "oops"])
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_refused_renew_batch_renews_nothing_and_records_nothing(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=10)["lease"]
    core.drain()
    with pytest.raises(CoreError):
        renew(core, 8.0, [[lease, 60], [lease, 4]])
    assert core.effects.take_records() == []
    core.tick(10.0 + TICK)
    assert held_by(core) is None  # neither renewed nor resized


def test_renew_that_changes_the_length_records_lease_resized(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=10)["lease"]
    core.drain()
    renew(core, 1.0, [[lease, 60]])
    assert core.effects.take_records() == [(Rec.LEASE_RESIZED, lease, 60)]


def test_renew_that_keeps_the_length_records_nothing(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=10)["lease"]
    core.drain()
    renew(core, 1.0, [lease, [lease, 10], [lease, None]])
    assert core.effects.take_records() == []


def test_lease_lost_goes_to_the_connection_that_last_renewed(core: Core) -> None:
    lease = acquire(core, 0.0, conn=ALICE, lease_seconds=5)["lease"]
    renew(core, 1.0, [lease], conn=DAVE)  # alice reconnected as connection 4
    core.tick(6.0 + TICK)
    assert core.effects.take_messages() == [
        (DAVE, [Kind.PUSH, Push.LEASE_LOST, {"lease": lease, "reason": "expired"}]),
    ]


def test_a_lease_resized_shorter_then_longer_expires_neither_early_nor_late() -> None:
    core = CoreDriver(recovered=True)
    grant = call(core, 0.0, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": 600})
    lease = grant["lease"]
    call(core, 1.0, Op.LEASE_RENEW, {"leases": [[lease, 5]]})  # due at 6
    call(core, 2.0, Op.LEASE_RENEW, {"leases": [[lease, 600]]})  # due at 602
    for now in (6.0, 600.0, 601.9):
        core.tick(now)
        assert core.leases.get(lease) is not None, f"expired early at {now}"
    core.tick(602.01)
    assert core.leases.get(lease) is None, "expiry lost"
    pushes = [m for _, m in core.drain() if m[0] == Kind.PUSH]
    assert pushes == [[Kind.PUSH, 1, {"lease": lease, "reason": "expired"}]]


# ---- release ---------------------------------------------------------------------------


def test_release_with_the_current_token_frees_the_key(core: Core) -> None:
    lease = acquire(core, 0.0)["lease"]
    assert release(core, 1.0, lease) == {}
    assert inspect(core)["held"] is False


def test_released_key_can_be_acquired_by_someone_else(core: Core) -> None:
    release(core, 1.0, acquire(core, 0.0)["lease"])
    assert acquire(core, 2.0, conn=BOB)["generation"] == 2


def test_release_twice_is_stale_claim(core: Core) -> None:
    lease = acquire(core, 0.0)["lease"]
    release(core, 1.0, lease)
    with pytest.raises(CoreError) as info:
        release(core, 2.0, lease)
    assert info.value.code == ErrorCode.STALE_CLAIM


def test_release_with_a_previous_owners_token_is_stale_and_keeps_the_new_owner(
    core: Core,
) -> None:
    old = acquire(core, 0.0, conn=ALICE)["lease"]
    release(core, 1.0, old)
    acquire(core, 2.0, conn=BOB)
    with pytest.raises(CoreError) as info:
        release(core, 3.0, old, conn=ALICE)
    assert info.value.code == ErrorCode.STALE_CLAIM
    assert held_by(core) == "bob"


def test_release_of_a_never_issued_lease_is_stale_claim(core: Core) -> None:
    with pytest.raises(CoreError) as info:
        release(core, 0.0, handle(424242))
    assert info.value.code == ErrorCode.STALE_CLAIM


def test_release_of_an_expired_lease_is_stale_claim(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=5)["lease"]
    core.tick(5.0 + TICK)
    with pytest.raises(CoreError) as info:
        release(core, 6.0, lease)
    assert info.value.code == ErrorCode.STALE_CLAIM


def test_release_sends_no_push_to_the_releasing_holder(core: Core) -> None:
    release(core, 1.0, acquire(core, 0.0)["lease"])
    assert core.effects.take_messages() == []


# ---- expiry ----------------------------------------------------------------------------


def test_next_deadline_is_the_lease_end_rounded_up_to_a_tick(core: Core) -> None:
    acquire(core, 100.0, lease_seconds=10)
    deadline = core.next_deadline()
    assert deadline is not None
    assert 110.0 <= deadline < 110.0 + TICK


def test_lease_is_still_held_just_before_its_end(core: Core) -> None:
    acquire(core, 100.0, lease_seconds=10)
    core.tick(110.0 - 0.01)
    assert held_by(core) == "alice"
    assert core.effects.take_messages() == []


def test_lease_is_gone_one_tick_after_its_end(core: Core) -> None:
    acquire(core, 100.0, lease_seconds=10)
    core.tick(110.0 + TICK)
    assert inspect(core)["held"] is False


def test_lease_ends_when_ticked_at_next_deadline(core: Core) -> None:
    acquire(core, 100.0, lease_seconds=10)
    deadline = core.next_deadline()
    assert deadline is not None
    core.tick(deadline)
    assert inspect(core)["held"] is False


def test_expiry_pushes_lease_lost_to_the_holders_connection(core: Core) -> None:
    lease = acquire(core, 0.0, conn=BOB, lease_seconds=5)["lease"]
    core.tick(5.0 + TICK)
    assert core.effects.take_messages() == [
        (BOB, [Kind.PUSH, Push.LEASE_LOST, {"lease": lease, "reason": "expired"}]),
    ]


def test_expiry_happens_once(core: Core) -> None:
    acquire(core, 0.0, lease_seconds=5)
    core.tick(5.0 + TICK)
    core.drain()
    core.tick(100.0)
    assert (core.effects.take_messages(), core.effects.take_records()) == ([], [])


def test_released_lease_does_not_expire_later(core: Core) -> None:
    release(core, 1.0, acquire(core, 0.0, lease_seconds=5)["lease"])
    core.drain()
    core.tick(100.0)
    assert core.effects.take_messages() == []


def test_new_owner_is_not_expired_by_the_previous_owners_deadline(core: Core) -> None:
    release(core, 1.0, acquire(core, 0.0, lease_seconds=5)["lease"])
    acquire(core, 2.0, conn=BOB, lease_seconds=30)
    core.tick(5.0 + TICK)
    assert held_by(core) == "bob"


def test_tick_with_nothing_due_does_nothing(core: Core) -> None:
    acquire(core, 0.0)
    core.drain()
    core.tick(1.0)
    assert (core.effects.take_messages(), core.effects.take_records()) == ([], [])


def test_lease_handed_back_a_hair_early_still_expires_later(core: Core) -> None:
    # 11.745000000000001 + 30 == 41.745000000000005, whose tick rounds to 41.745.
    acquire(core, 11.745000000000001, lease_seconds=30)
    deadline = core.next_deadline()
    assert deadline is not None
    core.tick(deadline)
    core.tick(42.0)
    assert inspect(core)["held"] is False


# ---- waiters ---------------------------------------------------------------------------


def test_acquire_with_wait_on_a_held_key_is_deferred_and_queued(core: Core) -> None:
    acquire(core, 0.0, conn=ALICE)
    assert acquire(core, 1.0, conn=BOB, wait=True) is DEFERRED
    assert inspect(core)["waiters"] == 1
    assert core.effects.take_messages() == []


def test_acquire_with_wait_on_a_free_key_grants_at_once(core: Core) -> None:
    assert acquire(core, 0.0, wait=True, timeout_ms=1000)["generation"] == 1


def test_waiter_is_granted_on_release_by_a_deferred_reply(core: Core) -> None:
    lease = acquire(core, 0.0, conn=ALICE)["lease"]
    acquire(core, 1.0, conn=BOB, rid=10, wait=True)
    release(core, 2.0, lease)
    [(conn, message)] = core.effects.take_messages()
    assert conn == BOB
    assert message[:2] == [Kind.REPLY, 10]
    assert message[2]["generation"] == 2
    assert held_by(core) == "bob"


def test_waiters_are_granted_in_fifo_order_each_when_the_previous_lease_ends(
    core: Core,
) -> None:
    first = acquire(core, 0.0, conn=ALICE)["lease"]
    acquire(core, 1.0, conn=BOB, rid=10, wait=True, timeout_ms=600_000)
    acquire(core, 2.0, conn=CAROL, rid=11, wait=True, timeout_ms=600_000, lease_seconds=5)
    acquire(core, 3.0, conn=DAVE, rid=12, wait=True, timeout_ms=600_000)

    release(core, 4.0, first)
    [bob_grant] = core.effects.take_messages()
    bob_lease = bob_grant[1][2]["lease"]
    assert bob_grant == grant_reply(BOB, 10, bob_lease, 2, waited=4.0 - 1.0)
    assert inspect(core)["waiters"] == 2

    release(core, 5.0, bob_lease, conn=BOB)
    [carol_grant] = core.effects.take_messages()
    carol_lease = carol_grant[1][2]["lease"]
    assert carol_grant == grant_reply(CAROL, 11, carol_lease, 3, seconds=5, waited=5.0 - 2.0)

    core.tick(10.0 + TICK)  # carol's 5 s lease expires
    lost, dave_grant = core.effects.take_messages()
    assert lost == (
        CAROL,
        [Kind.PUSH, Push.LEASE_LOST, {"lease": carol_lease, "reason": "expired"}],
    )
    dave_lease = dave_grant[1][2]["lease"]
    assert dave_grant == grant_reply(DAVE, 12, dave_lease, 4, waited=10.0 + TICK - 3.0)
    assert inspect(core) == {"held": True, "generation": 4, "holder": "dave", "waiters": 0}


def test_waiter_grant_records_the_end_then_the_new_grant(core: Core) -> None:
    lease = acquire(core, 0.0, conn=ALICE)["lease"]
    acquire(core, 1.0, conn=BOB, rid=10, wait=True, lease_seconds=45)
    core.drain()
    release(core, 2.0, lease)
    [(_, [_, _, grant])] = core.effects.take_messages()
    assert core.effects.take_records() == [
        (Rec.LEASE_ENDED, lease, "released"),
        (Rec.CLAIM_GRANTED, "s", "k", grant["lease"], 2, "bob", 45, "default", False),
    ]


def test_waiter_times_out_no_earlier_than_its_deadline(core: Core) -> None:
    acquire(core, 0.0, conn=ALICE)
    acquire(core, 1.0, conn=BOB, rid=10, wait=True, timeout_ms=2000)
    core.tick(3.0 - 0.001)
    assert core.effects.take_messages() == []
    assert inspect(core)["waiters"] == 1


def test_waiter_gets_wait_timeout_within_a_tick_of_its_deadline(core: Core) -> None:
    acquire(core, 0.0, conn=ALICE)
    acquire(core, 1.0, conn=BOB, rid=10, wait=True, timeout_ms=2000)
    core.tick(3.0 + TICK)
    [(conn, message)] = core.effects.take_messages()
    assert conn == BOB
    assert message[:3] == [Kind.ERROR, 10, "WAIT_TIMEOUT"]
    assert inspect(core)["waiters"] == 0


def test_timed_out_waiter_is_not_granted_later(core: Core) -> None:
    lease = acquire(core, 0.0, conn=ALICE)["lease"]
    acquire(core, 1.0, conn=BOB, rid=10, wait=True, timeout_ms=2000)
    core.tick(3.0 + TICK)
    core.drain()
    release(core, 4.0, lease)
    assert core.effects.take_messages() == []
    assert inspect(core)["held"] is False


def test_granted_waiter_gets_no_timeout_error_later(core: Core) -> None:
    lease = acquire(core, 0.0, conn=ALICE)["lease"]
    acquire(core, 1.0, conn=BOB, rid=10, wait=True, timeout_ms=2000)
    release(core, 2.0, lease)
    core.drain()
    core.tick(3.0 + TICK)
    assert core.effects.take_messages() == []


def test_wait_with_timeout_zero_on_a_held_key_is_wait_timeout_at_once(core: Core) -> None:
    acquire(core, 0.0, conn=ALICE)
    with pytest.raises(CoreError) as info:
        acquire(core, 1.0, conn=BOB, wait=True, timeout_ms=0)
    assert info.value.code == ErrorCode.WAIT_TIMEOUT
    assert inspect(core)["waiters"] == 0


def test_cancel_of_a_pending_wait_replies_true_and_errors_the_wait(core: Core) -> None:
    acquire(core, 0.0, conn=ALICE)
    acquire(core, 1.0, conn=BOB, rid=10, wait=True)
    assert cancel(core, BOB, 10) == {"cancelled": True}
    [(conn, message)] = core.effects.take_messages()
    assert conn == BOB
    assert message[:3] == [Kind.ERROR, 10, "CANCELLED"]


def test_cancelled_waiter_is_out_of_line(core: Core) -> None:
    lease = acquire(core, 0.0, conn=ALICE)["lease"]
    acquire(core, 1.0, conn=BOB, rid=10, wait=True)
    acquire(core, 1.0, conn=CAROL, rid=11, wait=True)
    cancel(core, BOB, 10)
    assert inspect(core)["waiters"] == 1
    core.drain()
    release(core, 2.0, lease)
    [(conn, _)] = core.effects.take_messages()
    assert conn == CAROL


def test_cancel_of_an_unknown_request_replies_false(core: Core) -> None:
    assert cancel(core, BOB, 12345) == {"cancelled": False}
    assert core.effects.take_messages() == []


def test_cancel_only_reaches_the_callers_own_requests(core: Core) -> None:
    acquire(core, 0.0, conn=ALICE)
    acquire(core, 1.0, conn=BOB, rid=10, wait=True)
    assert cancel(core, CAROL, 10) == {"cancelled": False}
    assert inspect(core)["waiters"] == 1


def test_cancel_after_the_grant_replies_false(core: Core) -> None:
    lease = acquire(core, 0.0, conn=ALICE)["lease"]
    acquire(core, 1.0, conn=BOB, rid=10, wait=True)
    release(core, 2.0, lease)
    core.drain()
    assert cancel(core, BOB, 10) == {"cancelled": False}
    assert held_by(core) == "bob"


def test_disconnect_drops_the_connections_waiters(core: Core) -> None:
    lease = acquire(core, 0.0, conn=ALICE)["lease"]
    acquire(core, 1.0, conn=BOB, rid=10, wait=True)
    core.disconnected(BOB)
    assert inspect(core)["waiters"] == 0
    release(core, 2.0, lease)
    assert core.effects.take_messages() == []
    assert inspect(core)["held"] is False


def test_disconnect_drops_only_that_connections_waiters(core: Core) -> None:
    lease = acquire(core, 0.0, conn=ALICE)["lease"]
    acquire(core, 1.0, conn=BOB, rid=10, wait=True)
    acquire(core, 1.0, conn=CAROL, rid=10, wait=True)
    core.disconnected(BOB)
    release(core, 2.0, lease)
    [(conn, _)] = core.effects.take_messages()
    assert conn == CAROL


def test_disconnect_keeps_the_connections_leases(core: Core) -> None:
    lease = acquire(core, 0.0, conn=ALICE)["lease"]
    core.disconnected(ALICE)
    assert held_by(core) == "alice"
    assert renew(core, 1.0, [lease], conn=DAVE) == [None]


def test_disconnected_waiters_time_out_silently(core: Core) -> None:
    acquire(core, 0.0, conn=ALICE)
    acquire(core, 1.0, conn=BOB, rid=10, wait=True, timeout_ms=1000)
    core.disconnected(BOB)
    core.tick(2.0 + TICK)
    assert core.effects.take_messages() == []


def test_same_request_id_cannot_wait_twice_on_one_connection(core: Core) -> None:
    acquire(core, 0.0, conn=ALICE, key="a")
    acquire(core, 0.0, conn=ALICE, key="b")
    acquire(core, 1.0, conn=BOB, key="a", rid=10, wait=True)
    with pytest.raises(CoreError) as info:
        acquire(core, 1.0, conn=BOB, key="b", rid=10, wait=True)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_waiters_beyond_the_per_key_limit_are_resource_exhausted(core: Core) -> None:
    acquire(core, 0.0, conn=ALICE)
    for rid in range(Limits.MAX_WAITERS_PER_KEY):
        acquire(core, 1.0, conn=BOB, rid=rid, wait=True)
    with pytest.raises(CoreError) as info:
        acquire(core, 1.0, conn=CAROL, rid=1, wait=True)
    assert info.value.code == ErrorCode.RESOURCE_EXHAUSTED


# ---- scopes ----------------------------------------------------------------------------


def test_same_key_in_two_scopes_is_granted_in_both(core: CoreDriver) -> None:
    core.create_runs("run-1", "run-2")
    one = acquire(core, 0.0, conn=ALICE, scope="run-1")
    two = acquire(core, 0.0, conn=BOB, scope="run-2")
    assert (one["generation"], two["generation"]) == (1, 1)
    assert (held_by(core, scope="run-1"), held_by(core, scope="run-2")) == ("alice", "bob")


def test_release_in_one_scope_leaves_the_other_scope_held(core: CoreDriver) -> None:
    core.create_runs("run-1", "run-2")
    release(core, 1.0, acquire(core, 0.0, scope="run-1")["lease"])
    acquire(core, 0.0, conn=BOB, scope="run-2")
    assert (inspect(core, scope="run-1")["held"], held_by(core, scope="run-2")) == (False, "bob")


def test_scope_create_returns_fresh_ids_from_the_injected_generator(core: Core) -> None:
    first = core.handle(0.0, ALICE, 1, Op.SCOPE_CREATE, {})
    second = core.handle(0.0, ALICE, 2, Op.SCOPE_CREATE, {})
    assert (first, second) == (
        {"scope": "scope-1", "created": True}, {"scope": "scope-2", "created": True}
    )


def test_scope_create_skips_generated_ids_that_are_already_known() -> None:
    ids = iter(["a", "a", "b"])
    core = CoreDriver(mailbox=None, scope_ids=lambda: next(ids))
    core.handle(0.0, ALICE, 1, Op.SCOPE_CREATE, {})
    assert core.handle(0.0, ALICE, 2, Op.SCOPE_CREATE, {}) == {"scope": "b", "created": True}


def test_scope_create_skips_ids_of_runs_created_with_that_chosen_id(core: CoreDriver) -> None:
    core.create_runs("scope-1")
    assert core.handle(0.0, ALICE, 1, Op.SCOPE_CREATE, {}) == {
        "scope": "scope-2", "created": True,
    }


def test_scope_create_records_scope_created_with_wall_time(core: Core) -> None:
    core.handle(5.0, ALICE, 1, Op.SCOPE_CREATE, {})
    assert core.effects.take_records() == [
        (Rec.SCOPE_CREATED, "scope-1", WALL + 5.0, "default"),
        (Rec.RUN_QUIET, "scope-1", WALL + 5.0, "default"),  # it holds nothing yet
    ]


# ---- inspect ---------------------------------------------------------------------------


def test_inspect_of_an_unknown_key_is_free_generation_zero(core: Core) -> None:
    assert inspect(core) == {"held": False, "generation": 0, "holder": None, "waiters": 0}


def test_inspect_of_a_held_key_shows_holder_generation_and_waiters(core: Core) -> None:
    acquire(core, 0.0, conn=ALICE)
    acquire(core, 0.0, conn=BOB, rid=10, wait=True)
    acquire(core, 0.0, conn=CAROL, rid=11, wait=True)
    assert inspect(core) == {"held": True, "generation": 1, "holder": "alice", "waiters": 2}


def test_inspect_of_a_run_never_created_is_not_found_and_creates_nothing(
    core: CoreDriver,
) -> None:
    err = core.refused(Op.CLAIM_INSPECT, {"scope": "never-used", "key": "k"})
    assert err.code == ErrorCode.NOT_FOUND
    assert ("default", "never-used") not in core.scopes


def test_inspect_writes_no_records(core: Core) -> None:
    acquire(core, 0.0)
    core.drain()
    inspect(core)
    assert core.effects.take_records() == []


# ---- records ---------------------------------------------------------------------------


def test_grant_records_claim_granted_with_everything_needed_to_apply_it(
    core: CoreDriver,
) -> None:
    core.create_runs("run")
    core.drain()
    lease = acquire(core, 0.0, conn=BOB, scope="run", key="job", lease_seconds=20)["lease"]
    assert core.effects.take_records() == [
        (Rec.CLAIM_GRANTED, "run", "job", lease, 1, "bob", 20, "default", False),
    ]


def test_release_records_lease_ended_released(core: Core) -> None:
    lease = acquire(core, 0.0)["lease"]
    core.drain()
    release(core, 1.0, lease)
    assert core.effects.take_records() == [(Rec.LEASE_ENDED, lease, "released")]


def test_expiry_records_lease_ended_expired(core: Core) -> None:
    lease = acquire(core, 0.0, lease_seconds=5)["lease"]
    core.drain()
    core.tick(5.0 + TICK)
    assert core.effects.take_records() == [(Rec.LEASE_ENDED, lease, "expired")]


def test_take_records_and_messages_empty_the_buffers(core: Core) -> None:
    acquire(core, 0.0, lease_seconds=5)
    core.tick(5.0 + TICK)
    core.effects.take_records()
    core.effects.take_messages()
    assert (core.effects.take_records(), core.effects.take_messages()) == ([], [])


def test_waits_and_cancels_write_no_records(core: Core) -> None:
    acquire(core, 0.0, conn=ALICE)
    core.drain()
    acquire(core, 1.0, conn=BOB, rid=10, wait=True)
    cancel(core, BOB, 10)
    assert core.effects.take_records() == []


# ---- replay ----------------------------------------------------------------------------


def build_history() -> tuple[Core, list[tuple[Any, ...]]]:
    """A core that went through every kind of record, and the records it wrote."""
    core = CoreDriver(mailbox=None)
    scope = core.handle(0.0, ALICE, 1, Op.SCOPE_CREATE, {})["scope"]
    core.create_runs("other")
    a = acquire(core, 0.0, conn=ALICE, scope=scope, key="a")["lease"]
    acquire(core, 0.0, conn=BOB, scope=scope, key="b", lease_seconds=60)
    acquire(core, 0.0, conn=CAROL, scope="other", key="a", lease_seconds=5)
    acquire(core, 1.0, conn=DAVE, scope=scope, key="a", rid=10, wait=True)
    release(core, 2.0, a)  # dave gets "a", generation 2
    c = acquire(core, 2.0, conn=CAROL, scope=scope, key="c", lease_seconds=10)["lease"]
    renew(core, 3.0, [[c, 120]], conn=CAROL)  # LEASE_RESIZED
    core.tick(5.0 + TICK)  # "other"/"a" expires
    acquire(core, 6.0, conn=ALICE, scope="other", key="a")  # generation 2
    release(core, 7.0, acquire(core, 7.0, scope=scope, key="gone")["lease"])
    return core, core.effects.take_records()


def claims_state(core: Core) -> dict[tuple[str, str], tuple[Any, ...]]:
    state = {}
    for scope_id, scope in core.scopes.items():
        for key, claim in scope.claims.items():
            lease = claim.lease
            state[scope_id, key] = (
                claim.generation,
                None if lease is None else (lease.id, lease.holder, lease.length),
            )
    return state


def created_scopes(core: Core) -> dict[str, float]:
    return {s.id: s.created_at for s in core.scopes.values() if s.created_at is not None}


def test_history_covers_every_claim_record_kind() -> None:
    _, records = build_history()
    assert {rec[0] for rec in records} == {
        Rec.SCOPE_CREATED,
        Rec.CLAIM_GRANTED,
        Rec.LEASE_ENDED,
        Rec.LEASE_RESIZED,
        Rec.RUN_QUIET,  # a run made holds nothing yet (runends.py)
    }


def test_replaying_records_into_a_fresh_core_rebuilds_the_same_claims() -> None:
    original, records = build_history()
    fresh = CoreDriver(mailbox=None)
    for rec in records:
        fresh.apply(rec, 100.0)
    assert claims_state(fresh) == claims_state(original)


def test_replaying_records_rebuilds_explicitly_created_scopes() -> None:
    original, records = build_history()
    fresh = CoreDriver(mailbox=None)
    for rec in records:
        fresh.apply(rec, 100.0)
    assert created_scopes(fresh) == created_scopes(original)


def test_replaying_all_records_twice_is_harmless() -> None:
    original, records = build_history()
    fresh = CoreDriver(mailbox=None)
    for rec in records + records:
        fresh.apply(rec, 100.0)
    assert claims_state(fresh) == claims_state(original)
    assert len(fresh.leases) == len(original.leases)


def test_replaying_each_record_twice_in_a_row_is_harmless() -> None:
    original, records = build_history()
    fresh = CoreDriver(mailbox=None)
    for rec in records:
        fresh.apply(rec, 100.0)
        fresh.apply(rec, 100.0)
    assert claims_state(fresh) == claims_state(original)


def test_replaying_records_into_the_core_that_wrote_them_changes_nothing() -> None:
    original, records = build_history()
    before = claims_state(original)
    for rec in records:
        original.apply(rec, 100.0)
    assert claims_state(original) == before


def test_replay_writes_no_records_and_sends_no_messages() -> None:
    _, records = build_history()
    fresh = CoreDriver(mailbox=None)
    for rec in records:
        fresh.apply(rec, 100.0)
    assert (fresh.effects.take_records(), fresh.effects.take_messages()) == ([], [])


def test_replayed_core_never_reissues_an_old_lease_id() -> None:
    _, records = build_history()
    fresh = CoreDriver(mailbox=None)
    for rec in records:
        fresh.apply(rec, 100.0)
    old_ids = {lease_id(rec[3]) for rec in records if rec[0] == Rec.CLAIM_GRANTED}
    fresh.create_runs("new")
    assert lease_id(acquire(fresh, 100.0, scope="new", key="x")["lease"]) > max(old_ids)


def test_replayed_core_continues_the_generation_count() -> None:
    _, records = build_history()
    scope = records[0][1]
    fresh = CoreDriver(mailbox=None)
    for rec in records:
        fresh.apply(rec, 100.0)
    gone = [rec[4] for rec in records if rec[0] == Rec.CLAIM_GRANTED and rec[2] == "gone"]
    assert gone == [2]  # what the live core told its owner
    assert acquire(fresh, 100.0, scope=scope, key="gone")["generation"] > gone[-1]


def test_replayed_live_lease_lives_one_full_length_from_restart() -> None:
    core = CoreDriver(mailbox=None)
    core.apply((Rec.CLAIM_GRANTED, "s", "k", H7, 3, "alice", 30, "default"), 1000.0)
    core.tick(1030.0 - 0.01)
    assert held_by(core) == "alice"
    core.tick(1030.0 + TICK)
    assert held_by(core) is None


def test_replayed_resized_lease_lives_its_new_length_from_restart() -> None:
    core = CoreDriver(mailbox=None)
    core.apply((Rec.CLAIM_GRANTED, "s", "k", H7, 3, "alice", 5, "default"), 1000.0)
    core.apply((Rec.LEASE_RESIZED, H7, 120), 1000.0)
    core.tick(1000.0 + 5.0 + TICK)
    assert held_by(core) == "alice"


def test_replayed_lease_can_be_renewed_and_released_with_its_old_token() -> None:
    core = CoreDriver(mailbox=None)
    core.apply((Rec.CLAIM_GRANTED, "s", "k", H7, 3, "alice", 30, "default"), 1000.0)
    assert renew(core, 1001.0, [H7]) == [None]
    assert release(core, 1002.0, H7) == {}


def test_apply_of_an_unknown_record_type_raises_value_error(core: Core) -> None:
    with pytest.raises(ValueError):
        core.apply((999, "x"), 0.0)
