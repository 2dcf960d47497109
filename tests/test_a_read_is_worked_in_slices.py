"""One connection's pipelined requests cannot hold the loop: a read is worked in slices.

Between loop turns a connection's input does at most its share of the turn budget
(``Policy.TURN_BUDGET_SECONDS``, turns.py) of work (on the loop's clock); the rest waits,
its socket unread, for the next turn, and other connections are read and answered in
between. Order per connection is kept, and each connection still gets one write per
loop turn. The clock is made to say "share over" at every look, so the slices are
deterministic: a look after every chunk, and after every heavy reply.
"""

from __future__ import annotations

import pytest
from support.shell import Shell, transport, turn

import rsproto as wire
from rsd.policy import Policy
from rsd.wire.connection import Connection
from rsproto import Kind, Op

CANCELS = 1024  # eight chunks of 128


@pytest.fixture
async def shell() -> Shell:
    server = Shell()
    server.batches.clock = lambda: float("inf")  # every chunk ends its slice
    return server


def cancels(first_rid: int, count: int) -> bytes:
    return b"".join(
        wire.request_frame(rid, Op.CANCEL, {"request": 999_999})
        for rid in range(first_rid, first_rid + count)
    )


async def test_a_bystander_is_answered_between_slices_of_a_long_read(shell: Shell) -> None:
    attacker, bystander = shell.connect("attacker"), shell.connect("bystander")
    await turn()
    sent = len(transport(attacker).writes)
    attacker.data_received(cancels(2, CANCELS))
    assert attacker.yielded and not transport(attacker).reading, "the read was not cut"
    assert len(attacker.out) == 2 * 128, "more than one chunk ran in the first slice"
    bystander.data_received(wire.request_frame(2, Op.PING, {}))
    await turn()
    ping = transport(bystander).messages()[-1]
    assert ping[:2] == [int(Kind.REPLY), 2]
    answered = sum(1 for m in transport(attacker).messages() if m[0] == int(Kind.REPLY)) - 1
    assert answered < CANCELS, "the bystander waited for the whole read"
    await turn(2 * CANCELS // 128 + 2)
    replies = [m for m in transport(attacker).messages()[1:]]
    assert [m[1] for m in replies] == list(range(2, 2 + CANCELS)), "order was not kept"
    assert all(m[2] == {"cancelled": False} for m in replies)
    writes = len(transport(attacker).writes) - sent
    assert writes == CANCELS // 128, "not one write per slice (one per loop turn)"
    assert transport(attacker).reading and not attacker.yielded, "reading did not resume"


async def test_a_framing_error_after_sliced_work_still_comes_after_every_answer(
    shell: Shell,
) -> None:
    conn = shell.connect("client")
    await turn()
    conn.data_received(cancels(2, 300) + b"\xff\xff\xff\xff")  # a length over the limit
    await turn(10)
    messages = transport(conn).messages()[1:]
    assert [m[1] for m in messages[:300]] == list(range(2, 302))
    assert messages[300][:2] == [int(Kind.ERROR), 0]
    assert messages[300][2] == "FRAME_TOO_LARGE"
    assert transport(conn).eof


def submits(first_rid: int, count: int, items: int = 64) -> bytes:
    return b"".join(
        wire.request_frame(rid, Op.TASK_SUBMIT_MANY, {
            "scope": "r", "mailbox": "jobs", "slim": True,
            "items": [{"key": f"{rid}-{i}", "data": None} for i in range(items)],
        })
        for rid in range(first_rid, first_rid + count)
    )


def setup_run(conn: Connection) -> None:
    conn.data_received(
        wire.request_frame(2, Op.MAILBOX_ENSURE, {"name": "jobs"})
        + wire.request_frame(3, Op.SCOPE_CREATE, {"scope": "r"})
    )


async def test_a_heavy_request_ends_a_share_within_a_chunk(shell: Shell) -> None:
    """A few frames that each do much work (far fewer than a chunk) are cut after the
    request that used up the share, not after the whole read."""
    attacker, bystander = shell.connect("attacker"), shell.connect("bystander")
    setup_run(attacker)
    await turn(3)
    attacker.data_received(submits(10, 6))
    assert attacker.yielded and not transport(attacker).reading
    assert attacker.backlog is not None and len(attacker.backlog) == 5, "more than one ran"
    bystander.data_received(wire.request_frame(2, Op.PING, {}))
    await turn()
    assert transport(bystander).messages()[-1][:2] == [int(Kind.REPLY), 2]
    done = [m for m in transport(attacker).messages() if m[0] == int(Kind.REPLY) and m[1] >= 10]
    assert len(done) < 6, "the bystander waited for every heavy request"
    await turn(8)
    done = [m for m in transport(attacker).messages() if m[0] == int(Kind.REPLY) and m[1] >= 10]
    assert [m[1] for m in done] == list(range(10, 16)), "order was not kept"
    assert all(len(m[2]["results"]) == 64 and m[2]["results"][0]["created"] for m in done)
    assert transport(attacker).reading and not attacker.yielded, "reading did not resume"


async def test_connections_cut_share_the_turns_that_follow(shell: Shell) -> None:
    """Three connections each cut after one heavy request: the clock says the budget is
    spent at every look, so each turn resumes one of them (not all three: a turn lasts
    about the budget however many flood), round robin, and none starves."""
    attackers = [shell.connect(f"attacker{n}") for n in range(3)]
    for conn in attackers:
        setup_run(conn)
    await turn(3)
    for n, conn in enumerate(attackers):
        conn.data_received(submits(10 + 100 * n, 4))
    assert all(conn.yielded for conn in attackers)

    def done() -> list[int]:
        """Replies each has produced, sent or still in this turn's output."""
        return [
            len([
                m for m in wire.Decoder().feed(b"".join(transport(conn).writes + conn.out))
                if m[0] == int(Kind.REPLY)
            ])
            for conn in attackers
        ]

    before = sum(done())  # HELLO, MAILBOX_ENSURE, SCOPE_CREATE, the first submit: 4 each
    await turn()  # the first resumption: the budget is now theirs to share
    assert shell.turns.share == pytest.approx(Policy.TURN_BUDGET_SECONDS / 3)
    assert sum(done()) - before == 1, "a turn resumed more than its budget allows"
    for resumed in range(2, 6):
        await turn()
        assert sum(done()) - before == resumed, "a turn resumed more than one"
    await turn(4 * 3 * 2)
    for n, conn in enumerate(attackers):
        rids = [m[1] for m in transport(conn).messages() if m[0] == int(Kind.REPLY)]
        assert rids[-4:] == [10 + 100 * n + k for k in range(4)], "a connection starved"


async def test_a_read_of_large_frames_is_decoded_about_64_kib_at_a_time(shell: Shell) -> None:
    """Decoding is work a share starts too: once a connection's frames are known to be
    large, a chunk holds about ``_CHUNK_BYTES`` of them, not 128 whatever their size, and
    the rest of the read waits undecoded (128 submits of 256 items took 50 ms to decode)."""
    conn = shell.connect("attacker")
    setup_run(conn)
    await turn(3)
    frames = submits(10, 40, items=256)
    per_frame = len(frames) // 40
    conn.data_received(frames[:per_frame])  # one: its size sets the chunk
    await turn(3)
    conn.data_received(frames[per_frame:])
    assert conn.backlog is not None, "the read was not cut"
    ran = 1 + len(conn.backlog)
    assert ran <= (64 << 10) // per_frame + 1, f"{ran} frames of {per_frame} bytes decoded"
    assert conn.decoder.buffered, "the whole read was decoded at once"
    await turn(3 * 40)
    rids = [m[1] for m in transport(conn).messages() if m[0] == int(Kind.REPLY) and m[1] >= 10]
    assert rids == list(range(10, 50)), "order was not kept"
