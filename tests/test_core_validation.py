"""Every op checks its arguments at the boundary and refuses bad ones without side effects.

A refusal is a CoreError with the right code and a message that names the field. The
core's state (leases, claims, scopes, waiters, records, messages) is the same after a
refused request as before it. Each test starts from a core where alice holds "s"/"k".
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import ALICE, CoreDriver, call, seeded_bytes

from rsd.core import DEFERRED, Core, CoreError
from rsproto import ErrorCode, Limits, Op

# alice's lease on "s"/"k", the first the core hands out: id 1 and the first 8 bytes
# of the driver's seeded randomness
LEASE = (1).to_bytes(8, "big") + seeded_bytes()(8)
MISSING = object()  # marks a field left out of the args
NAN = float("nan")
INF = float("inf")


@pytest.fixture
def core() -> CoreDriver:
    core = CoreDriver(holders={ALICE: "alice"}, mailbox=None,
                      scope_ids=lambda: "generated-scope", wall_offset=0.0,
                      runs=("s", "fresh", "s" * Limits.MAX_SCOPE_ID_BYTES))
    reply = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"}, rid=1)
    assert reply["lease"] == LEASE
    core.drain()
    return core


def state(core: Core) -> Any:
    leases = sorted(
        (lease.id, lease.holder, lease.conn, lease.length, lease.expires_at)
        for lease in core.leases.all()
    )
    claims = sorted(
        (scope_id, key, claim.generation, len(claim.waiters))
        for scope_id, scope in core.scopes.items()
        for key, claim in scope.claims.items()
    )
    return leases, claims, sorted(core.scopes), core.leases.ids.top, len(core.wheel)


def refuse(core: Core, op: int, args: dict[str, Any]) -> CoreError:
    """Run a request that must be refused; check it left no trace; return the error."""
    before = state(core)
    with pytest.raises(CoreError) as info:
        core.handle(1.0, ALICE, 77, op, args)
    assert core.effects.take_records() == []
    assert core.effects.take_messages() == []
    assert state(core) == before
    return info.value


def acquire_args(**fields: Any) -> dict[str, Any]:
    """Acquire args for a key in a scope nobody has used yet, with ``fields`` replaced."""
    args: dict[str, Any] = {"scope": "fresh", "key": "new"}
    for name, value in fields.items():
        if value is MISSING:
            args.pop(name)
        else:
            args[name] = value
    return args


def assert_invalid(error: CoreError, field: str, *mentions: str) -> None:
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert field in error.message
    for text in mentions:
        assert text in error.message


# ---- scope and key (CLAIM_ACQUIRE and CLAIM_INSPECT) ---------------------------------

TEXT_OPS = [Op.CLAIM_ACQUIRE, Op.CLAIM_INSPECT]
BAD_TEXT = [
    pytest.param(MISSING, "required", id="missing"),
    pytest.param(None, "string", id="nil"),
    pytest.param(5, "string", id="int"),
    pytest.param(b"k", "string", id="bytes"),
    pytest.param(["k"], "string", id="list"),
    pytest.param("", "empty", id="empty"),
]


@pytest.mark.parametrize("op", TEXT_OPS)
@pytest.mark.parametrize("field", ["scope", "key"])
@pytest.mark.parametrize(("value", "mention"), BAD_TEXT)
def test_bad_scope_or_key_is_invalid_and_named(
    core: Core, op: int, field: str, value: Any, mention: str
) -> None:
    assert_invalid(refuse(core, op, acquire_args(**{field: value})), field, mention)


@pytest.mark.parametrize("op", TEXT_OPS)
def test_over_long_scope_is_invalid_and_states_the_limit(core: Core, op: int) -> None:
    limit = Limits.MAX_SCOPE_ID_BYTES
    error = refuse(core, op, acquire_args(scope="s" * (limit + 1)))
    assert_invalid(error, "scope", str(limit))


@pytest.mark.parametrize("op", TEXT_OPS)
def test_over_long_key_is_invalid_and_states_the_limit(core: Core, op: int) -> None:
    limit = Limits.MAX_KEY_BYTES
    error = refuse(core, op, acquire_args(key="k" * (limit + 1)))
    assert_invalid(error, "key", str(limit))


@pytest.mark.parametrize("op", TEXT_OPS)
def test_key_over_the_limit_in_utf8_bytes_but_not_in_characters_is_invalid(
    core: Core, op: int
) -> None:
    key = "\u00e9" * (Limits.MAX_KEY_BYTES // 2 + 1)  # 257 characters, 514 bytes
    assert len(key) < Limits.MAX_KEY_BYTES
    error = refuse(core, op, acquire_args(key=key))
    assert_invalid(error, "key", str(Limits.MAX_KEY_BYTES), "514")


def test_scope_and_key_of_exactly_the_limit_are_accepted(core: Core) -> None:
    args = {"scope": "s" * Limits.MAX_SCOPE_ID_BYTES, "key": "k" * Limits.MAX_KEY_BYTES}
    assert core.handle(1.0, ALICE, 2, Op.CLAIM_ACQUIRE, args)["generation"] == 1


def test_unicode_key_of_exactly_the_limit_in_bytes_is_accepted(core: Core) -> None:
    args = {"scope": "s", "key": "\u00e9" * (Limits.MAX_KEY_BYTES // 2)}
    assert core.handle(1.0, ALICE, 2, Op.CLAIM_ACQUIRE, args)["generation"] == 1


# ---- lease_seconds, wait, timeout_ms (CLAIM_ACQUIRE) ---------------------------------

BAD_LEASE_SECONDS = [
    pytest.param(4, "5", id="below-min"),
    pytest.param(4.999, "5", id="just-below-min"),
    pytest.param(0, "5", id="zero"),
    pytest.param(-30, "5", id="negative"),
    pytest.param(601, "600", id="above-max"),
    pytest.param(600.5, "600", id="just-above-max"),
    pytest.param(INF, "600", id="inf"),
    pytest.param(True, "number", id="true"),
    pytest.param(False, "number", id="false"),
    pytest.param("30", "number", id="string"),
    pytest.param([30], "number", id="list"),
    pytest.param(NAN, "number", id="nan"),
]


@pytest.mark.parametrize(("value", "mention"), BAD_LEASE_SECONDS)
def test_bad_lease_seconds_is_invalid_and_named(core: Core, value: Any, mention: str) -> None:
    error = refuse(core, Op.CLAIM_ACQUIRE, acquire_args(lease_seconds=value))
    assert_invalid(error, "lease_seconds", mention)


@pytest.mark.parametrize("value", [Limits.MIN_LEASE_SECONDS, Limits.MAX_LEASE_SECONDS, 7.5, None])
def test_lease_seconds_at_the_bounds_or_absent_is_accepted(core: Core, value: Any) -> None:
    reply = core.handle(1.0, ALICE, 2, Op.CLAIM_ACQUIRE, acquire_args(lease_seconds=value))
    expected = Limits.DEFAULT_LEASE_SECONDS if value is None else value
    assert reply["lease_seconds"] == expected


@pytest.mark.parametrize("value", [1, 0, "true", "yes", [True], {}])
def test_non_boolean_wait_is_invalid_and_named(core: Core, value: Any) -> None:
    assert_invalid(refuse(core, Op.CLAIM_ACQUIRE, acquire_args(wait=value)), "wait", "boolean")


BAD_TIMEOUT = [
    pytest.param(-1, id="negative"),
    pytest.param(-0.5, id="negative-fraction"),
    pytest.param(Limits.MAX_WAIT_TIMEOUT_MS + 1, id="above-max"),
    pytest.param(INF, id="inf"),
    pytest.param(True, id="bool"),
    pytest.param("100", id="string"),
    pytest.param(NAN, id="nan"),
]


@pytest.mark.parametrize("value", BAD_TIMEOUT)
def test_bad_timeout_ms_is_invalid_and_named(core: Core, value: Any) -> None:
    error = refuse(core, Op.CLAIM_ACQUIRE, acquire_args(wait=True, timeout_ms=value))
    assert_invalid(error, "timeout_ms")


def test_too_big_timeout_ms_message_states_the_limit_in_full(core: Core) -> None:
    value = Limits.MAX_WAIT_TIMEOUT_MS + 1
    error = refuse(core, Op.CLAIM_ACQUIRE, acquire_args(wait=True, timeout_ms=value))
    assert str(Limits.MAX_WAIT_TIMEOUT_MS) in error.message


def test_timeout_ms_at_the_max_is_accepted_for_a_wait(core: Core) -> None:
    args = {"scope": "s", "key": "k", "wait": True, "timeout_ms": Limits.MAX_WAIT_TIMEOUT_MS}
    core.connected(2, "bob")
    assert core.handle(1.0, 2, 2, Op.CLAIM_ACQUIRE, args) is DEFERRED
    assert core.handle(1.0, 2, 3, Op.CLAIM_INSPECT, {"scope": "s", "key": "k"})["waiters"] == 1


def test_bad_arguments_on_a_held_key_are_invalid_not_claim_held(core: Core) -> None:
    error = refuse(core, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": 1})
    assert_invalid(error, "lease_seconds")


def test_bad_timeout_on_a_held_key_queues_no_waiter(core: Core) -> None:
    args = {"scope": "s", "key": "k", "wait": True, "timeout_ms": -1}
    assert_invalid(refuse(core, Op.CLAIM_ACQUIRE, args), "timeout_ms")


# ---- lease handles (CLAIM_RELEASE) and request ids (CANCEL) --------------------------

BAD_HANDLES = [
    pytest.param(MISSING, "required", id="missing"),
    pytest.param(None, "bin of 16 bytes", id="nil"),
    pytest.param(1, "bin of 16 bytes", id="lease-id"),
    pytest.param(-1, "bin of 16 bytes", id="negative"),
    pytest.param(LEASE.hex(), "bin of 16 bytes", id="hex-string"),
    pytest.param(LEASE[:15], "bin of 16 bytes", id="15-bytes"),
    pytest.param(LEASE + b"\0", "bin of 16 bytes", id="17-bytes"),
    pytest.param(True, "bin of 16 bytes", id="bool"),
    pytest.param([LEASE], "bin of 16 bytes", id="list"),
]

BAD_IDS = [
    pytest.param(MISSING, "required", id="missing"),
    pytest.param(None, "integer", id="nil"),
    pytest.param(-1, "integer", id="negative"),
    pytest.param("1", "integer", id="string"),
    pytest.param(1.0, "integer", id="float"),
    pytest.param(True, "integer", id="bool"),
    pytest.param([1], "integer", id="list"),
]


def id_args(field: str, value: Any) -> dict[str, Any]:
    return {} if value is MISSING else {field: value}


@pytest.mark.parametrize(("value", "mention"), BAD_HANDLES)
def test_bad_lease_handle_in_release_is_invalid_and_named(
    core: Core, value: Any, mention: str
) -> None:
    error = refuse(core, Op.CLAIM_RELEASE, id_args("lease", value))
    assert_invalid(error, "lease", mention)


@pytest.mark.parametrize(("value", "mention"), BAD_IDS)
def test_bad_request_id_in_cancel_is_invalid_and_named(
    core: Core, value: Any, mention: str
) -> None:
    error = refuse(core, Op.CANCEL, id_args("request", value))
    assert_invalid(error, "request", mention)


# ---- leases (LEASE_RENEW) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "mention"),
    [
        pytest.param(MISSING, "required", id="missing"),
        pytest.param(None, "array", id="nil"),
        pytest.param(1, "array", id="int"),
        pytest.param("1", "array", id="string"),
        pytest.param({"1": 30}, "array", id="map"),
    ],
)
def test_leases_that_is_not_a_list_is_invalid_and_named(
    core: Core, value: Any, mention: str
) -> None:
    error = refuse(core, Op.LEASE_RENEW, id_args("leases", value))
    assert_invalid(error, "leases", mention)


def test_too_many_leases_in_one_renew_is_invalid_and_states_the_limit(core: Core) -> None:
    limit = Limits.MAX_RENEW_BATCH
    error = refuse(core, Op.LEASE_RENEW, {"leases": [LEASE] * (limit + 1)})
    assert_invalid(error, "leases", str(limit))


def test_renew_batch_of_exactly_the_limit_is_accepted(core: Core) -> None:
    reply = core.handle(1.0, ALICE, 2, Op.LEASE_RENEW, {"leases": [LEASE] * Limits.MAX_RENEW_BATCH})
    assert reply["results"] == [None] * Limits.MAX_RENEW_BATCH


@pytest.mark.parametrize(
    "item",
    [
        pytest.param("1", id="string"),
        pytest.param(1.0, id="float"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="nil"),
        pytest.param({"lease": 1}, id="map"),
        pytest.param([], id="empty-pair"),
        pytest.param([LEASE], id="one-element"),
        pytest.param([LEASE, 30, 3], id="three-elements"),
        pytest.param(LEASE[:15], id="short-handle"),
        pytest.param(LEASE + b"\0", id="long-handle"),
        pytest.param([LEASE[:8], 30], id="short-handle-pair"),
        pytest.param(["1", 30], id="string-id"),
        pytest.param([1.0, 30], id="float-id"),
        pytest.param([True, 30], id="bool-id"),
    ],
)
def test_malformed_renew_item_is_invalid_and_names_leases(core: Core, item: Any) -> None:
    error = refuse(core, Op.LEASE_RENEW, {"leases": [LEASE, item]})
    assert_invalid(error, "leases")


@pytest.mark.parametrize(
    ("seconds", "mention"),
    [
        pytest.param(4, "5", id="below-min"),
        pytest.param(601, "600", id="above-max"),
        pytest.param(True, "number", id="bool"),
        pytest.param("30", "number", id="string"),
        pytest.param(NAN, "number", id="nan"),
    ],
)
def test_bad_seconds_in_a_renew_item_is_invalid_and_named(
    core: Core, seconds: Any, mention: str
) -> None:
    error = refuse(core, Op.LEASE_RENEW, {"leases": [[LEASE, seconds]]})
    assert_invalid(error, "lease_seconds", mention)


@pytest.mark.parametrize(
    "item",
    [
        pytest.param(-1, id="negative-id"),
        pytest.param([-1, 30], id="negative-pair"),
        pytest.param(1, id="id"),
        pytest.param([1, 30], id="id-pair"),
    ],
)
def test_lease_id_instead_of_a_handle_in_renew_is_invalid(core: Core, item: Any) -> None:
    assert_invalid(refuse(core, Op.LEASE_RENEW, {"leases": [item]}), "leases")


# ---- ops -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(999, id="unassigned"),
        pytest.param(0, id="zero"),
        pytest.param(-20, id="negative"),
        pytest.param(Op.HELLO, id="hello-is-the-servers"),
        pytest.param(Op.PING, id="ping-is-the-servers"),
        pytest.param("20", id="string"),
        pytest.param(None, id="nil"),
    ],
)
def test_unknown_op_is_unknown_op_and_named(core: Core, op: Any) -> None:
    error = refuse(core, op, {"scope": "s", "key": "k"})
    assert error.code == ErrorCode.UNKNOWN_OP
    assert "op" in error.message


@pytest.mark.parametrize(
    "op",
    [pytest.param(20.0, id="float"), pytest.param([20], id="list"), pytest.param({}, id="map")],
)
def test_op_that_is_not_an_int_is_unknown_op(core: Core, op: Any) -> None:
    assert refuse(core, op, {"scope": "s", "key": "other"}).code == ErrorCode.UNKNOWN_OP


def test_core_does_not_claim_the_servers_ops(core: Core) -> None:
    assert not core.handles(Op.HELLO)
    assert not core.handles(Op.PING)
    assert core.handles(Op.CLAIM_ACQUIRE)


def test_mailbox_ensure_reports_the_first_invalid_field() -> None:
    core = CoreDriver(recovered=True)
    with pytest.raises(CoreError) as info:
        call(core, 0.0, Op.MAILBOX_ENSURE,
             {"name": "m", "max_attempts": 2.5, "retry_backoff_ms": -1})
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert "max_attempts" in info.value.message
