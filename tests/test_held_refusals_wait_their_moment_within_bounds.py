"""A wrong token's refusal past its allowance waits its moment, in bounded room: at most
MAX_HELD_PER_NETWORK of one network and MAX_HELD in all are held for their delay, all
under one timer, their answers leaving within MAX_ANSWER_WAIT; over that, the answer is
UNAVAILABLE with retry_after_ms at once. Failures are logged as one line at once and one
summary per interval. Rules on a fake clock, no server."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import rsproto as wire
from rsd.security.auth import Refusal
from rsd.security.ratelimit import peer_keys
from rsd.wire.refusals import (
    MAX_ANSWER_WAIT,
    MAX_HELD,
    MAX_HELD_PER_NETWORK,
    MAX_SUMMED,
    SUMMARY_SECONDS,
    Refusals,
)
from rsproto import ErrorCode
from tests.support.fakeloop import FakeLoop


class FakeConn:
    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.failed: tuple[str, str] | None = None
        self.held = False

    def put(self, frame: bytes) -> None:
        self.frames.extend(wire.Decoder(wire.MAX_FRAME_BYTES).feed(frame))

    def fail(self, code: str, message: str, quiet: bool = False) -> None:
        assert quiet  # each refusal is not a log line: the summary is
        self.failed = (code, message)

    def hold(self) -> None:
        self.held = True

    def release_refusal(self, frame: bytes, code: str, message: str) -> None:
        self.held = False
        self.put(frame)
        self.fail(code, message, quiet=True)


def refusal(host: str, delay: float) -> Refusal:
    return Refusal("the token is not valid", delay, f"{host}:5000", peer_keys(host))


def refuse(refusals: Refusals, host: str, delay: float) -> FakeConn:
    conn = FakeConn()
    refusals.refuse(conn, 1, refusal(host, delay))  # type: ignore[arg-type]
    return conn


def test_a_refusal_within_allowance_is_answered_at_once() -> None:
    refusals = Refusals(FakeLoop())  # type: ignore[arg-type]
    conn = refuse(refusals, "10.0.0.1", 0.0)
    assert conn.frames == [[wire.Kind.ERROR, 1, ErrorCode.UNAUTHENTICATED,
                            "the token is not valid", None]]
    assert conn.failed == (ErrorCode.UNAUTHENTICATED, "handshake failed") and not conn.held


def test_a_held_refusal_leaves_at_its_moment_under_one_timer() -> None:
    loop = FakeLoop()
    refusals = Refusals(loop)  # type: ignore[arg-type]
    late, soon = refuse(refusals, "10.0.0.1", 0.4), refuse(refusals, "10.0.0.2", 0.2)
    assert late.held and soon.held and not late.frames and not soon.frames
    assert len([t for t in loop.live() if t.callback == refusals._due]) == 1
    loop.advance(0.25)
    assert soon.failed == (ErrorCode.UNAUTHENTICATED, "handshake failed") and not late.frames
    assert soon.frames[0][2] == ErrorCode.UNAUTHENTICATED
    loop.advance(0.2)
    assert late.frames[0][2] == ErrorCode.UNAUTHENTICATED and not late.held
    assert refusals.stats() == {"delayed": 2, "throttled": 0, "held": 0}


def test_a_long_delay_is_answered_within_max_answer_wait_and_keeps_its_place() -> None:
    """A wrong token slowed down by 5 s is told UNAUTHENTICATED within MAX_ANSWER_WAIT
    (an SDK waits about 1 s for a HELLO's answer; a longer wait looked like an unreachable
    server), yet its place stays taken for the whole 5 s: a network gets no more verdicts
    than when the answer itself waited."""
    assert MAX_ANSWER_WAIT <= 0.5
    loop = FakeLoop()
    refusals = Refusals(loop)  # type: ignore[arg-type]
    held = [refuse(refusals, f"10.5.5.{n}", 5.0) for n in range(MAX_HELD_PER_NETWORK)]
    loop.advance(MAX_ANSWER_WAIT)
    assert all(conn.frames[0][2] == ErrorCode.UNAUTHENTICATED and not conn.held
               for conn in held)
    assert refusals.stats()["held"] == 0
    over = refuse(refusals, "10.5.5.200", 5.0)  # the network's places are still taken
    assert over.frames[0][2] == ErrorCode.UNAVAILABLE and over.frames[0][4] == {
        "retry_after_ms": 5000}
    loop.advance(5.0 - MAX_ANSWER_WAIT)
    assert refuse(refusals, "10.5.5.201", 5.0).held  # given back after the full delay


def test_over_the_bounds_the_answer_is_slowed_down_with_retry_after_ms() -> None:
    loop = FakeLoop()
    refusals = Refusals(loop)  # type: ignore[arg-type]
    held = [refuse(refusals, f"10.1.1.{n}", 3.0) for n in range(MAX_HELD_PER_NETWORK)]
    assert all(conn.held for conn in held)
    over = refuse(refusals, "10.1.1.200", 1.25)  # the same /24, whose room is full
    assert not over.held and over.failed == (ErrorCode.UNAVAILABLE, "slowed down")
    [(kind, rid, code, message, details)] = over.frames
    assert (kind, rid, code) == (wire.Kind.ERROR, 1, ErrorCode.UNAVAILABLE)
    assert details == {"retry_after_ms": 1250} and "slowed down" in message
    assert refuse(refusals, "10.1.2.1", 3.0).held  # another network still has room
    # server-wide: at most MAX_HELD, whatever the networks
    for n in range(MAX_HELD):
        refuse(refusals, f"10.{2 + n // 200}.{n % 200}.1", 3.0)
    assert refusals.stats()["held"] == MAX_HELD
    assert refuse(refusals, "10.250.0.1", 0.0001).frames[0][4] == {"retry_after_ms": 1}
    loop.advance(3.0)
    assert refusals.stats()["held"] == 0 and all(not conn.held for conn in held)
    assert refuse(refusals, "10.1.1.201", 3.0).held  # room again once they have left


def test_failures_make_one_line_at_once_and_one_summary_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = FakeLoop()
    refusals = Refusals(loop)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="rsd"):
        for n in range(50):
            refuse(refusals, "10.3.3.3" if n < 30 else f"10.4.4.{n}", 0.0)
        assert [r.getMessage() for r in caplog.records] == [
            "authentication failed from 10.3.3.3:5000: the token is not valid (more "
            "failures in the next 60 s are summed up in one line)"
        ]
        loop.advance(SUMMARY_SECONDS)
        assert len(caplog.records) == 2
        assert caplog.records[1].getMessage().startswith(
            "50 failed HELLOs from 21 addresses in the last 60 s; worst: 10.3.3.3 (30), "
        )
        loop.advance(SUMMARY_SECONDS * 5)
        assert len(caplog.records) == 2  # a quiet interval says nothing
        for n in range(MAX_SUMMED + 500):  # a flood from many addresses: bounded memory
            refuse(refusals, f"10.{n // 250}.{n % 250}.9", 0.0)
        assert len(refusals.failures.open.by_key) == MAX_SUMMED
        loop.advance(SUMMARY_SECONDS)
        assert caplog.records[-1].getMessage().startswith(
            f"{MAX_SUMMED + 500} failed HELLOs from at least {MAX_SUMMED} addresses"
        )
