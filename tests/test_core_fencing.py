"""FENCE_CHECK: a fencing token is current exactly while its lease is the key's live
grant, and refused for good once stale (released, expired and taken over, cancelled)."""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, BOB, CoreDriver, handle

from rsproto import ErrorCode, Op

TICK = 0.02


def fence(core: CoreDriver, token: bytes, key: str = "k", conn: int = ALICE) -> dict[str, Any]:
    reply: dict[str, Any] = core.call(
        Op.FENCE_CHECK, {"scope": "s", "key": key, "token": token}, conn
    )
    return reply


@pytest.fixture
def core() -> CoreDriver:
    return CoreDriver(recovered=True)


def test_a_held_token_is_current_and_says_its_generation(core: CoreDriver) -> None:
    grant = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": 5})
    core.drain()
    assert fence(core, grant["lease"]) == {"current": True, "generation": grant["generation"]}
    assert fence(core, grant["lease"], conn=BOB)["current"] is True  # anyone may ask
    assert core.effects.take_records() == []  # a read: no record


def test_a_stale_token_is_refused_after_expiry_and_takeover(core: CoreDriver) -> None:
    old = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": 5})
    core.advance(5.0 + TICK)  # the holder stopped renewing: its lease expired
    assert fence(core, old["lease"])["current"] is False
    new = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"}, BOB)  # the takeover
    assert new["generation"] > old["generation"]
    assert fence(core, old["lease"]) == {"current": False, "generation": new["generation"]}
    assert fence(core, new["lease"])["current"] is True
    # The old holder's renewal is refused too: the token never becomes current again.
    assert core.call(Op.LEASE_RENEW, {"leases": [old["lease"]]})["results"] == ["STALE_CLAIM"]
    assert fence(core, old["lease"])["current"] is False


def test_a_released_or_cancelled_token_is_not_current(core: CoreDriver) -> None:
    first = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    core.call(Op.CLAIM_RELEASE, {"lease": first["lease"]})
    assert fence(core, first["lease"])["current"] is False
    second = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    core.call(Op.SCOPE_CANCEL, {"scope": "s"})
    assert fence(core, second["lease"])["current"] is False


def test_made_up_and_other_keys_tokens_are_not_current(core: CoreDriver) -> None:
    grant = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    guessed = grant["lease"][:8] + b"\x00" * 8  # the right lease id, a wrong secret
    assert fence(core, guessed)["current"] is False
    assert fence(core, grant["lease"], key="other")["current"] is False
    assert fence(core, handle(99))["current"] is False


def test_another_tenants_token_is_not_current_for_you() -> None:
    core = CoreDriver(tenants={ALICE: ("acme", True), BOB: ("globex", False)},
                      holders={ALICE: "alice", BOB: "bob"})
    grant = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    assert fence(core, grant["lease"], conn=BOB)["current"] is False


@pytest.mark.parametrize("token", [b"short", "ab" * 16, None, 7])
def test_a_token_that_is_no_lease_handle_is_invalid(core: CoreDriver, token: Any) -> None:
    err = core.refused(Op.FENCE_CHECK, {"scope": "s", "key": "k", "token": token})
    assert err.code == ErrorCode.INVALID_ARGUMENT and "token" in err.message
