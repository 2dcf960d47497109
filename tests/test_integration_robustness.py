"""What a misbehaving client can do to rsd: only hurt its own connection, never the server.

Raw sockets send what the SDK never would (frames built with ``rsclient.wire`` or by
hand). A broken byte stream gets one connection-level error frame (request id 0) and
the connection is closed; a well-framed bad request gets an error reply with the right
code and the connection stays usable; other clients, and the leases they hold, carry on.
Every server here also has to exit 0 on SIGTERM with no traceback in its log (conftest).
"""

from __future__ import annotations

import asyncio
import math
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import pytest

from rsclient import AsyncRunstate, InvalidArgumentError, wire
from rsproto import ErrorCode, Kind, Limits, Op

MakeClient = Callable[..., AsyncRunstate]
RawConnect = Callable[[str], Awaitable[Any]]
Eventually = Callable[..., Awaitable[None]]

MAX = wire.MAX_FRAME_BYTES
# The tests marked ``shared`` need nothing of a fresh server: they share one rsd for the
# module (tests/conftest.py: a start, 0.2 s of CPU, per test saved). The others assert a
# key's generation from 0 or 1 up, which only a server that never granted anything
# shows (a new key starts above every generation the server handed out, in any run), or
# stop their server.
shared = pytest.mark.rsd_per_module


def frame_of(body: bytes) -> bytes:
    """A frame with a correct length header around any body bytes."""
    return struct.pack(">I", len(body)) + body


def packed(value: Any) -> bytes:
    return frame_of(msgpack.packb(value, use_bin_type=True))


async def _held_by(rs: AsyncRunstate, scope: str, key: str) -> dict[str, Any]:
    return await rs.scope(scope).claim(key).inspect()


# ---- broken byte streams ---------------------------------------------------------------------

BROKEN_BODIES = {
    "not msgpack (0xc1 is never used)": frame_of(b"\xc1\xc1\xc1"),
    "empty body": frame_of(b""),
    "truncated value": frame_of(b"\x94\x01\x01"),
    "trailing bytes": frame_of(msgpack.packb([1, 5, Op.PING, {}]) + b"\x00"),
    "invalid UTF-8 string": frame_of(b"\x94\x01\x05\x02\xa2\xff\xfe"),
    "array as a map key": frame_of(b"\x94\x01\x05\x02\x81\x91\x01\x02"),
    "nested 100000 deep": frame_of(b"\x91" * 100_000 + b"\xc0"),
    "array length beyond the body": frame_of(b"\xdd\xff\xff\xff\xff"),
}

BAD_SHAPES = {
    "not an array": packed(42),
    "a map": packed({"op": 2}),
    "three elements": packed([1, 5, Op.PING]),
    "five elements": packed([1, 5, Op.PING, {}, None]),
    "a reply from the client": packed([Kind.REPLY, 5, {}]),
    "a push from the client": packed([Kind.PUSH, 1, {}]),
    "string request id": packed([1, "5", Op.PING, {}]),
    "float request id": packed([1, 5.0, Op.PING, {}]),
    "boolean request id": packed([1, True, Op.PING, {}]),
}


async def test_garbage_closes_only_that_connection(
    rsd: Any, clients: MakeClient, raw_connect: RawConnect
) -> None:
    keeper = clients("keeper")
    run = await keeper.scopes.create()
    lease = await run.claim("k").acquire()

    for name, data in {**BROKEN_BODIES, **BAD_SHAPES}.items():
        for after_hello in (True, False):
            raw = await raw_connect(rsd.address)
            if after_hello:
                await raw.hello()
            await raw.send(data)
            before, message = await raw.closed_with(ErrorCode.PROTOCOL_ERROR)
            assert before == [], f"{name}: unexpected messages before the error: {before}"
            assert message, name
            raw.close()

    # Meanwhile the other client kept its claim, and can still release and acquire.
    assert not lease.is_lost
    assert await run.claim("k").inspect() == {
        "held": True, "generation": 1, "holder": "keeper", "waiters": 0
    }
    await lease.release()
    again = await run.claim("k").acquire()
    assert again.generation == 2
    await again.release()


@shared
async def test_oversized_frame_header_is_refused_at_once(
    rsd: Any, clients: MakeClient, raw_connect: RawConnect
) -> None:
    keeper = clients("keeper")
    run = await keeper.scopes.create()
    lease = await run.claim("k").acquire()

    cases = {
        "one byte over the limit": struct.pack(">I", MAX + 1),
        "largest header": b"\xff\xff\xff\xff",
        "an HTTP request": b"GET / HTTP/1.1\r\nHost: rsd\r\n\r\n",
    }
    for name, data in cases.items():
        raw = await raw_connect(rsd.address)
        await raw.hello()
        await raw.send(data)  # no body follows: rsd must not wait for one
        before, message = await raw.closed_with(ErrorCode.FRAME_TOO_LARGE, timeout=2)
        assert before == [], name
        assert str(MAX) in message, f"{name}: the message should name the limit: {message!r}"

    # The server keeps serving: new connections, and the lease of the old one.
    raw = await raw_connect(rsd.address)
    await raw.hello()
    assert "time" in await raw.ok(Op.PING, None)
    assert (await run.claim("k").inspect())["holder"] == "keeper"
    await lease.release()


@shared
async def test_frame_of_exactly_the_limit_is_accepted(
    rsd: Any, raw_connect: RawConnect
) -> None:
    raw = await raw_connect(rsd.address)
    hello = await raw.hello()
    assert hello["limits"]["max_frame_bytes"] == MAX
    pad = MAX - len(msgpack.packb([1, 7, Op.PING, {"pad": b""}], use_bin_type=True))
    body = msgpack.packb([1, 7, Op.PING, {"pad": b"x" * pad}], use_bin_type=True)
    while len(body) > MAX:  # the bin header grew with the padding: trim to fit exactly
        pad -= len(body) - MAX
        body = msgpack.packb([1, 7, Op.PING, {"pad": b"x" * pad}], use_bin_type=True)
    assert len(body) == MAX
    await raw.send(frame_of(body))
    reply = await raw.recv()
    assert reply[:2] == [Kind.REPLY, 7]


# ---- the handshake -----------------------------------------------------------------------


async def test_first_request_must_be_hello(
    rsd: Any, clients: MakeClient, raw_connect: RawConnect
) -> None:
    observer = clients("observer")
    run = await observer.scopes.create()
    raw = await raw_connect(rsd.address)
    # An acquire before HELLO, with a HELLO right behind it in the same write.
    _, first = raw.frame(Op.CLAIM_ACQUIRE, {"scope": run.id, "key": "k"})
    _, then = raw.frame(Op.HELLO, {"version": 1, "holder": "late"})
    await raw.send(first + then)
    before, message = await raw.closed_with(ErrorCode.PROTOCOL_ERROR)
    assert before == []
    assert "HELLO" in message
    assert (await _held_by(observer, run.id, "k"))["generation"] == 0, "the acquire ran"

    raw = await raw_connect(rsd.address)
    await raw.send(raw.frame(Op.HELLO, [1, "x"])[1])
    assert (await raw.closed_with(ErrorCode.PROTOCOL_ERROR))[0] == []


async def test_hello_with_a_wrong_version_or_holder_is_refused(
    rsd: Any, clients: MakeClient, raw_connect: RawConnect
) -> None:
    observer = clients("observer")
    run = await observer.scopes.create()
    acquire = {"scope": run.id, "key": "k"}

    for version in (2, 0, "1", None, True, 1.0):
        raw = await raw_connect(rsd.address)
        rid, hello = raw.frame(Op.HELLO, {"version": version, "holder": "h"})
        await raw.send(hello + raw.frame(Op.CLAIM_ACQUIRE, acquire)[1])  # pipelined
        before, _ = await raw.closed_with(ErrorCode.UNSUPPORTED_VERSION)
        assert len(before) == 1, before
        kind, got_rid, code, message, details = before[0]
        assert (kind, got_rid, code) == (Kind.ERROR, rid, ErrorCode.UNSUPPORTED_VERSION)
        assert details == {"supported": [wire.PROTOCOL_VERSION]}
        assert repr(version) in message or str(version) in message

    for holder in ("", "h" * (Limits.MAX_HOLDER_BYTES + 1), 7, None):
        raw = await raw_connect(rsd.address)
        rid, hello = raw.frame(Op.HELLO, {"version": 1, "holder": holder})
        await raw.send(hello + raw.frame(Op.CLAIM_ACQUIRE, acquire)[1])
        before, _ = await raw.closed_with(ErrorCode.INVALID_ARGUMENT)
        assert [m[:3] for m in before] == [[Kind.ERROR, rid, ErrorCode.INVALID_ARGUMENT]]
        assert "holder" in before[0][3]

    # None of the pipelined acquires ran.
    assert (await _held_by(observer, run.id, "k"))["generation"] == 0


@shared
async def test_silent_clients_are_closed_after_the_handshake_timeout(
    rsd: Any, raw_connect: RawConnect
) -> None:
    loop = asyncio.get_running_loop()
    connected_at = loop.time()
    silent = await raw_connect(rsd.address)
    partial = await raw_connect(rsd.address)
    # Half a HELLO frame must not keep a connection alive either.
    await partial.send(partial.frame(Op.HELLO, {"version": 1, "holder": "slow"})[1][:6])
    greeted = await raw_connect(rsd.address)
    await greeted.hello()

    for conn in (silent, partial):
        before, message = await conn.closed_with(ErrorCode.PROTOCOL_ERROR, timeout=5)
        closed_after = loop.time() - connected_at
        assert before == []
        assert "handshake" in message
        assert 0.9 <= closed_after <= 3.0, f"closed {closed_after:.2f} s after connecting"
    # The connection that said HELLO is past the timeout and still served.
    assert loop.time() - connected_at > 1.0
    assert "time" in await greeted.ok(Op.PING, {})


# ---- well-framed bad requests ------------------------------------------------------------


def _bad_requests(scope: str) -> list[tuple[str, int, Any, str, list[str]]]:
    """(case, op, args, expected code, words the message must contain)."""
    acq = {"scope": scope, "key": "k"}
    invalid = ErrorCode.INVALID_ARGUMENT
    long_ascii = "k" * (Limits.MAX_KEY_BYTES + 1)
    long_utf8 = "€" * math.ceil((Limits.MAX_KEY_BYTES + 1) / 3)  # few chars, many bytes
    return [
        ("unknown op", 999, {}, ErrorCode.UNKNOWN_OP, ["999"]),
        ("op as a string", "PING", {}, ErrorCode.UNKNOWN_OP, []),
        ("args an array", Op.CLAIM_ACQUIRE, [scope, "k"], invalid, ["args", "map"]),
        ("args a string", Op.CLAIM_INSPECT, "k", invalid, ["args", "map"]),
        ("missing key", Op.CLAIM_ACQUIRE, {"scope": scope}, invalid, ["key", "required"]),
        ("missing scope", Op.CLAIM_ACQUIRE, {"key": "k"}, invalid, ["scope"]),
        ("empty key", Op.CLAIM_ACQUIRE, {**acq, "key": ""}, invalid, ["key"]),
        ("integer key", Op.CLAIM_ACQUIRE, {**acq, "key": 5}, invalid, ["key"]),
        ("binary key", Op.CLAIM_ACQUIRE, {**acq, "key": b"k"}, invalid, ["key"]),
        ("nil key", Op.CLAIM_ACQUIRE, {**acq, "key": None}, invalid, ["key"]),
        ("key over the limit", Op.CLAIM_ACQUIRE, {**acq, "key": long_ascii}, invalid,
         ["key", str(Limits.MAX_KEY_BYTES)]),
        ("key over the limit in UTF-8 bytes", Op.CLAIM_ACQUIRE, {**acq, "key": long_utf8},
         invalid, ["key", str(Limits.MAX_KEY_BYTES)]),
        ("scope over the limit", Op.CLAIM_ACQUIRE,
         {**acq, "scope": "s" * (Limits.MAX_SCOPE_ID_BYTES + 1)}, invalid,
         ["scope", str(Limits.MAX_SCOPE_ID_BYTES)]),
        ("lease_seconds 4", Op.CLAIM_ACQUIRE, {**acq, "lease_seconds": 4}, invalid,
         ["lease_seconds", "5", "600"]),
        ("lease_seconds 4.999", Op.CLAIM_ACQUIRE, {**acq, "lease_seconds": 4.999}, invalid,
         ["lease_seconds"]),
        ("lease_seconds 601", Op.CLAIM_ACQUIRE, {**acq, "lease_seconds": 601}, invalid,
         ["lease_seconds", "600"]),
        ("lease_seconds true", Op.CLAIM_ACQUIRE, {**acq, "lease_seconds": True}, invalid,
         ["lease_seconds"]),
        ("lease_seconds a string", Op.CLAIM_ACQUIRE, {**acq, "lease_seconds": "30"}, invalid,
         ["lease_seconds"]),
        ("lease_seconds NaN", Op.CLAIM_ACQUIRE, {**acq, "lease_seconds": math.nan}, invalid,
         ["lease_seconds"]),
        ("lease_seconds infinite", Op.CLAIM_ACQUIRE, {**acq, "lease_seconds": math.inf},
         invalid, ["lease_seconds"]),
        ("wait as 1", Op.CLAIM_ACQUIRE, {**acq, "wait": 1}, invalid, ["wait"]),
        ("wait as a string", Op.CLAIM_ACQUIRE, {**acq, "wait": "yes"}, invalid, ["wait"]),
        ("negative timeout", Op.CLAIM_ACQUIRE, {**acq, "timeout_ms": -1}, invalid,
         ["timeout_ms"]),
        ("timeout over the limit", Op.CLAIM_ACQUIRE,
         {**acq, "timeout_ms": Limits.MAX_WAIT_TIMEOUT_MS + 1}, invalid, ["timeout_ms"]),
        ("timeout true", Op.CLAIM_ACQUIRE, {**acq, "timeout_ms": True}, invalid,
         ["timeout_ms"]),
        ("release: lease a string", Op.CLAIM_RELEASE, {"lease": "abc"}, invalid, ["lease"]),
        ("release: lease a float", Op.CLAIM_RELEASE, {"lease": 1.0}, invalid, ["lease"]),
        ("release: lease true", Op.CLAIM_RELEASE, {"lease": True}, invalid, ["lease"]),
        ("release: lease negative", Op.CLAIM_RELEASE, {"lease": -1}, invalid, ["lease"]),
        ("release: no lease", Op.CLAIM_RELEASE, {}, invalid, ["lease"]),
        ("release: a lease id, not a handle", Op.CLAIM_RELEASE, {"lease": 7}, invalid,
         ["lease", "16 bytes"]),
        ("release: a short handle", Op.CLAIM_RELEASE, {"lease": b"\x01" * 15}, invalid,
         ["lease", "16 bytes"]),
        ("release: unknown lease", Op.CLAIM_RELEASE, {"lease": b"\xff" * 16},
         ErrorCode.STALE_CLAIM, []),
        ("renew: leases not an array", Op.LEASE_RENEW, {"leases": 5}, invalid, ["leases"]),
        ("renew: no leases", Op.LEASE_RENEW, {}, invalid, ["leases"]),
        ("renew: string item", Op.LEASE_RENEW, {"leases": ["x"]}, invalid, ["leases"]),
        ("renew: seconds too short", Op.LEASE_RENEW, {"leases": [[b"\x01" * 16, 4]]},
         invalid, ["lease_seconds"]),
        ("renew: a lease id, not a handle", Op.LEASE_RENEW, {"leases": [1]}, invalid,
         ["leases", "16 bytes"]),
        ("renew: too many", Op.LEASE_RENEW,
         {"leases": [b"\x01" * 16] * (Limits.MAX_RENEW_BATCH + 1)}, invalid,
         [str(Limits.MAX_RENEW_BATCH)]),
        ("cancel: request a string", Op.CANCEL, {"request": "x"}, invalid, ["request"]),
        ("cancel: no request", Op.CANCEL, {}, invalid, ["request"]),
        ("inspect: no key", Op.CLAIM_INSPECT, {"scope": scope}, invalid, ["key"]),
        ("HELLO again", Op.HELLO, {"version": 1, "holder": "again"},
         ErrorCode.PROTOCOL_ERROR, ["HELLO"]),
    ]


async def test_bad_requests_get_error_replies_and_the_connection_stays_usable(
    rsd: Any, clients: MakeClient, raw_connect: RawConnect
) -> None:
    observer = clients("observer")
    run = await observer.scopes.create()
    raw = await raw_connect(rsd.address)
    await raw.hello("raw")
    wrong = []
    for case, op, args, code, words in _bad_requests(run.id):
        got_code, message, details = await raw.error(op, args)
        missing = [w for w in words if w not in message]
        if got_code != code or missing or details is not None:
            wrong.append(f"{case}: {got_code} {message!r} details={details!r}")
        assert "time" in await raw.ok(Op.PING, None), f"connection unusable after {case}"
    assert not wrong, "\n".join(wrong)
    # Refused requests changed nothing.
    assert await _held_by(observer, run.id, "k") == {
        "held": False, "generation": 0, "holder": None, "waiters": 0
    }


@shared
async def test_values_at_the_limits_are_accepted(rsd: Any, raw_connect: RawConnect) -> None:
    raw = await raw_connect(rsd.address)
    await raw.hello("raw")
    scope = "s" * Limits.MAX_SCOPE_ID_BYTES
    assert await raw.ok(Op.SCOPE_CREATE, {"scope": scope}) == {"scope": scope, "created": True}
    utf8_key = "€" * (Limits.MAX_KEY_BYTES // 3) + "k" * (Limits.MAX_KEY_BYTES % 3)
    assert len(utf8_key.encode()) == Limits.MAX_KEY_BYTES
    cases = [
        {"key": "k" * Limits.MAX_KEY_BYTES},
        {"key": utf8_key},
        {"key": "a", "lease_seconds": Limits.MIN_LEASE_SECONDS},
        {"key": "b", "lease_seconds": Limits.MAX_LEASE_SECONDS},
        {"key": "c", "lease_seconds": 7.5, "timeout_ms": Limits.MAX_WAIT_TIMEOUT_MS},
        {"key": "d", "lease_seconds": None, "wait": None, "timeout_ms": None},
        {"key": "e", "wait": False, "timeout_ms": 0, "unknown_field": [1, 2]},
    ]
    for args in cases:
        grant = await raw.ok(Op.CLAIM_ACQUIRE, {"scope": scope, **args})
        assert type(grant["generation"]) is int and grant["generation"] >= 1, args
        expected = args.get("lease_seconds") or Limits.DEFAULT_LEASE_SECONDS
        assert grant["lease_seconds"] == expected, args
        assert await raw.ok(Op.LEASE_RENEW, {"leases": [grant["lease"]]}) == {"results": [None]}
        assert await raw.ok(Op.CLAIM_RELEASE, {"lease": grant["lease"]}) == {}


@shared
async def test_op_of_a_wrong_type_is_unknown_not_internal(
    rsd: Any, raw_connect: RawConnect
) -> None:
    raw = await raw_connect(rsd.address)
    await raw.hello("raw")
    got = []
    for op in ([Op.PING], {"op": Op.PING}, 2.5, None, "PING", b"\x02"):
        code, message, _ = await raw.error(op, {})
        got.append((op, code, message))
        assert "time" in await raw.ok(Op.PING, None)
    assert all(code == ErrorCode.UNKNOWN_OP for _, code, _ in got), got


@shared
async def test_op_must_be_an_integer_not_an_integral_float_or_bool(
    rsd: Any, raw_connect: RawConnect
) -> None:
    """protocol.md: op MUST be an integer; "a float is not accepted, even one with an
    integral value"; "booleans are never numbers"."""
    raw = await raw_connect(rsd.address)
    await raw.hello("raw")
    got = []
    for op in (float(Op.PING), True, float(Op.HELLO), float(Op.SCOPE_CREATE)):
        msg = await raw.call(op, {"version": 1, "holder": "x"})
        got.append((op, msg[0] == Kind.ERROR and msg[2]))
    assert all(code == ErrorCode.UNKNOWN_OP for _, code in got), got


# ---- pipelining ----------------------------------------------------------------------------


async def test_bad_request_between_good_ones_in_one_write(
    rsd: Any, clients: MakeClient, raw_connect: RawConnect
) -> None:
    observer = clients("observer")
    run = await observer.scopes.create()
    raw = await raw_connect(rsd.address)
    hello_id, hello = raw.frame(Op.HELLO, {"version": 1, "holder": "raw"})
    frames = [
        raw.frame(Op.CLAIM_ACQUIRE, {"scope": run.id, "key": "k1"}),
        raw.frame(Op.CLAIM_ACQUIRE, {"scope": run.id, "key": "k2", "lease_seconds": 4}),
        raw.frame(Op.CLAIM_ACQUIRE, {"scope": run.id, "key": "k3"}),
        raw.frame(12345, {}),
        raw.frame(Op.CLAIM_INSPECT, {"scope": run.id, "key": "k1"}),
    ]
    await raw.send(hello + b"".join(data for _, data in frames))  # one write, HELLO first
    answers = [await raw.recv() for _ in range(len(frames) + 1)]
    assert [m[1] for m in answers] == [hello_id, *(rid for rid, _ in frames)]
    hello_reply, first, bad, third, unknown, inspected = answers
    assert hello_reply[0] == Kind.REPLY
    assert first[0] == Kind.REPLY and first[2]["generation"] == 1
    assert bad[:3] == [Kind.ERROR, frames[1][0], ErrorCode.INVALID_ARGUMENT]
    assert third[0] == Kind.REPLY and third[2]["generation"] == 1
    assert unknown[:3] == [Kind.ERROR, frames[3][0], ErrorCode.UNKNOWN_OP]
    assert inspected[2] == {"held": True, "generation": 1, "holder": "raw", "waiters": 0}
    assert (await _held_by(observer, run.id, "k2"))["generation"] == 0
    for grant in (first[2], third[2]):
        assert await raw.ok(Op.CLAIM_RELEASE, {"lease": grant["lease"]}) == {}


async def test_requests_before_a_malformed_frame_take_effect(
    rsd: Any, clients: MakeClient, raw_connect: RawConnect, eventually: Eventually
) -> None:
    """protocol.md: requests before a frame of the wrong shape run, and are answered."""
    heir = clients("heir")
    run = await heir.scopes.create()
    raw = await raw_connect(rsd.address)
    await raw.hello("raw")
    grant = await raw.ok(Op.CLAIM_ACQUIRE, {"scope": run.id, "key": "k"})
    waiting = asyncio.create_task(
        run.claim("k").acquire(wait=True, timeout_ms=10_000)
    )

    async def queued() -> bool:
        return (await run.claim("k").inspect())["waiters"] == 1

    await eventually(queued)

    rid, release = raw.frame(Op.CLAIM_RELEASE, {"lease": grant["lease"]})
    await raw.send(release + packed(["not", "a", "request"]))
    before, _ = await raw.closed_with(ErrorCode.PROTOCOL_ERROR)
    assert before == [[Kind.REPLY, rid, {}]]
    lease = await asyncio.wait_for(waiting, 1.0)  # granted by that release, at once
    assert lease.generation == 2
    await lease.release()


async def test_sigterm_with_busy_connections_exits_cleanly(
    rsd: Any, raw_connect: RawConnect
) -> None:
    """Held leases, a pending wait, half a frame and an unfinished handshake: exit 0."""
    holder = await raw_connect(rsd.address)
    await holder.hello("holder")
    await holder.ok(Op.SCOPE_CREATE, {"scope": "s"})  # runs must exist
    await holder.ok(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    waiter = await raw_connect(rsd.address)
    await waiter.hello("waiter")
    await waiter.request(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "wait": True})
    await waiter.send(waiter.frame(Op.PING, {})[1][:5])
    silent = await raw_connect(rsd.address)
    assert (await holder.ok(Op.CLAIM_INSPECT, {"scope": "s", "key": "k"}))["waiters"] == 1

    started = asyncio.get_running_loop().time()
    code = await rsd.stop()
    assert code == 0
    assert asyncio.get_running_loop().time() - started < 2.0
    for conn in (holder, waiter, silent):
        with pytest.raises(EOFError):
            await conn.recv(timeout=2)


# ---- the SDK's side --------------------------------------------------------------------------


async def test_sdk_raises_invalid_argument_for_bad_claims(clients: MakeClient) -> None:
    rs = clients("alice")
    run = await rs.scopes.create()
    called = False

    async def work(_: Any) -> None:
        nonlocal called
        called = True

    with pytest.raises(InvalidArgumentError) as short:
        await run.claim("k", lease_seconds=1).run(work)
    assert short.value.code == ErrorCode.INVALID_ARGUMENT
    assert "lease_seconds" in short.value.message and "5" in short.value.message
    with pytest.raises(InvalidArgumentError):
        await run.claim("k", lease_seconds=601).try_acquire()
    with pytest.raises(InvalidArgumentError, match=str(Limits.MAX_KEY_BYTES)):
        await run.claim("k" * (Limits.MAX_KEY_BYTES + 1)).acquire()
    assert not called
    # The client is still fine after the refusals.
    async with run.claim("k") as lease:
        assert lease.generation == 1
